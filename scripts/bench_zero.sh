#!/usr/bin/env bash
# ZeRO-1 (units.zero, include/ddiloco/zero.hpp) measured: one unit of R ranks in mode single,
# units.zero 0 and 1 side by side in one run of this script, on the same data and model. For
# each: AdamW's state per rank (the start event's optimizer_bytes_per_rank: what the rank
# allocated), each rank's peak resident memory (VmHWM via /usr/bin/time), and the steady step
# time (the median interval of the train events after the first). Prints a Markdown table.
#   scripts/bench_zero.sh [BUILD_DIR] [RANKS ...]     (default: build, ranks 1 2 4)
# Model: 6 layers × 384 channels (11.0 M parameters), batch 4 × 128 tokens per rank, 30 steps,
# one thread per rank. More ranks than cores oversubscribe them: their step times say nothing
# then, their bytes do.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
ranks=("$@")
((${#ranks[@]})) || ranks=(1 2 4)
source scripts/mpi_env.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/ddiloco-bench-zero.XXXXXX")
trap 'rm -rf "$work"' EXIT
data=data/kjv
[[ -f $data/train_000.bin ]] || "$build/ddiloco" prepare-data --source kjv --out "$data" >/dev/null
cat > "$work/z.yaml" <<YAML
mode: single
run: {log_every: 1, progress: false, threads: 1}
model: {n_layer: 6, n_head: 6, n_embd: 384, seq_len: 128}
data: {train: $data/train_*.bin, val: $data/val_*.bin}
train: {batch_size: 4, steps: 30, warmup_steps: 5}
eval: {val_tokens: 4096, sample_tokens: 0}
checkpoint: {every_s: 0, at_stop: false}
YAML
echo "| ranks R | units.zero | AdamW state per rank (MB) | peak RSS per rank (MB, max over ranks) | step time (s, median) |"
echo "| --- | --- | --- | --- | --- |"
for r in "${ranks[@]}"; do
  for z in 0 1; do
    dir=$work/r${r}z$z
    # Each rank under /usr/bin/time, writing its peak RSS to <dir>.rss.<rank>.
    mpirun --oversubscribe -np "$r" bash -c '/usr/bin/time -f "rss_kb %M" -o "$0.rss.$OMPI_COMM_WORLD_RANK" "$@"' "$dir" \
      "$build/ddiloco" train --config "$work/z.yaml" --set run.dir="$dir" --set units.zero=$z \
      > "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
    /usr/bin/python3 - "$dir" "$r" "$z" <<'PY'
import glob, json, statistics, sys
d, r, z = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ev = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
start = [e for e in ev if e["event"] == "start"][0]
t = [e["elapsed_s"] for e in ev if e["event"] == "train"]
step = statistics.median(b - a for a, b in zip(t[1:], t[2:]))
rss = max(int(open(f).read().split()[-1]) for f in glob.glob(f"{d}.rss.*")) / 1024
print(f"| {r} | {z} | {start['optimizer_bytes_per_rank'] / 1e6:.1f} | {rss:.0f} | {step:.3f} |")
PY
  done
done

#!/usr/bin/env bash
# Throughput of ddiloco against PyTorch (CPU) on the same model, batch and thread count.
#
#   scripts/bench_vs_torch.sh CONFIG [--set key=value ...] [--steps N] [--warmup N]
#
# Reads the effective configuration (`ddiloco config`), then runs `ddiloco bench model` and
# scripts/bench_torch.py one after the other with that shape (model.*), train.batch_size,
# the optimizer settings and threads = run.threads (the number of cores, nproc, when 0), and
# prints both tokens/s figures and their ratio. Each side times forward + backward + gradient
# clipping + AdamW on random tokens after N warm-up steps; defaults --steps 3 --warmup 1 keep
# a kjv-demo-sized model (4 layers, n_embd ≤ 256, seq_len ≤ 256, batch 16) under ~2 minutes
# on 2 cores. Other processes on the machine skew both numbers: the load average is printed.
#
# Needs build/ddiloco (cmake --preset release && cmake --build build) and Debian's
# /usr/bin/python3 with torch and yaml; installs python3-torch through
# scripts/install_deps.sh --with-torch when torch is missing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ddiloco=$root/build/ddiloco
py=/usr/bin/python3

usage() { sed -n '4p' "$0" | sed 's/^# *//' >&2; exit 2; }
[[ $# -ge 1 ]] || usage
case "$1" in -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
config=$1
shift
sets=()
steps=3
warmup=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --set|-s) [[ $# -ge 2 ]] || usage; sets+=(--set "$2"); shift 2 ;;
    --set=*) sets+=(--set "${1#--set=}"); shift ;;
    --steps) [[ $# -ge 2 ]] || usage; steps=$2; shift 2 ;;
    --warmup) [[ $# -ge 2 ]] || usage; warmup=$2; shift 2 ;;
    *) echo "bench_vs_torch: unknown argument '$1'" >&2; usage ;;
  esac
done
die() { echo "bench_vs_torch: $1" >&2; exit "${2:-2}"; }
[[ $steps =~ ^[1-9][0-9]*$ ]] || die "--steps must be a positive integer"
[[ $warmup =~ ^[0-9]+$ ]] || die "--warmup must be an integer ≥ 0"
[[ -f $config ]] || die "config file '$config' not found"

if [[ ! -x $ddiloco ]]; then
  echo "bench_vs_torch: $ddiloco not found; build it first:" >&2
  echo "  cd $root && cmake --preset release && cmake --build build -j" >&2
  exit 1
fi
if ! $py -c 'import torch, yaml' 2>/dev/null; then
  echo "bench_vs_torch: torch (or yaml) missing for $py; installing python3-torch"
  "$root/scripts/install_deps.sh" --with-torch
  $py -c 'import torch, yaml' || die "$py still cannot import torch" 1
fi

# The effective configuration, as shell assignments.
yaml=$("$ddiloco" config --config "$config" "${sets[@]}")
assignments=$($py - "$yaml" <<'EOF'
import sys, yaml
c = yaml.safe_load(sys.argv[1])
m, t, r = c["model"], c["train"], c["run"]
for k in ("n_layer", "n_head", "n_embd", "seq_len", "vocab_size"):
    print(f"{k}={int(m[k])}")
print(f"batch_size={int(t['batch_size'])}")
for k in ("lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip"):
    print(f"{k}={float(t[k])!r}")
print(f"threads={int(r['threads'])}")
print(f"seed={int(r['seed'])}")
EOF
)
eval "$assignments"
if [[ $threads -le 0 ]]; then threads=$(nproc); fi

echo "bench_vs_torch: $config ${sets[*]}"
echo "  model n_layer=$n_layer n_head=$n_head n_embd=$n_embd seq_len=$seq_len vocab=$vocab_size," \
     "batch $batch_size, $threads threads, $steps timed steps (+$warmup warm-up)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"

out_dd=$(mktemp)
out_pt=$(mktemp)
trap 'rm -f "$out_dd" "$out_pt"' EXIT

echo "--- ddiloco bench model"
# run.threads is passed explicitly so that both sides use the same count.
"$ddiloco" bench model --config "$config" "${sets[@]}" --set "run.threads=$threads" \
  --steps "$steps" --warmup "$warmup" | tee "$out_dd"
echo "--- scripts/bench_torch.py"
$py "$root/scripts/bench_torch.py" --n-layer "$n_layer" --n-head "$n_head" --n-embd "$n_embd" \
  --seq-len "$seq_len" --vocab-size "$vocab_size" --batch-size "$batch_size" \
  --threads "$threads" --steps "$steps" --warmup "$warmup" --lr "$lr" \
  --weight-decay "$weight_decay" --beta1 "$beta1" --beta2 "$beta2" --eps "$eps" \
  --grad-clip "$grad_clip" --seed "$seed" | tee "$out_pt"

tps() { sed -n 's/^tokens_per_s=\([0-9.eE+-]*\)$/\1/p' "$1" | tail -n 1; }
dd_tps=$(tps "$out_dd")
pt_tps=$(tps "$out_pt")
[[ -n $dd_tps && -n $pt_tps ]] || die "a benchmark printed no tokens_per_s line" 1
echo
$py - "$dd_tps" "$pt_tps" <<'EOF'
import sys
dd, pt = float(sys.argv[1]), float(sys.argv[2])
print(f"{'':16s}{'tokens/s':>12s}")
print(f"{'ddiloco':16s}{dd:12.1f}")
print(f"{'torch (CPU)':16s}{pt:12.1f}")
print(f"{'ddiloco/torch':16s}{dd / pt:12.2f}")
EOF

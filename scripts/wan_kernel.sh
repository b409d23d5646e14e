#!/bin/bash
# Kernel-shaped WAN links beside the in-program emulator (docs/deployments.md "Several hosts"), on one
# machine: the syncer and each unit in their own network namespace (tests/e2e/lib/hosts.sh),
# the isolated deployment (`ddiloco syncer`, `ddiloco unit`) over UCX/TCP on veth links.
# Each run spec runs twice:
#   kernel    each unit's link limited by the kernel (tc tbf, both directions) to --mbit,
#             the emulator off (wan.bandwidth_mbit_s = 0);
#   emulator  unlimited veths, the emulator at the same rate and burst, its latency that of
#             the veth (0: the kernel here has no netem to add any).
# Both runs set syncer.link_min_mbit_s to half of --mbit: the same syncer (its waits, and its
# polls at most 5 % of that rate) over either kind of link.
# Every rank runs one thread (run.threads=1 unless --set says otherwise): with two per rank,
# 4 units and the syncer on 2 cores, the same 1000 steps took a unit 40 to 105 s of compute
# from run to run, and that noise, not the link, decided time to target.
# --repeat N runs each spec N times, kernel and emulator alternating.
# Prints and writes (OUT/summary.md, OUT/summary.json) per spec and link (mean and spread over
# the repeats): wall time to the target validation loss (the worst final loss of all runs, so
# every run reaches it; interpolated between evaluations), train time, the units' mean compute
# and wait (time.compute_s, time.wait_s: the wait is what a synchronous mode spends on the
# link), final loss, merges, bytes per token as the syncer counts them, and the bytes the veths
# carried per token (TCP and UCX headers included); then kernel ÷ emulator per spec.
#
#   scripts/wan_kernel.sh [--config configs/wan_experiment.yaml] [--mbit 0.7] [--repeat 1]
#       [--runs decoupled,decoupled:wan.format=int4,diloco:outer.momentum=0] [--set key=value ...]
#       [--out runs/wan_kernel]
#
# Needs root (network namespaces, tc), build/ddiloco and the config's data. ddp cannot run in
# the isolated deployment (it has no syncer to connect to): its row stays scripts/
# wan_experiment.py's, in one job with the emulator. Units run one rank each
# (units.ranks_per_unit is honoured, per-unit units.ranks are not).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DDILOCO=${DDILOCO_BIN:-$ROOT/build/ddiloco}
CONFIG=$ROOT/configs/wan_experiment.yaml
MBIT=0.7
RUNS="decoupled,decoupled:wan.format=int4,diloco:outer.momentum=0"
OUT=$ROOT/runs/wan_kernel
REPEAT=1
RUN_LIMIT_S=${WAN_KERNEL_RUN_LIMIT_S:-3600}  # a run still going then is killed (and reported)
SETS=(--set run.threads=1)
while (($#)); do
  case $1 in
    --config) CONFIG=$(realpath "$2"); shift 2 ;;
    --mbit) MBIT=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    -h|--help) sed -n 2,31p "$0"; exit 0 ;;
    *) echo "wan_kernel.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || { echo "wan_kernel.sh: --repeat must be a positive integer, got '$REPEAT'" >&2; exit 2; }
[[ -x $DDILOCO ]] || { echo "wan_kernel.sh: $DDILOCO missing: run scripts/build.sh" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "wan_kernel.sh: needs root (network namespaces and tc)" >&2; exit 2; }
source "$ROOT/scripts/mpi_env.sh"
get() { "$DDILOCO" config --config "$CONFIG" "${SETS[@]}" --get "$1"; }
units=$(get units.count)
ranks=$(get units.ranks_per_unit)
burst_kb=$(get wan.burst_kb)
mkdir -p "$OUT"

pids=()
trap 'for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done' EXIT
source "$ROOT/tests/e2e/lib/hosts.sh"   # (its cleanup runs before the trap above)
hosts_add syncer 1
for ((u = 0; u < units; u++)); do hosts_add "unit$u" $((10 + u)); done
hosts_env

run_one() {  # run_one NAME KIND SPEC_SETS...
  local name=$1 kind=$2; shift 2
  local dir=$OUT/$name/$kind link=() before=0 after=0 u
  rm -rf "$dir"; mkdir -p "$dir"
  # The same syncer both ways: its waits and its polls sized for links of half the rate.
  link=(--set "syncer.link_min_mbit_s=$(/usr/bin/python3 -c "print($MBIT / 2)")")
  if [[ $kind == kernel ]]; then
    for ((u = 0; u < units; u++)); do link_shape "unit$u" "${MBIT}mbit" "${burst_kb}kb"; done
    link+=(--set wan.bandwidth_mbit_s=0)
  else
    for ((u = 0; u < units; u++)); do link_unshape "unit$u"; done
    link+=(--set "wan.bandwidth_mbit_s=$MBIT" --set wan.latency_ms=0 --set wan.jitter_ms=0)
  fi
  for ((u = 0; u < units; u++)); do before=$((before + $(link_bytes "unit$u"))); done
  local sets=("${SETS[@]}" "$@" "${link[@]}" --set "run.dir=$dir" --set run.progress=false
              --set "syncer.listen=$(host_ip syncer):0" --set checkpoint.at_stop=false)
  echo "== $name over the $kind link ($MBIT Mbit/s) -> $dir"
  start_on syncer "$DDILOCO" syncer --config "$CONFIG" "${sets[@]}" > "$dir/syncer.log" 2>&1
  local syncer=$!; pids+=($syncer)
  local jobs=()
  for ((u = 0; u < units; u++)); do
    start_on "unit$u" "${DDILOCO_MPIRUN[@]}" -np "$ranks" "$DDILOCO" unit --config "$CONFIG" "${sets[@]}" \
      --unit "$u" > "$dir/unit$u.log" 2>&1
    jobs+=($!); pids+=($!)
  done
  local rc=0 p
  for p in $syncer "${jobs[@]}"; do wait_within "$RUN_LIMIT_S" "$p" || rc=$?; done
  ((rc == 0)) || { tail -5 "$dir"/*.log >&2; echo "wan_kernel.sh: $name/$kind failed (exit $rc)" >&2; exit 1; }
  for ((u = 0; u < units; u++)); do after=$((after + $(link_bytes "unit$u"))); done
  echo "{\"veth_bytes\": $((after - before))}" > "$dir/veth.json"
}

IFS=, read -ra specs <<< "$RUNS"
names=()
for spec in "${specs[@]}"; do
  mode=${spec%%:*}
  extra=()
  if [[ $spec == *:* ]]; then
    IFS=';' read -ra kv <<< "${spec#*:}"
    for s in "${kv[@]}"; do extra+=(--set "$s"); done
  fi
  name=$(echo "$spec" | tr ':;=' '_,-')
  names+=("$name")
  for ((i = 1; i <= REPEAT; i++)); do
    for kind in kernel emulator; do
      run_one "$name" "$kind" --set "mode=$mode" "${extra[@]}"
      if ((REPEAT > 1)); then rm -rf "$OUT/$name/$kind.$i"; mv "$OUT/$name/$kind" "$OUT/$name/$kind.$i"; fi
    done
  done
done

/usr/bin/python3 - "$OUT" "$MBIT" "$REPEAT" "${names[@]}" <<'PY'
import glob, json, os, statistics, sys
out, mbit, repeat, names = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
KINDS = ("kernel", "emulator")
def load(d):
    ev = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
    done = next(e for e in ev if e["event"] == "done")
    curve = [(e["elapsed_s"], e["val_loss"]) for e in ev if e["event"] == "global_eval"]
    veth = json.load(open(os.path.join(d, "veth.json")))["veth_bytes"]
    books = [json.loads(l)["time"] for f in glob.glob(os.path.join(d, "unit_*.jsonl")) for l in open(f)
             if '"event":"done"' in l.replace(" ", "") and '"time"' in l]
    merges = sum(1 for e in ev if e["event"] == "merge")
    return {"curve": curve, "final": done["val_loss"], "train_s": done["train_s"], "tokens": done["tokens"],
            "compute_s": statistics.mean(b["compute_s"] for b in books) if books else None,
            "wait_s": statistics.mean(b["wait_s"] for b in books) if books else None,
            "bytes_per_token": done["bytes_per_token"], "veth_bytes_per_token": veth / done["tokens"],
            "merges": merges, "merges_per_s": merges / done["train_s"]}
def dirs(n, k):
    return [os.path.join(out, n, k)] if repeat == 1 else [os.path.join(out, n, f"{k}.{i}") for i in range(1, repeat + 1)]
runs = {(n, k): [load(d) for d in dirs(n, k)] for n in names for k in KINDS}
target = max(r["final"] for rs in runs.values() for r in rs)
def time_to(curve, loss):  # linear between the evaluations around the crossing
    for (t0, v0), (t1, v1) in zip([(0.0, float("inf"))] + curve, curve):
        if v1 <= loss:
            return t1 if v0 == float("inf") or v0 == v1 else t0 + (t1 - t0) * (v0 - loss) / (v0 - v1)
    return None
for rs in runs.values():
    for r in rs:
        r["time_to_target_s"] = time_to(r["curve"], target)
KEYS = ("time_to_target_s", "train_s", "compute_s", "wait_s", "final", "merges", "bytes_per_token", "veth_bytes_per_token")
def stat(rs, key):
    xs = [r[key] for r in rs if r[key] is not None]
    return (statistics.mean(xs), max(xs) - min(xs)) if xs else (None, None)
def cell(rs, key, fmt):
    m, spread = stat(rs, key)
    if m is None:
        return "—"
    return format(m, fmt) + (f" ± {spread / 2:{fmt}}" if len(rs) > 1 else "")
lines = [f"Links of {mbit:g} Mbit/s per unit, each direction; target validation loss {target:.4f} "
         f"(the worst final loss of these runs); {repeat} run(s) each"
         + (", mean ± half the range" if repeat > 1 else "") + ".", "",
         "| run | link | time to target (s) | train time (s) | unit compute (s) | unit wait (s) | final val loss | merges | bytes/token (syncer) | bytes/token (veth) |",
         "|---|---|---|---|---|---|---|---|---|---|"]
for n in names:
    for k in KINDS:
        rs = runs[(n, k)]
        lines.append(f"| {n} | {k} | {cell(rs, 'time_to_target_s', '.1f')} | {cell(rs, 'train_s', '.1f')} | "
                     f"{cell(rs, 'compute_s', '.1f')} | {cell(rs, 'wait_s', '.1f')} | {cell(rs, 'final', '.4f')} | "
                     f"{cell(rs, 'merges', '.0f')} | {cell(rs, 'bytes_per_token', '.2f')} | {cell(rs, 'veth_bytes_per_token', '.2f')} |")
lines += ["", "| run (kernel ÷ emulator, of the means) | time to target | unit wait | bytes/token (syncer) | merges per second |",
          "|---|---|---|---|---|"]
ratios = {}
def ratio(n, key):
    k, e = stat(runs[(n, "kernel")], key)[0], stat(runs[(n, "emulator")], key)[0]
    if key == "wait_s" and (e or 0) < 1 and (k or 0) < 1:
        return None  # no mode that waits for the link: nothing to compare
    return k / e if k is not None and e else None
for n in names:
    ratios[n] = {key: ratio(n, key) for key in ("time_to_target_s", "wait_s", "bytes_per_token", "merges_per_s")}
    f = lambda x: "—" if x is None else f"{x:.2f}"
    lines.append(f"| {n} | {f(ratios[n]['time_to_target_s'])} | {f(ratios[n]['wait_s'])} | "
                 f"{f(ratios[n]['bytes_per_token'])} | {f(ratios[n]['merges_per_s'])} |")
text = "\n".join(lines)
print(text)
open(os.path.join(out, "summary.md"), "w").write(text + "\n")
json.dump({"mbit_s": mbit, "target": target, "repeat": repeat, "ratios": ratios,
           "runs": [{"run": n, "link": k, **{x: y for x, y in r.items() if x != "curve"}}
                    for (n, k), rs in runs.items() for r in rs]},
          open(os.path.join(out, "summary.json"), "w"), indent=1)
PY

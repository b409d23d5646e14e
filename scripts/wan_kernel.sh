#!/bin/bash
# Kernel-shaped WAN links beside the in-program emulator (README "Several hosts"), on one
# machine: the syncer and each unit in their own network namespace (tests/e2e/lib/hosts.sh),
# the isolated deployment (`ddiloco syncer`, `ddiloco unit`) over UCX/TCP on veth links.
# Each run spec runs twice:
#   kernel    each unit's link limited by the kernel (tc tbf, both directions) to --mbit,
#             the emulator off (wan.bandwidth_mbit_s = 0);
#   emulator  unlimited veths, the emulator at the same rate and burst, its latency that of
#             the veth (0: the kernel here has no netem to add any).
# Both runs set syncer.link_min_mbit_s to half of --mbit: the same syncer (its waits, and its
# polls at most 5 % of that rate) over either kind of link.
# Prints and writes (OUT/summary.md, OUT/summary.json) per run: wall time to the target
# validation loss (the worst final loss of all runs, so every run reaches it), train time,
# final loss, bytes per token as the syncer counts them, and for kernel runs the bytes the
# veths carried per token (TCP and UCX headers included); then kernel ÷ emulator per spec.
#
#   scripts/wan_kernel.sh [--config configs/wan_experiment.yaml] [--mbit 0.7]
#       [--runs decoupled,decoupled:wan.format=int4,diloco] [--set key=value ...]
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
RUNS="decoupled,decoupled:wan.format=int4,diloco"
OUT=$ROOT/runs/wan_kernel
SETS=()
while (($#)); do
  case $1 in
    --config) CONFIG=$(realpath "$2"); shift 2 ;;
    --mbit) MBIT=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    -h|--help) sed -n 2,24p "$0"; exit 0 ;;
    *) echo "wan_kernel.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
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
  echo "== $name over the $kind link ($MBIT Mbit/s)"
  start_on syncer "$DDILOCO" syncer --config "$CONFIG" "${sets[@]}" > "$dir/syncer.log" 2>&1
  local syncer=$!; pids+=($syncer)
  local jobs=()
  for ((u = 0; u < units; u++)); do
    start_on "unit$u" "${DDILOCO_MPIRUN[@]}" -np "$ranks" "$DDILOCO" unit --config "$CONFIG" "${sets[@]}" \
      --unit "$u" > "$dir/unit$u.log" 2>&1
    jobs+=($!); pids+=($!)
  done
  local rc=0 p
  for p in $syncer "${jobs[@]}"; do wait "$p" || rc=$?; done
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
  for kind in kernel emulator; do run_one "$name" "$kind" --set "mode=$mode" "${extra[@]}"; done
done

/usr/bin/python3 - "$OUT" "$MBIT" "${names[@]}" <<'PY'
import json, os, sys
out, mbit, names = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
def load(d):
    ev = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
    done = next(e for e in ev if e["event"] == "done")
    curve = [(e["elapsed_s"], e["val_loss"]) for e in ev if e["event"] == "global_eval"]
    veth = json.load(open(os.path.join(d, "veth.json")))["veth_bytes"]
    return {"curve": curve, "final": done["val_loss"], "train_s": done["train_s"], "tokens": done["tokens"],
            "bytes_per_token": done["bytes_per_token"], "veth_bytes_per_token": veth / done["tokens"],
            "merges": sum(1 for e in ev if e["event"] == "merge"),
            "merges_per_s": sum(1 for e in ev if e["event"] == "merge") / done["train_s"]}
rows = {(n, k): load(os.path.join(out, n, k)) for n in names for k in ("kernel", "emulator")}
target = max(r["final"] for r in rows.values())
for r in rows.values():
    r["time_to_target_s"] = next((t for t, v in r["curve"] if v <= target), None)
lines = [f"Links of {mbit:g} Mbit/s per unit, each direction; target validation loss {target:.4f} "
         "(the worst final loss of these runs).", "",
         "| run | link | time to target (s) | train time (s) | final val loss | merges | bytes/token (syncer) | bytes/token (veth) |",
         "|---|---|---|---|---|---|---|---|"]
for n in names:
    for k in ("kernel", "emulator"):
        r = rows[(n, k)]
        t = "—" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        lines.append(f"| {n} | {k} | {t} | {r['train_s']:.1f} | {r['final']:.4f} | {r['merges']} | "
                     f"{r['bytes_per_token']:.1f} | {r['veth_bytes_per_token']:.1f} |")
lines += ["", "| run | time to target, kernel ÷ emulator | bytes/token (syncer), kernel ÷ emulator | merges per second, kernel ÷ emulator |", "|---|---|---|---|"]
ratios = {}
for n in names:
    k, e = rows[(n, "kernel")], rows[(n, "emulator")]
    tt = (k["time_to_target_s"] / e["time_to_target_s"]) if k["time_to_target_s"] and e["time_to_target_s"] else None
    bt = k["bytes_per_token"] / e["bytes_per_token"]
    ratios[n] = {"time_to_target": tt, "bytes_per_token": bt, "merges_per_s": k["merges_per_s"] / e["merges_per_s"]}
    lines.append(f"| {n} | {'—' if tt is None else f'{tt:.2f}'} | {bt:.2f} | {ratios[n]['merges_per_s']:.2f} |")
text = "\n".join(lines)
print(text)
open(os.path.join(out, "summary.md"), "w").write(text + "\n")
json.dump({"mbit_s": mbit, "target": target, "ratios": ratios,
           "rows": [{"run": n, "link": k, **{x: y for x, y in r.items() if x != "curve"}} for (n, k), r in rows.items()]},
          open(os.path.join(out, "summary.json"), "w"), indent=1)
PY

#!/usr/bin/env bash
# The main job from a fresh clone: installs what is missing, builds, prepares the King James
# Bible as byte-level shards, and trains Decoupled DiLoCo — 1 syncer + 4 learner units — then
# plots the global validation loss.
#   scripts/demo.sh [--config configs/<name>.yaml] [--one-job] [--set key=value ...]
# Modes with a syncer (decoupled, diloco, streaming) run in the isolated deployment by default:
# `ddiloco launch` starts the syncer and every unit as its own process and restarts what dies
# (docs/deployments.md "Fault isolation"). --one-job runs them as one MPI job instead (`mpirun ddiloco
# train`), as ddp and single always do; the number of MPI ranks then comes from the config
# (1 syncer + the units' ranks; 1 for mode single, or --ranks R to run a single unit on R ranks).
set -euo pipefail
cd "$(dirname "$0")/.."

config=configs/kjv_decoupled.yaml
ranks=
one_job=0
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config|--ranks)
      [[ $# -ge 2 ]] || { echo "demo.sh: $1 needs a value" >&2; exit 2; }
      if [[ $1 == --config ]]; then config=$2; else ranks=$2; fi
      shift 2 ;;
    --one-job) one_job=1; shift ;;
    *) args+=("$1"); shift ;;
  esac
done

scripts/install_deps.sh
scripts/build.sh release
if [[ ! -f data/kjv/train_000000.bin || ! -f data/kjv/val_000000.bin ]]; then
  build/ddiloco prepare-data --source kjv --out data/kjv
fi

source scripts/mpi_env.sh
# mpirun hands ranks a pseudo-terminal even when its own output goes to a file or pipe: draw
# the progress bar only when this script's output is a terminal.
[[ -t 1 ]] || args=(--set run.progress=false "${args[@]}")
mode=$(build/ddiloco config --config "$config" "${args[@]}" --get mode)
# The demo's run directory is the demo's own: a second demo replaces the first.
if [[ $one_job == 0 && -z $ranks && $mode =~ ^(decoupled|diloco|streaming)$ ]]; then
  build/ddiloco launch --config "$config" --overwrite "${args[@]}"
else
  [[ -n $ranks ]] || ranks=$(build/ddiloco config --config "$config" "${args[@]}" --ranks)
  ddiloco_mpirun -np "$ranks" build/ddiloco train --config "$config" --overwrite "${args[@]}"
fi

run_dir=$(build/ddiloco config --config "$config" "${args[@]}" --get run.dir)
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  /usr/bin/python3 scripts/plot_metrics.py "$run_dir/metrics.jsonl" --out "$run_dir/loss.png"
fi
echo "demo: metrics in $run_dir/metrics.jsonl, model in $run_dir/model.h5"
echo "      try: build/ddiloco sample --model $run_dir/model.h5 --prompt 'And God said'"

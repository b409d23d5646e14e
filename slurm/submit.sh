#!/usr/bin/env bash
# Submits the isolated deployment (README "Several hosts"): the syncer's job, then the units'
# job array, which starts once the syncer's job has started (--dependency=after). Prints both
# job ids. Extra sbatch options for the units go in UNITS_SBATCH_ARGS (e.g. "--nodes=1
# --gpus-per-node=8"), for the syncer in SYNCER_SBATCH_ARGS; arguments go to both programs.
#
#   CONFIG=configs/kjv_decoupled.yaml slurm/submit.sh [--set key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export CONFIG=${CONFIG:-configs/kjv_decoupled.yaml}
DDILOCO=${DDILOCO:-build/ddiloco}
units=$("$DDILOCO" config --config "$CONFIG" "$@" --get units.count)
ranks=$("$DDILOCO" config --config "$CONFIG" "$@" --get units.ranks_per_unit)
syncer=$(sbatch --parsable ${SYNCER_SBATCH_ARGS:-} slurm/syncer.sbatch "$@")
array=$(sbatch --parsable --dependency="after:$syncer" --array="0-$((units - 1))" --ntasks="$ranks" \
        ${UNITS_SBATCH_ARGS:-} slurm/units.sbatch "$@")
echo "syncer job $syncer, units job array $array (tasks 0-$((units - 1)), $ranks ranks each)"

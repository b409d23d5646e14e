#!/usr/bin/env bash
# Submits the isolated deployment (docs/deployments.md "Several hosts"): the syncer's job, then the units'
# job array, which starts once the syncer's job has started (--dependency=after). The syncer
# is submitted held and released only once the array was accepted, so that a rejected array
# leaves nothing queued. Prints both job ids. Extra sbatch options for the units go in
# UNITS_SBATCH_ARGS (e.g. "--nodes=1 --gpus-per-node=8"), for the syncer in
# SYNCER_SBATCH_ARGS; the arguments (--set key=value ...) go to both programs.
#
#   CONFIG=configs/kjv_decoupled.yaml slurm/submit.sh [--set key=value ...]
set -euo pipefail
for ((i = 1; i <= $#; i++)); do
  case ${!i} in
    --set|-s) i=$((i + 1)) ;;
    --set=*) ;;
    -h|--help) sed -n 2,9p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "submit.sh: unexpected argument '${!i}' (only --set key=value)" >&2; exit 2 ;;
  esac
done
CONFIG=$(realpath "${CONFIG:-configs/kjv_decoupled.yaml}")
DDILOCO=$(realpath "${DDILOCO:-build/ddiloco}")
export CONFIG DDILOCO
cd "$(dirname "$0")/.."
units=$("$DDILOCO" config --config "$CONFIG" "$@" --get units.count)
ranks=$("$DDILOCO" config --config "$CONFIG" "$@" --get units.ranks_per_unit)
every=$("$DDILOCO" config --config "$CONFIG" "$@" --get checkpoint.every)
[[ $units =~ ^[0-9]+$ && $ranks =~ ^[0-9]+$ ]] || { echo "submit.sh: cannot read units.count / units.ranks_per_unit from $CONFIG" >&2; exit 2; }
[[ $every != 0 ]] || { echo "submit.sh: checkpoint.every is 0 in $CONFIG: a requeued syncer would start over; set it (merges between checkpoints)" >&2; exit 2; }
syncer=$(sbatch --parsable --hold ${SYNCER_SBATCH_ARGS:-} slurm/syncer.sbatch "$@")
if ! array=$(sbatch --parsable --dependency="after:$syncer" --array="0-$((units - 1))" --ntasks="$ranks" \
             ${UNITS_SBATCH_ARGS:-} slurm/units.sbatch "$@"); then
  scancel "$syncer"
  echo "submit.sh: the units' array was not accepted; the syncer's job $syncer is cancelled" >&2
  exit 1
fi
scontrol release "$syncer"
echo "syncer job $syncer, units job array $array (tasks 0-$((units - 1)), $ranks ranks each)"

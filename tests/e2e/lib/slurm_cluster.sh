# A real one-node Slurm cluster for a test (scripts/slurm_local.sh), in $WORK/slurm: started
# here, stopped (its jobs killed) when the test ends, before common.sh's trap removes $WORK.
# On failure the test's dump function (if it defines one before sourcing this) and the
# daemons' logs are printed. Exits 77 only when the helper does (Slurm cannot be had here:
# not root, no packages, no cgroups); any other failure to start is the test's failure.
#   source lib/common.sh; dump() { ...; }; source lib/slurm_cluster.sh     (exports SLURM_CONF)
CLUSTER=$WORK/slurm
declare -F dump > /dev/null || dump() { :; }
# (In the EXIT trap under set -e: a missing file must not end the trap before the cluster stops.)
slurm_dump() {
  dump
  echo "---- slurmctld.log (tail)"; tail -n 15 "$CLUSTER/log/slurmctld.log" 2>/dev/null || true
  echo "---- slurmd.log (tail)"; tail -n 15 "$CLUSTER/log/slurmd.log" 2>/dev/null || true
}
common_trap=$(trap -p EXIT)
common_trap=${common_trap#trap -- \'}
common_trap=${common_trap%\' EXIT}
eval "trap -- 'rc=\$?; ((rc == 0 || rc == 77)) || slurm_dump >&2
  \"\$SRC/scripts/slurm_local.sh\" stop \"\$CLUSTER\" >/dev/null 2>&1; $common_trap' EXIT"
rc=0
env_line=$("$SRC/scripts/slurm_local.sh" start "$CLUSTER" 2>"$WORK/slurm_start.log") || rc=$?
if [[ $rc == 77 ]]; then
  cat "$WORK/slurm_start.log" >&2
  echo "SKIP: no local Slurm cluster (scripts/slurm_local.sh start exited 77)"
  exit 77
fi
[[ $rc == 0 ]] || { cat "$WORK/slurm_start.log" >&2; fail "scripts/slurm_local.sh start exited $rc: the cluster did not start"; }
eval "$env_line"  # export SLURM_CONF=...

# The test's job: set `job` (its id) after sbatch. state: its JobState. until_ok SECONDS WHAT
# CMD...: polls CMD; fails when the job has ended or the time is up.
state() { scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
until_ok() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    case $(state) in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)
      "$@" || fail "job $job ended ($(state)) before: $what" ;;
    esac
    ((SECONDS < deadline)) || fail "timed out after ${limit} s waiting for: $what"
    sleep 0.3
  done
}

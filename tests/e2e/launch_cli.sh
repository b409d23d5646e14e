# `ddiloco launch` refuses what it cannot run with one line, before it starts any process:
# modes without a syncer of their own, bad launch.* keys, a bad kill fault, a run.dir that
# holds a run. (The supervision itself is tested in tests/unit/test_launch.cpp.)
source "$(dirname "$0")/lib/common.sh"
cd "$WORK"
CFG=$SRC/configs/kjv_decoupled.yaml
RUN=(--set run.dir="$WORK/run")

expect_error "launch: mode ddp needs one MPI world" "$DDILOCO" launch --config "$CFG" "${RUN[@]}" --set mode=ddp
expect_error "launch: mode single is one unit without a syncer" "$DDILOCO" launch --config "$CFG" "${RUN[@]}" --set mode=single --set units.count=1 --set syncer.quorum=1
expect_error "--set: launch.max_restarts: must be ≥ 0, got -1" "$DDILOCO" launch --config "$CFG" "${RUN[@]}" --set launch.max_restarts=-1
expect_error "launch.backoff_max_s: must be ≥ launch.backoff_s = 60, got 30" "$DDILOCO" launch --config "$CFG" "${RUN[@]}" --set launch.backoff_s=60
expect_error "--set: launch.mpirun: must not be empty" "$DDILOCO" launch --config "$CFG" "${RUN[@]}" --set launch.mpirun=

cat > kills.yaml <<'YAML'
faults:
  - {unit: 1, kind: kill, rank: 1, start_s: 5}
YAML
expect_error "kills.yaml: faults[0].rank: unit 1 has 1 rank(s), 0 to 0, got 1" "$DDILOCO" launch --config "$CFG" "${RUN[@]}" --set chaos.schedule_file=kills.yaml
cat > syncer_unit.yaml <<'YAML'
faults:
  - {unit: 0, kind: kill_syncer, start_s: 5}
YAML
expect_error "syncer_unit.yaml: faults[0].unit: kill_syncer kills the syncer, which is no unit" "$DDILOCO" launch --config "$CFG" "${RUN[@]}" --set chaos.schedule_file=syncer_unit.yaml

mkdir -p run && : > run/metrics.jsonl
expect_error "run.dir: '$WORK/run' already holds a run (metrics.jsonl); pass --overwrite" "$DDILOCO" launch --config "$CFG" "${RUN[@]}"
expect_error "--resume: 'nowhere' is not a checkpoint directory" "$DDILOCO" launch --config "$CFG" "${RUN[@]}" --resume nowhere
[[ ! -e run/launch.jsonl ]] || fail "a refused launch wrote run/launch.jsonl"

# The example schedule of kills loads, and `ddiloco chaos` counts them apart.
out=$("$DDILOCO" chaos --config "$CFG" --set chaos.schedule_file="$SRC/configs/chaos/kjv_kills.yaml" --out sched.yaml)
grep -q "unit 1: 0 crashes .* 1 kills (ddiloco launch)" <<<"$out" || fail "chaos summary: $out"
grep -q "syncer: 1 kills (ddiloco launch)" <<<"$out" || fail "chaos summary: $out"
grep -q "{kind: kill_syncer, start_s: 120}" sched.yaml || fail "written schedule: $(cat sched.yaml)"
"$DDILOCO" chaos --config "$CFG" --set chaos.schedule_file=sched.yaml > /dev/null || fail "the written schedule does not load"
echo "PASS: launch refusals and kill schedules"

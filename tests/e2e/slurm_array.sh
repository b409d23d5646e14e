# Slurm: the isolated deployment as a syncer job and a job array of units, one task per unit
# (slurm/submit.sh, slurm/syncer.sbatch, slurm/units.sbatch), on a real one-node cluster
# (scripts/slurm_local.sh). Checked, with the gap rule of isolated_deployment.sh (no gap
# between merges longer than twice the syncer's nominal period while a unit is away):
#   1. `scontrol requeue` of unit 1's task: Slurm stops and restarts only that task; unit 1
#      rejoins (restart 1) and is merged again; unit 0 is merged throughout;
#   2. kill -9 of unit 0's rank (a crash): its mpirun fails, the task requeues itself; unit 0
#      rejoins (restart 1) while unit 1 is merged throughout;
#   3. `scontrol requeue` of the syncer's job: it stops, starts again and resumes from its
#      newest periodic checkpoint, while both units train on and reconnect by themselves; then
#      its time-limit warning (SIGUSR1 to the batch shell): it requeues itself and resumes;
#   4. scancel of both jobs ends the run early: every process of it ends.
# Skipped (77) only where Slurm cannot run (the helper exits 77), as slurm_requeue.sh.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
dump() { for f in "$WORK"/out/*.out; do echo "---- $f (tail)"; tail -n 15 "$f"; done 2>/dev/null || true; }
source "$(dirname "$0")/lib/slurm_cluster.sh"

make_text_shards text
mkdir -p out
cat > job.yaml <<YAML
mode: decoupled
run: {dir: $WORK/run, log_every: 50, threads: 1}
model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 64}
data: {train: $WORK/text/train_*.bin, val: $WORK/text/val_*.bin}
train: {batch_size: 8, steps: 100000000, warmup_steps: 5}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2, slowdown: [2, 2]}
outer: {fragments: 2, h: 4, overlap: 1}
syncer: {quorum: 1, eval_every: 100, heartbeat_timeout_s: 3, connect_wait_s: 120}
checkpoint: {every: 50}
YAML
# The jobs write their output beside the test (--output), share the node's cores (-s).
submitted=$(cd "$SRC" && CONFIG=$WORK/job.yaml DDILOCO=$DDILOCO \
  SYNCER_SBATCH_ARGS="--oversubscribe --output=$WORK/out/syncer-%j.out" \
  UNITS_SBATCH_ARGS="--oversubscribe --output=$WORK/out/unit-%a.out" slurm/submit.sh) ||
  fail "slurm/submit.sh failed"
echo "$submitted"
syncer_job=$(sed -E 's/^syncer job ([0-9]+),.*/\1/' <<< "$submitted")
array_job=$(sed -E 's/.*units job array ([0-9]+) .*/\1/' <<< "$submitted")
state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | head -1 | cut -d= -f2; }
M=$WORK/run/metrics.jsonl
# A wait_event's PID: the syncer job's state stands in (the processes are Slurm's).
sleep infinity & keeper=$!  # (killed by common.sh's trap with the other jobs)
ev_wait() { wait_event "$M" $keeper "$1" "$2" || { squeue; fail "$3"; }; }
until [[ -s $M ]]; do sleep 0.5; ((SECONDS < 120)) || fail "the syncer job never started ($(state $syncer_job))"; done
ev_wait 120 "all(sum(1 for e in ev if e['event'] == 'merge' and u in e['units']) >= 3 for u in (0, 1))" \
  "the units were not both merged"

# 1. scontrol requeue of unit 1's task.
mark=$(wc -l < "$M")
scontrol requeue "${array_job}_1" || fail "scontrol requeue ${array_job}_1 failed"
ev_wait 60 "any(e['event'] == 'unit_lost' and e['unit'] == 1 for e in ev[$mark:])" "unit 1 was not lost after its requeue"
ev_wait 120 "any(e['event'] == 'unit_joined' and e['unit'] == 1 and e['restart'] == 1 for e in ev[$mark:])" \
  "unit 1's task did not rejoin after its requeue"
ev_wait 60 "sum(1 for e in ev[$mark:][[x['event'] for x in ev[$mark:]].index('unit_joined'):] if e['event'] == 'merge' and 1 in e['units']) >= 2" \
  "unit 1 was not merged again"
mark1=$mark

# 2. kill -9 of unit 0's rank: the task requeues itself.
mark=$(wc -l < "$M")
leader=$(cat "$WORK/run/pids/unit0.rank0.pid")
kill -KILL "$leader"
ev_wait 120 "any(e['event'] == 'unit_joined' and e['unit'] == 0 and e['restart'] == 1 for e in ev[$mark:])" \
  "unit 0's task did not rejoin after kill -9"
mark2=$mark

# 3. scontrol requeue of the syncer's job.
mark=$(wc -l < "$M")
scontrol requeue "$syncer_job" || fail "scontrol requeue $syncer_job failed"
ev_wait 120 "any(e['event'] == 'resume' for e in ev[$mark:])" "the syncer's job did not resume after its requeue"
ev_wait 120 "all(sum(1 for e in ev[[x['event'] for x in ev].index('resume', $mark):] if e['event'] == 'merge' and u in e['units']) >= 2 for u in (0, 1))" \
  "the units were not merged by the resumed syncer"
mark3=$mark

# 3b. The syncer's time limit near: Slurm's warning signal (what --signal=B:USR1@120 sends to
# the batch shell, sent now by hand): the job requeues itself and resumes.
mark=$(wc -l < "$M")
scancel --batch --signal=USR1 "$syncer_job" || fail "scancel --batch --signal=USR1 $syncer_job failed"
ev_wait 120 "any(e['event'] == 'resume' for e in ev[$mark:])" "the syncer's job did not requeue itself on its time-limit warning"
ev_wait 120 "all(sum(1 for e in ev[[x['event'] for x in ev].index('resume', $mark):] if e['event'] == 'merge' and u in e['units']) >= 1 for u in (0, 1))" \
  "the units were not merged after the time-limit requeue"
grep -q "time limit near" "$WORK"/out/syncer-*.out || fail "syncer.sbatch did not log the time-limit warning"
# No unit aborted when the syncer stopped (UCX aborts a unit that gets a put after the
# syncer's endpoint failed: the syncer ends its transfers before it closes).
! grep -l "Fatal" "$WORK"/out/unit-*.out || fail "a unit aborted (UCX Fatal) when the syncer stopped"

# 4. The end: scancel of both jobs; every process of the run ends (the pid files name them).
scancel "$syncer_job" "$array_job"
deadline=$((SECONDS + 120))
until [[ -z $(squeue -h -j "$syncer_job,$array_job" 2>/dev/null) ]]; do
  ((SECONDS < deadline)) || { squeue; fail "the jobs did not end after scancel"; }
  sleep 0.5
done
for f in "$WORK"/run/pids/*.pid; do
  p=$(cat "$f")
  ! kill -0 "$p" 2>/dev/null || fail "process $p ($f) outlived its job"
done
kill $keeper

/usr/bin/python3 - "$mark1" "$mark2" "$mark3" <<'PY' || fail "the Slurm array's record is wrong"
import json, sys, glob
m1, m2, m3 = map(int, sys.argv[1:4])
ev = [json.loads(l) for l in open("run/metrics.jsonl")]
def window(a, b, u):  # merges from a to b (event indices), and the other unit's gaps
    ms = [e for e in ev[a:b] if e["event"] == "merge"]
    gaps = [(y["elapsed_s"] - x["elapsed_s"], y["period_s"]) for x, y in zip(ms, ms[1:])
            if x["elapsed_s"] < y["elapsed_s"]]
    return ms, gaps
for (a, b, away) in ((m1, m2, 1), (m2, m3, 0)):
    lost = next(i for i in range(a, b) if ev[i]["event"] == "unit_lost" and ev[i]["unit"] == away)
    joined = next(i for i in range(a, b) if ev[i]["event"] == "unit_joined" and ev[i]["unit"] == away)
    ms, gaps = window(lost, joined, away)
    assert ms and all(away not in m["units"] for m in ms), ("merged while away", away, ms[:2])
    worst = max(gaps, key=lambda g: g[0] / g[1]) if gaps else (0, 1)
    assert worst[0] <= 2 * worst[1] + 0.5, f"unit {away} away: a gap of {worst[0]:.2f} s (period {worst[1]:.2f} s)"
    print(f"unit {away} away {ev[joined]['elapsed_s'] - ev[lost]['elapsed_s']:.1f} s "
          f"(heal {ev[joined]['heal_s']:.1f} s): {len(ms)} merges of the other meanwhile, longest gap {worst[0]:.2f} s")
resume = next(e for e in ev[m3:] if e["event"] == "resume")
ckpts = [e for e in ev[:m3 + ev[m3:].index(resume)] if e["event"] == "checkpoint"]
assert ckpts and resume["path"] == ckpts[-1]["path"], (resume, ckpts[-1:])
# The units trained on while the syncer was away: their processes are the same.
for u in (0, 1):
    starts = [json.loads(l) for l in open(f"run/unit_{u}.jsonl") if '"event":"start"' in l]
    assert [s["restart"] for s in starts] == [0, 1], (u, starts)
    backs = [json.loads(l) for l in open(f"run/unit_{u}.jsonl") if '"event":"syncer_back"' in l]
    assert backs, f"unit {u} never saw the syncer come back"
print(f"syncer resumed from {resume['path'].split('/')[-1]} at {resume['tokens']} tokens")
PY
echo "slurm_array: passed"

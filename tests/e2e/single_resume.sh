# Exact resume of mode single (one unit of 2 ranks, no syncer; single_checkpoints.hpp): a run
# straight through, the same run resumed from a periodic checkpoint by path, the same run
# stopped by SIGTERM to its ranks (as Slurm sends it: they finish the step and write a
# checkpoint, exit 143) then resumed with --resume auto, and the same run killed with SIGKILL
# (no warning: the work since its last periodic checkpoint is redone) then resumed with
# --resume auto, all end on bit-identical parameters and AdamW state, with the same losses
# and samples at every step both logged (the data cursor of each rank and the sampler's
# generator are restored). Run E shards AdamW's state over the 2 ranks (units.zero: 1, ZeRO-1:
# on 2 ranks the same update bit for bit, zero.hpp), is stopped by SIGTERM, its checkpoint
# gathered from both shards, and resumed: it too ends equal to A. Also: a resume with another
# number of ranks is refused, naming the -np to use, and writes nothing; so is another run.seed;
# a complete run resumed again logs nothing; a checkpoint evaluates with `ddiloco eval`; and
# --resume auto refuses to replace a run that completed without checkpoints.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
make_text_shards text
cat > s.yaml <<'YAML'
mode: single
run: {dir: A, log_every: 7, progress: false, threads: 1}
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 2, steps: 1500, warmup_steps: 2}
eval: {val_tokens: 512, every_steps: 500, sample_tokens: 8, sample_every_steps: 300}
checkpoint: {every: 250, every_s: 0, keep: 100}
YAML
run() { "${DDILOCO_MPIRUN[@]}" -np 2 "$DDILOCO" train --config s.yaml "$@"; }
# stop_ranks MPIRUN_PID SIGNAL: the signal to each of the job's 2 ranks; the job's exit status
# in $rc.
stop_ranks() {
  local ranks
  ranks=$(pgrep -P "$1" | tr '\n' ' ')
  [[ $(wc -w <<< "$ranks") == 2 ]] || fail "mpirun $1 has children '$ranks', expected its 2 ranks"
  kill "-$2" $ranks
  rc=0
  wait "$1" || rc=$?
}

run > A.log 2>&1 || { cat A.log; fail "straight run failed"; }
mid=A/checkpoints/ckpt_00000002
[[ -f $mid/manifest.json ]] || { ls A/checkpoints; fail "no periodic checkpoint $mid"; }
grep -q '"mode": "single"' $mid/manifest.json || { cat $mid/manifest.json; fail "manifest of $mid"; }
"$DDILOCO" inspect "$mid" > inspect.txt || { cat inspect.txt; fail "inspect $mid failed"; }
run --set run.dir=B --resume "$mid" > B.log 2>&1 || { cat B.log; fail "resume from $mid failed"; }
grep -q "resumed from $mid at step 500" B.log || { cat B.log; fail "B did not say where it resumed"; }

# Another number of ranks: refused before anything is written.
rc=0
"${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" train --config s.yaml --set run.dir=B1 --resume "$mid" > B1.log 2>&1 || rc=$?
((rc != 0)) || fail "a resume with 1 rank of a 2-rank checkpoint was accepted"
grep -q "written by 2 ranks, this job has 1: resume it with mpirun -np 2" B1.log || { cat B1.log; fail "B1's message"; }
[[ ! -e B1/metrics.jsonl ]] || fail "the refused resume wrote B1/metrics.jsonl"

# SIGTERM after step 600 (no periodic checkpoint there, and mid-way between two train events:
# their mean over steps 596-602 spans the stop), then --resume auto. Step-based, not timed: the
# ranks wait after step 600 (whose sample is logged first) until they are signalled
# (debug.stall_*).
hold=(--set debug.stall_unit=0 --set debug.stall_at_step=600)
"${DDILOCO_MPIRUN[@]}" -np 2 "$DDILOCO" train --config s.yaml --set run.dir=C "${hold[@]}" > C1.log 2>&1 &
pid=$!
wait_event C/metrics.jsonl $pid 300 "last('sample') >= 0 and ev[last('sample')]['step'] >= 600" ||
  { cat C1.log; fail "C never reached step 600"; }
stop_ranks $pid TERM
((rc == 143)) || { cat C1.log; fail "the job exited $rc after SIGTERM, expected 143"; }
run --set run.dir=C --resume auto > C2.log 2>&1 || { cat C2.log; fail "C: resume auto failed"; }
# Once more: the run is complete, and nothing is logged twice. Another run.seed is another run.
run --set run.dir=C --resume auto > C3.log 2>&1 || { cat C3.log; fail "C: resume of the complete run failed"; }
grep -q "the run is complete at step 1500" C3.log || { cat C3.log; fail "C3 did not say the run is complete"; }
rc=0
run --set run.dir=C --set run.seed=2 --resume auto > C4.log 2>&1 || rc=$?
((rc != 0)) && grep -q "run.seed is 1337 there, 2 in this configuration" C4.log || { cat C4.log; fail "another run.seed was resumed"; }

# SIGKILL after step 600: resumed from the periodic checkpoint of step 500.
"${DDILOCO_MPIRUN[@]}" -np 2 "$DDILOCO" train --config s.yaml --set run.dir=D "${hold[@]}" > D1.log 2>&1 &
pid=$!
wait_event D/metrics.jsonl $pid 300 "last('sample') >= 0 and ev[last('sample')]['step'] >= 600" ||
  { cat D1.log; fail "D never reached step 600"; }
stop_ranks $pid KILL
((rc != 0)) || fail "the job exited 0 after SIGKILL"
run --set run.dir=D --resume auto > D2.log 2>&1 || { cat D2.log; fail "D: resume auto failed"; }

# E: units.zero = 1, SIGTERM after step 600, --resume auto.
"${DDILOCO_MPIRUN[@]}" -np 2 "$DDILOCO" train --config s.yaml --set run.dir=E --set units.zero=1 "${hold[@]}" > E1.log 2>&1 &
pid=$!
wait_event E/metrics.jsonl $pid 300 "last('sample') >= 0 and ev[last('sample')]['step'] >= 600" ||
  { cat E1.log; fail "E never reached step 600"; }
stop_ranks $pid TERM
((rc == 143)) || { cat E1.log; fail "E exited $rc after SIGTERM, expected 143"; }
run --set run.dir=E --set units.zero=1 --resume auto > E2.log 2>&1 || { cat E2.log; fail "E: resume auto failed"; }

# A single checkpoint evaluates like a model file (θ of unit_0.h5, the manifest's configuration).
last=$(ls -d A/checkpoints/ckpt_* | tail -n 1)
"$DDILOCO" eval --model "$last" > eval.log 2>&1 || { cat eval.log; fail "eval --model $last failed"; }
grep -q "val_loss=" eval.log || { cat eval.log; fail "eval printed no val_loss"; }
# --resume auto never replaces a run that completed without checkpoints.
run --set run.dir=F --set checkpoint.every=0 --set checkpoint.at_stop=false > F1.log 2>&1 || { cat F1.log; fail "F failed"; }
rc=0
run --set run.dir=F --resume auto > F2.log 2>&1 || rc=$?
((rc != 0)) && grep -q "holds a completed run and no checkpoint" F2.log || { cat F2.log; fail "F: a completed run was replaced"; }
[[ $(grep -c '"event":"done"' F/metrics.jsonl) == 1 ]] || fail "F's metrics changed"

/usr/bin/python3 - <<'PY' || fail "resumed runs differ from the straight one"
import json, glob, h5py, numpy as np
def events(run):
    return [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
def final_state(run):
    # The last checkpoint holds θ and AdamW's moments; model.h5 holds θ as saved.
    last = sorted(glob.glob(f"{run}/checkpoints/ckpt_*"))[-1]
    with h5py.File(f"{last}/unit_0.h5", "r") as f:
        st = {g + "/" + k: f[g][k][()] for g in ("params", "adamw/m", "adamw/v") for k in f[g]}
        st["adam_step"] = f["adamw"].attrs["step"]
        st["step"] = f.attrs["step"]
        st["cursor"] = f["data"]["cursor"][()]
    with h5py.File(f"{run}/model.h5", "r") as f:
        st.update({"model/" + k: f["params"][k][()] for k in f["params"]})
    return st
def by_step(run, kind, key):
    return {e["step"]: e[key] for e in events(run) if e["event"] == kind}
a = final_state("A")
assert a["step"] == 1500 and a["adam_step"] == 1500, (a["step"], a["adam_step"])
for run in ("B", "C", "D", "E"):
    s = final_state(run)
    diff = [k for k in a if not np.array_equal(a[k], s[k])]
    assert not diff, f"{run}: differs from A in {diff[:5]}"
    for kind, key in (("train", "train_loss"), ("val", "val_loss"), ("sample", "text")):
        ra, rs = by_step("A", kind, key), by_step(run, kind, key)
        common = sorted(set(ra) & set(rs))
        assert len(common) >= 2, (run, kind, common)
        bad = [t for t in common if ra[t] != rs[t]]
        assert not bad, f"{run}: {kind} differs from A at steps {bad[:5]}"
starts = {run: [e for e in events(run) if e["event"] == "start"][0] for run in ("A", "E")}
assert starts["E"]["zero"] == 1 and starts["A"]["zero"] == 0, starts
# 7664 parameters in shards of 4096 and 3568: rank 0 holds 4096 of them (8 bytes each).
assert starts["A"]["optimizer_bytes_per_rank"] == 8 * 7664, starts
assert starts["E"]["optimizer_bytes_per_rank"] == 8 * 4096, starts
c = events("C")
assert [e["event"] for e in c].count("done") == 1, "C: a done event logged twice"
assert [e["event"] for e in c].count("start") == 2, "C: the complete run was started again"
assert len(open("C3.log").read().splitlines()) < 5, "C3: the complete run printed more than its line"
stop = [e for e in c if e["event"] == "interrupted"]
assert len(stop) == 1 and stop[0]["signal"] == 15 and stop[0]["step"] == 600, stop
resume = [e for e in c if e["event"] == "resume"]
assert len(resume) == 1 and resume[0]["step"] == stop[0]["step"], (resume, stop)
d = [e for e in events("D") if e["event"] == "resume"]
assert len(d) == 1 and d[0]["step"] == 500, d  # the last periodic checkpoint before the kill
print(f"A, B (from step 500), C (SIGTERM at step {stop[0]['step']}), D (SIGKILL, from step 500) and "
      f"E (units.zero 1, SIGTERM at step 600): bit-identical θ, AdamW state and cursors; losses and "
      f"samples equal at every common step")
PY
echo "PASS: single_resume"

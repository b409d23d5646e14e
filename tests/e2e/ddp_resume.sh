# Exact resume of mode ddp (2 units of 1 and 2 ranks all-reducing gradients every step, and the
# syncer that evaluates; ddp_reducer.hpp): a run straight through, the same run resumed from a
# periodic checkpoint by path, and the same run stopped by SIGTERM to its ranks (as Slurm sends
# it: every unit stops after the same step, writes its file, the syncer completes the
# checkpoint, exit 143) then resumed with --resume auto, all end on bit-identical parameters
# and AdamW state, with the same losses at every step both logged and the same global
# evaluations (each rank's data cursor is saved and restored). Also: a complete run resumed
# again trains nothing. D: run C with AdamW sharded over unit 1's ranks (units.zero: 1). E: chaos
# crashes at checkpoint steps leave every checkpoint's unit files of one step.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
make_text_shards text
cat > p.yaml <<'YAML'
mode: ddp
run: {dir: A, log_every: 10, progress: false, threads: 1}
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 2, steps: 600, warmup_steps: 2}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2, ranks: [1, 2]}
syncer: {eval_every: 3}  # θ to evaluate every 150 steps (H = 50)
checkpoint: {every: 100, every_s: 0, keep: 100}
YAML
run() { "${DDILOCO_MPIRUN[@]}" -np 4 "$DDILOCO" train --config p.yaml "$@"; }

run > A.log 2>&1 || { cat A.log; fail "straight run failed"; }
mid=A/checkpoints/ckpt_00000002
[[ -f $mid/manifest.json ]] || { ls A/checkpoints; fail "no periodic checkpoint $mid"; }
grep -q '"mode": "ddp"' $mid/manifest.json || { cat $mid/manifest.json; fail "manifest of $mid"; }
"$DDILOCO" inspect "$mid" > inspect.txt || { cat inspect.txt; fail "inspect $mid failed"; }
run --set run.dir=B --resume "$mid" > B.log 2>&1 || { cat B.log; fail "resume from $mid failed"; }

# SIGTERM while unit 1's leader waits after step 300 (debug.stall_*; unit 0 waits for it in the
# all-reduce of step 301): unit 1 votes to stop in step 301, and every unit stops after it.
"${DDILOCO_MPIRUN[@]}" -np 4 "$DDILOCO" train --config p.yaml --set run.dir=C --set debug.stall_unit=1 \
  --set debug.stall_at_step=300 --set debug.stall_until_merges=1000000000 > C1.log 2>&1 &
pid=$!
wait_event C/unit_0.jsonl $pid 300 "any(e['event'] == 'train' and e['step'] >= 300 for e in ev)" ||
  { cat C1.log; fail "C never reached step 300"; }
ranks=$(pgrep -P $pid | tr '\n' ' ')
[[ $(wc -w <<< "$ranks") == 4 ]] || fail "mpirun $pid has children '$ranks', expected its 4 ranks"
kill -TERM $ranks
rc=0
wait $pid || rc=$?
((rc == 143)) || { cat C1.log; fail "the job exited $rc after SIGTERM, expected 143"; }
run --set run.dir=C --resume auto > C2.log 2>&1 || { cat C2.log; fail "C: resume auto failed"; }
run --set run.dir=C --resume auto > C3.log 2>&1 || { cat C3.log; fail "C: resume of the complete run failed"; }

# D: unit 1's 2 ranks shard AdamW's state (units.zero: 1; in ddp the update of each rank's
# shard from the whole reduced gradient, zero.hpp step_reduced), stopped the same way and
# resumed: the same run, bit for bit.
"${DDILOCO_MPIRUN[@]}" -np 4 "$DDILOCO" train --config p.yaml --set run.dir=D --set units.zero=1 \
  --set debug.stall_unit=1 --set debug.stall_at_step=300 --set debug.stall_until_merges=1000000000 > D1.log 2>&1 &
pid=$!
wait_event D/unit_0.jsonl $pid 300 "any(e['event'] == 'train' and e['step'] >= 300 for e in ev)" ||
  { cat D1.log; fail "D never reached step 300"; }
ranks=$(pgrep -P $pid | tr '\n' ' ')
kill -TERM $ranks
rc=0
wait $pid || rc=$?
((rc == 143)) || { cat D1.log; fail "D exited $rc after SIGTERM, expected 143"; }
run --set run.dir=D --set units.zero=1 --resume auto > D2.log 2>&1 || { cat D2.log; fail "D: resume auto failed"; }

# E: units crashing (chaos) every 0.4 s on average, a checkpoint asked for every 2 steps: a unit
# that crashes at the step its leaders agreed on still writes its file of that step (ddp keeps
# its replica), so no checkpoint holds units a step apart, which its resume could never join.
"${DDILOCO_MPIRUN[@]}" -np 4 "$DDILOCO" train --config p.yaml --set run.dir=E --set train.steps=3000 \
  --set checkpoint.every=2 --set checkpoint.keep=100000 --set chaos.crash_mtbf_s=0.4 \
  --set chaos.down_min_s=0.05 --set chaos.down_max_s=0.05 --set chaos.horizon_s=60 > E.log 2>&1 ||
  { cat E.log; fail "E (chaos) failed"; }
/usr/bin/python3 - <<'PY' || fail "a ddp checkpoint holds units at different steps"
import glob, h5py, json, os
complete = [d for d in sorted(glob.glob("E/checkpoints/ckpt_*")) if os.path.exists(f"{d}/manifest.json")]
crashes = sum(1 for u in (0, 1) for l in open(f"E/unit_{u}.jsonl") if json.loads(l)["event"] == "crash")
assert len(complete) >= 100 and crashes >= 3, (len(complete), crashes)
for d in complete:
    steps = []
    for u in (0, 1):
        with h5py.File(f"{d}/unit_{u}.h5", "r") as f:
            steps.append(int(f.attrs["step"]))
    assert steps[0] == steps[1], f"{d}: the units' files are of steps {steps}"
print(f"E: {len(complete)} checkpoints through {crashes} crashes, each of one step")
PY

# F: every step logged (run.log_every 1), so that every checkpoint is at a log step: the resumed
# run starts a new interval, as the straight one does (before, it restored the closed one and
# logged the mean over two intervals after the resume).
run --set run.dir=F --set run.log_every=1 --set train.steps=300 > F1.log 2>&1 || { cat F1.log; fail "F failed"; }
run --set run.dir=G --set run.log_every=1 --set train.steps=300 --resume F/checkpoints/ckpt_00000001 > G.log 2>&1 ||
  { cat G.log; fail "G: resume of F failed"; }
/usr/bin/python3 - <<'PY' || fail "a run resumed at a log step logs other losses"
import json
for u in (0, 1):
    f = {e["step"]: e["train_loss"] for e in map(json.loads, open(f"F/unit_{u}.jsonl")) if e["event"] == "train"}
    g = {e["step"]: e["train_loss"] for e in map(json.loads, open(f"G/unit_{u}.jsonl")) if e["event"] == "train"}
    common = sorted(set(f) & set(g))
    assert len(common) >= 100, (u, len(common))
    bad = [t for t in common if f[t] != g[t]]
    assert not bad, f"G: unit {u}'s loss differs from F at steps {bad[:5]}"
print("F, G (resumed at a log step): the same losses at every step")
PY

/usr/bin/python3 - <<'PY' || fail "resumed runs differ from the straight one"
import json, glob, h5py, numpy as np
def events(path):
    return [json.loads(l) for l in open(path)]
def final_state(run):
    last = sorted(glob.glob(f"{run}/checkpoints/ckpt_*"))[-1]
    st = {}
    for u in (0, 1):
        with h5py.File(f"{last}/unit_{u}.h5", "r") as f:
            for g in ("params", "adamw/m", "adamw/v"):
                st.update({f"{u}/{g}/{k}": f[g][k][()] for k in f[g]})
            st[f"{u}/adam_step"] = f["adamw"].attrs["step"]
            st[f"{u}/step"] = f.attrs["step"]
            st[f"{u}/cursor"] = f["data"]["cursor"][()]
    with h5py.File(f"{run}/model.h5", "r") as f:
        st.update({"model/" + k: f["params"][k][()] for k in f["params"]})
    return st
a = final_state("A")
assert a["0/step"] == 600 and a["0/adam_step"] == 600 and a["1/step"] == 600, a["0/step"]
assert a["1/cursor"].shape == (2, 2), a["1/cursor"]
for k in [k for k in a if k.startswith("0/params/")]:
    assert np.array_equal(a[k], a["1" + k[1:]]), f"A: the units' replicas differ in {k}"
for run in ("B", "C", "D"):
    s = final_state(run)
    diff = [k for k in a if not np.array_equal(a[k], s[k])]
    assert not diff, f"{run}: differs from A in {diff[:5]}"
    for u in (0, 1):
        la = {e["step"]: e["train_loss"] for e in events(f"A/unit_{u}.jsonl") if e["event"] == "train"}
        ls = {e["step"]: e["train_loss"] for e in events(f"{run}/unit_{u}.jsonl") if e["event"] == "train"}
        common = sorted(set(la) & set(ls))
        assert len(common) >= 20, (run, u, common)
        bad = [t for t in common if la[t] != ls[t]]
        assert not bad, f"{run}: unit {u}'s loss differs from A at steps {bad[:5]}"
    # Version v: θ of step 150·v, which unit 0 shipped to the syncer.
    ga = {e["version"]: e["val_loss"] for e in events("A/metrics.jsonl") if e["event"] == "global_eval"}
    gs = {e["version"]: e["val_loss"] for e in events(f"{run}/metrics.jsonl") if e["event"] == "global_eval"}
    assert sorted(ga) == [1, 2, 3, 4] and 4 in gs, (ga, gs)
    assert all(ga[v] == gs[v] for v in gs), (run, ga, gs)
c = events("C/unit_1.jsonl")
stops = [e for e in c if e["event"] == "checkpoint" and e["step"] == 301]
assert len(stops) == 1, "C: no checkpoint at step 301, where every unit stopped"
resume = [e for e in c if e["event"] == "resume"]
assert [e["step"] for e in resume] == [301, 600], resume
trained = [e["step"] for e in c if e["event"] == "train"]
assert trained == sorted(set(trained)), "C: a step was logged twice (the complete run trained again)"
print("A, B (from a periodic checkpoint), C (SIGTERM after step 301, --resume auto) and D (C with "
      "units.zero 1): bit-identical θ, AdamW state and cursors of both units; losses and global "
      "evaluations equal")
PY
echo "PASS: ddp_resume"

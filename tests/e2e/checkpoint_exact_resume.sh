# Exact resume (diloco): a run straight through, the same run resumed from a periodic
# checkpoint, and the same run stopped by SIGTERM (it ends the round under way and writes a
# checkpoint) then resumed with --resume auto all end on bit-identical parameters, with the
# same losses and data positions at every logged step (no batch skipped or repeated). Unit 1
# has two ranks: each rank's own data cursor is saved and restored.
# Decoupled and streaming resume consistently, not bit for bit (docs/checkpoints.md, "Exact resume"): what is
# deterministic in them is checked after the same kind of stop and resume, every unit's data
# position and tokens at every step both runs logged.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
make_text_shards text
cat > d.yaml <<'YAML'
mode: diloco
run: {dir: A, log_every: 10, progress: false}
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 2, steps: 6000, warmup_steps: 2}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2, ranks: [1, 2]}
outer: {h: 4}
syncer: {eval_every: 100000}
checkpoint: {every: 300, keep: 100}
YAML
run() { "${DDILOCO_MPIRUN[@]}" -np 4 "$DDILOCO" train --config d.yaml "$@"; }
# term_ranks MPIRUN_PID LOG: SIGTERM to each of the job's 4 ranks, as Slurm sends it (mpirun
# would forward it and SIGKILL the ranks 1 s later: a race with the checkpoint's write); the job
# must exit 143.
term_ranks() {
  local ranks rc=0
  ranks=$(pgrep -P "$1" | tr '\n' ' ')
  [[ $(wc -w <<< "$ranks") == 4 ]] || fail "mpirun $1 has children '$ranks', expected its 4 ranks"
  kill -TERM $ranks
  wait "$1" || rc=$?
  ((rc == 143)) || { cat "$2"; fail "the job exited $rc after SIGTERM, expected 143"; }
}
run > A.log 2>&1 || { cat A.log; fail "straight run failed"; }
mid=A/checkpoints/ckpt_00000002
[[ -f $mid/manifest.json ]] || { ls A/checkpoints; fail "no periodic checkpoint $mid"; }
"$DDILOCO" inspect "$mid" > inspect.txt || fail "inspect $mid failed"
grep -q "unit 1, checkpoint 2, 2 ranks" inspect.txt || { cat inspect.txt; fail "inspect: unit 1 not shown"; }
run --set run.dir=B --resume "$mid" > B.log 2>&1 || { cat B.log; fail "resume from $mid failed"; }

# SIGTERM while it runs, then --resume auto. Step-based, not timed: unit 0 is held after its
# step 400 (debug.stall_*, until the stop: in diloco every round needs every unit, so the job
# waits there, the syncer at version 99), and the signal comes once the syncer has seen it
# silent there. The round under way, 100, is finished and checkpointed. (mpirun in the
# background, not a shell function, so that $! is mpirun.)
"${DDILOCO_MPIRUN[@]}" -np 4 "$DDILOCO" train --config d.yaml --set run.dir=C --set checkpoint.every=0 \
  --set debug.stall_unit=0 --set debug.stall_at_step=400 --set debug.stall_until_merges=1000000000 \
  --set syncer.heartbeat_timeout_s=1 > C1.log 2>&1 &
pid=$!
wait_event C/metrics.jsonl $pid 120 "last('merge') >= 0 and ev[last('merge')]['version'] == 99 and
  any(e['event'] == 'unit_silent' and e['unit'] == 0 for e in ev[last('merge'):])" ||
  { cat C1.log; fail "unit 0 was not held at step 400"; }
term_ranks $pid C1.log
run --set run.dir=C --set checkpoint.every=0 --resume auto > C2.log 2>&1 || { cat C2.log; fail "resume auto failed"; }

/usr/bin/python3 - <<'PY' || fail "resumed runs differ from the straight one"
import json, h5py, numpy as np
def events(path):
    return [json.loads(l) for l in open(path)]
def params(run):
    with h5py.File(f"{run}/model.h5", "r") as f:
        return {k: f["params"][k][()] for k in f["params"]}
a = params("A")
for run in ("B", "C"):
    p = params(run)
    same = all(np.array_equal(a[k], p[k]) for k in a)
    assert same, f"{run}/model.h5 differs from A/model.h5"
# C was stopped mid-run on a round boundary and resumed from that checkpoint.
c = events("C/metrics.jsonl")
stop = [e for e in c if e["event"] == "interrupted"]
assert len(stop) == 1 and stop[0]["signal"] == 15, stop
resume = [e for e in c if e["event"] == "resume"]
assert len(resume) == 1 and resume[0]["version"] == stop[0]["stop_after_version"], (resume, stop)
assert resume[0]["version"] == 100, resume  # the round unit 0 was held in
done = [e for e in c if e["event"] == "done"]
assert [d["interrupted"] for d in done] == [True, False] and done[-1]["tokens"] == 6000 * 2 * 16 * 3, done
b = events("B/metrics.jsonl")
assert [e["path"] for e in b if e["event"] == "resume"] == ["A/checkpoints/ckpt_00000002"], b[:3]
# Every logged step: the same data position as the straight run (the leader's cursor) and the
# same loss (the mean since the previous log line: but for the first line after a resume and
# the line of the stop, whose windows are cut), for both units; each step is logged once.
for u in (0, 1):
    def steps(run):
        out, cut = {}, True
        for e in events(f"{run}/unit_{u}.jsonl"):
            if e["event"] == "resume":
                cut = True
            if e["event"] != "train":
                continue
            assert e["step"] not in out, (run, u, e["step"])
            cut |= e["step"] % 10 != 0
            out[e["step"]] = (None if cut else e["train_loss"], e["data_cursor"])
            cut = e["step"] % 10 != 0
        return out
    sa = steps("A")
    for run in ("B", "C"):
        s = steps(run)
        bad = [k for k in s if k in sa and (s[k][1] != sa[k][1] or s[k][0] not in (None, sa[k][0]))]
        assert s and not bad, (run, u, [(k, s[k], sa[k]) for k in bad[:3]])
        assert sum(v[0] is not None for v in s.values()) > 100, (run, u)  # losses compared
    assert set(steps("C")) - set(sa) <= {stop[0]["stop_after_version"] * 4}, u
    assert set(sa) <= set(steps("C")), (u, sorted(set(sa) - set(steps("C")))[:5])
print(f"bit-identical after resuming from ckpt 2 and from the SIGTERM checkpoint at round "
      f"{resume[0]['version']} of 1500")
PY

# Decoupled and streaming: their merges, and decoupled's learning rate, which follows the job's
# tokens as the syncer last published them, depend on timing; a unit's data position and tokens
# at a step do not. Every unit in each merge (decoupled: quorum 2 of 2) and no overlap (τ = 0: a
# unit waits for the merge after each snapshot), and the stop falls between two units on either
# side of a round: unit 1 is held after its step 399 (until the stop; its heartbeat is never
# timed out), and the signal comes once unit 0 has sent fragment 0 of step 400 and waits for
# its merge, which needs unit 1's. A signal's stop merges nothing short of a quorum
# (SyncerCore::set_stopping); resumed, unit 0 sends that fragment again, and the round
# completes. (Flushed alone, it put unit 0 a round ahead, and the resumed units waited for each
# other forever.)
for mode in decoupled streaming; do
  dec=(--config d.yaml --set mode=$mode --set train.steps=1500 --set outer.fragments=2
    --set outer.overlap=0 --set syncer.quorum=2 --set syncer.heartbeat_timeout_s=3600 --set checkpoint.every=0)
  "${DDILOCO_MPIRUN[@]}" -np 4 "$DDILOCO" train "${dec[@]}" --set run.dir=E_$mode > E_$mode.log 2>&1 ||
    { cat E_$mode.log; fail "$mode straight run failed"; }
  "${DDILOCO_MPIRUN[@]}" -np 4 "$DDILOCO" train "${dec[@]}" --set run.dir=F_$mode --set debug.stall_unit=1 \
    --set debug.stall_at_step=399 --set debug.stall_until_merges=1000000000 > F1_$mode.log 2>&1 &
  pid=$!
  wait_event F_$mode/unit_0.jsonl $pid 120 \
    "any(e['event'] == 'snapshot' and e['step'] == 400 and e['fragment'] == 0 for e in ev)" ||
    { cat F1_$mode.log; fail "$mode: unit 0 never sent fragment 0 of step 400"; }
  term_ranks $pid F1_$mode.log
  timeout 300 "${DDILOCO_MPIRUN[@]}" -np 4 "$DDILOCO" train "${dec[@]}" --set run.dir=F_$mode --resume auto \
    > F2_$mode.log 2>&1 || { cat F2_$mode.log; fail "$mode resume auto failed (exit 124: it hung)"; }
  /usr/bin/python3 - $mode <<'PY' || fail "the resumed $mode run's data positions differ from the straight one's"
import json, sys
mode = sys.argv[1]
E, F = f"E_{mode}", f"F_{mode}"
def events(path):
    return [json.loads(l) for l in open(path)]
done = [e for e in events(f"{F}/metrics.jsonl") if e["event"] == "done"]
assert [d["interrupted"] for d in done] == [True, False] and done[-1]["tokens"] >= 1500 * 3 * 2 * 16, done
for u in (0, 1):
    def train(run):  # step -> (data position of the leader's stream, the unit's tokens)
        out = {}
        for e in events(f"{run}/unit_{u}.jsonl"):
            if e["event"] == "train":
                v = (e["data_cursor"], e["tokens"])
                assert out.setdefault(e["step"], v) == v, (run, u, e["step"], out[e["step"]], v)
        return out
    a, f = train(E), train(F)
    resume = [e for e in events(f"{F}/unit_{u}.jsonl") if e["event"] == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == 400 - u and not resume[0]["lost"], resume
    common = sorted(set(a) & set(f))
    bad = [(s, a[s], f[s]) for s in common if a[s] != f[s]]
    after = [s for s in common if s > resume[0]["step"]]
    assert not bad and len(after) >= 20, (u, len(common), len(after), bad[:3])
    print(f"{mode} unit {u}: resumed at step {resume[0]['step']}; data position and tokens as "
          f"in the straight run at all {len(common)} steps both logged, {len(after)} after the resume")
u0 = events(f"{F}/unit_0.jsonl")
after = u0[[e["event"] for e in u0].index("resume"):]
sent = [e["step"] for e in after if e["event"] == "snapshot" and e["fragment"] == 0]
assert sent[:1] == [401], f"resumed unit 0 did not send fragment 0 again at its first step: {sent[:3]}"
merges = [e for e in events(f"{F}/metrics.jsonl") if e["event"] == "merge" and e["fragment"] == 0]
assert any(sorted(m["at_steps"]) == [400, 401] for m in merges), "no merge of unit 1's step 400 and unit 0's resent 401"
print(f"{mode}: stopped with unit 0 at step 400 and unit 1 at 399; unit 0 sent fragment 0 again at 401, "
      f"merged with unit 1's 400")
PY
done
echo "checkpoint_exact_resume: passed"

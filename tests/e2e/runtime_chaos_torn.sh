# A crash while the syncer is reading the unit's snapshot: the crashed unit's memory is garbage
# (NaN) by the time the data is read, the syncer refuses it (checksum against the header it
# polled), and the global parameters never take torn data: every global evaluation and the
# saved model are finite.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
make_text_shards text
cat > faults.yaml <<'YAML'
faults:
  - {unit: 0, kind: crash, start_s: 0.8, duration_s: 0.4}
  - {unit: 0, kind: crash, start_s: 2.0, duration_s: 0.4}
YAML
# P = H = 2: a fragment is published every step and the syncer pauses 50 ms before each read
# (test hook), so snapshots wait unread in the outboxes; each due crash waits until the syncer
# announces a read of one of unit 0's, and that read waits until the crash has taken the unit's
# memory (test hook debug.crash_during_read), so every crash is read as garbage.
cat > t.yaml <<'YAML'
mode: decoupled
run: {dir: t, log_every: 5, progress: false}
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 2, steps: 1000000, warmup_steps: 2}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2}
outer: {fragments: 2, h: 2, overlap: 1}
syncer: {quorum: 1, eval_every: 5, heartbeat_timeout_s: 0.3}
chaos: {schedule_file: faults.yaml}
debug: {syncer_read_delay_ms: 50, crash_during_read: true}
YAML
"${DDILOCO_MPIRUN[@]}" -np 3 "$DDILOCO" train --config t.yaml > t.log 2>&1 &
pid=$!
# Each crash's garbage is read and refused before its rejoin is served (the read waits for the
# crash, the rejoin for the down time), so the second rejoin is the end of what is checked.
wait_event t/unit_0.jsonl $pid 120 "sum(e['event'] == 'rejoin' for e in ev) == 2" ||
  fail "no second rejoin"
kill -TERM $pid
rc=0; wait $pid || rc=$?
/usr/bin/python3 - <<'PY' || { cat t.log; fail "torn data reached the global model"; }
import json, math, h5py, numpy as np
ev = [json.loads(l) for l in open("t/metrics.jsonl")]
unit = [json.loads(l) for l in open("t/unit_0.jsonl")]
crashes = [e for e in unit if e["event"] == "crash"]
assert len(crashes) == 2, crashes
lost = sum(c["lost_snapshots"] for c in crashes)
assert all(c["lost_snapshots"] >= 1 for c in crashes), crashes
rejected = [e for e in ev if e["event"] == "snapshot_rejected" and e["unit"] == 0]
assert len(rejected) >= 2, f"{len(rejected)} snapshots of the crashed unit refused, want one per crash"
assert all(r["reason"] == "checksum mismatch" for r in rejected), rejected
evals = [e for e in ev if e["event"] == "global_eval"]
assert evals and all(math.isfinite(e["val_loss"]) for e in evals), evals
with h5py.File("t/model.h5") as f:
    for name, d in f["params"].items():
        assert np.isfinite(d[...]).all(), name
print(f"{lost} snapshots lost in 2 crashes, {len(rejected)} refused by the syncer; "
      f"{len(evals)} global evaluations, all finite; final val_loss {evals[-1]['val_loss']:.3f}")
PY
echo "runtime_chaos_torn: passed"

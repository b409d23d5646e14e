# diloco under a crash: the job stalls while the unit is down (every merge needs every unit),
# and the unit, whose snapshot of round k dies with it (test hook debug.crash_during_read: the
# syncer's read of that snapshot waits for the unit's answer, which the due crash gives only
# after it took the unit's memory, so the loss happens whatever the machine's load), rejoins
# with Θ of round k − 1 and redoes that round's H steps, so every merge still has every unit
# at the same step and all end on the same round.
# The crash is due from the job's first 10 ms on and lands at the first read of the unit's
# snapshot after that: nothing here races the job's speed.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
make_text_shards text
cat > faults.yaml <<'YAML'
faults:
  - {unit: 1, kind: crash, start_s: 0.01, duration_s: 1.0}
YAML
cat > d.yaml <<'YAML'
mode: diloco
run: {dir: d, log_every: 5, progress: false}
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 2, steps: 160, warmup_steps: 2}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 3}
outer: {h: 4}
syncer: {eval_every: 1000, heartbeat_timeout_s: 0.3}
chaos: {schedule_file: faults.yaml}
debug: {crash_during_read: true}
YAML
ddiloco_mpirun -np 4 "$DDILOCO" train --config d.yaml > d.log 2>&1 || { cat d.log; fail "run failed"; }
/usr/bin/python3 - <<'PY' || { cat d.log; fail "diloco crash and rejoin not as expected"; }
import json
ev = [json.loads(l) for l in open("d/metrics.jsonl")]
unit = [json.loads(l) for l in open("d/unit_1.jsonl")]
crash = [e for e in unit if e["event"] == "crash"]
rejoin = [e for e in unit if e["event"] == "rejoin"]
assert len(crash) == 1 and len(rejoin) == 1, (crash, rejoin)
crash, rejoin = crash[0], rejoin[0]
assert crash["lost_snapshots"] == 1 and crash["step"] % 4 == 0, crash
refused = [e for e in ev if e["event"] == "snapshot_rejected"]
# The syncer read the snapshot after the crash took the unit's memory: refused, and the unit
# redoes the round it belonged to.
assert [(e["unit"], e["reason"]) for e in refused] == [(1, "checksum mismatch")], refused
assert rejoin["versions"] == [crash["step"] // 4 - 1], rejoin
assert rejoin["steps_redone"] == 4 and rejoin["step"] == crash["step"] - 4, rejoin
merges = [e for e in ev if e["event"] == "merge"]
assert len(merges) == 40, len(merges)  # 160 steps / H, every round once
for m in merges:
    assert sorted(m["units"]) == [0, 1, 2] and len(set(m["at_steps"])) == 1, m
    assert m["at_steps"][0] == 4 * m["version"], m
# Nobody merged while unit 1 was down (the learners' and the syncer's clocks start at the
# same barrier; 50 ms of slack either side).
down = [m for m in merges if crash["elapsed_s"] + 0.05 < m["elapsed_s"] < rejoin["elapsed_s"] - 0.05]
# (A crash that waited for a read on a loaded machine has less of its down-time left.)
assert not down and rejoin["elapsed_s"] - crash["elapsed_s"] >= crash["down_s"] - 0.05, (down, crash, rejoin)
for u in range(3):
    last = [json.loads(l) for l in open(f"d/unit_{u}.jsonl")][-1]
    assert last["step"] == 160, (u, last)
print(f"unit 1 crashed at step {crash['step']} (its snapshot lost), rejoined with round "
      f"{rejoin['versions'][0]} and redid {rejoin['steps_redone']} steps; {len(merges)} merges, "
      f"all of 3 units in step")
PY
echo "runtime_chaos_diloco: passed"

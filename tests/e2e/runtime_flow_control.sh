# A learner far faster than the syncer (the syncer pauses 20 ms per snapshot read, test hook):
# flow control holds the learner back (publishes skipped) and no snapshot is ever torn.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
make_text_shards text
cat > f.yaml <<'YAML'
mode: decoupled
run: {dir: f, log_every: 10, progress: false}
model: {n_layer: 1, n_head: 1, n_embd: 16, seq_len: 16}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 1, steps: 300, warmup_steps: 2}
eval: {val_tokens: 256, sample_tokens: 0}
units: {count: 1}
outer: {fragments: 1, h: 2, overlap: 1}
syncer: {quorum: 1, eval_every: 1000}
debug: {syncer_read_delay_ms: 20}
YAML
ddiloco_mpirun -np 2 "$DDILOCO" train --config f.yaml > f.log 2>&1 || { cat f.log; fail "run failed"; }
/usr/bin/python3 - <<'PY' || fail "flow control"
import json
events = list(map(json.loads, open("f/metrics.jsonl")))
done = [e for e in events if e["event"] == "done"][0]
rejected = [e for e in events if e["event"] == "snapshot_rejected"]
unit = [json.loads(l) for l in open("f/unit_0.jsonl")]
skipped = max(e.get("publish_skipped", 0) for e in unit)
merges = sum(e["event"] == "merge" for e in events)
print(f"merges {merges}, publishes skipped by flow control {skipped}, rejected snapshots {len(rejected)}")
assert rejected == [] and done["snapshots_rejected"] == 0, rejected
assert skipped > 0, "the learner was never held back"
assert merges > 0
PY
echo "runtime_flow_control: passed"

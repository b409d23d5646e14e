# A unit whose parameters turn NaN (test hook: unit 1's leader, just before a snapshot it
# publishes): the syncer refuses that snapshot and logs it, the global parameters stay finite,
# and the unit (two ranks: the NaN reaches the other rank through the all-reduced loss) starts
# over from Θ at its next step instead of ending the job, which then completes.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
make_text_shards text
cat > n.yaml <<'YAML'
mode: decoupled
run: {dir: n, log_every: 5, progress: false}
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 2, steps: 2000, warmup_steps: 2}  # a budget unit 0 cannot spend alone before unit 1, slower to start under load, reaches step 12 (400 steps once did not)
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2, ranks: [1, 2]}
outer: {fragments: 2, h: 4, overlap: 1}
syncer: {quorum: 1, eval_every: 20}
debug: {nan_unit: 1, nan_at_step: 12}
YAML
ddiloco_mpirun -np 4 "$DDILOCO" train --config n.yaml > n.log 2>&1 || { cat n.log; fail "run failed"; }
/usr/bin/python3 - <<'PY' || { cat n.log; fail "a NaN unit not handled as expected"; }
import json, math, h5py, numpy as np
ev = [json.loads(l) for l in open("n/metrics.jsonl")]
unit = [json.loads(l) for l in open("n/unit_1.jsonl")]
rejected = [e for e in ev if e["event"] == "snapshot_rejected"]
assert len(rejected) == 1 and rejected[0]["unit"] == 1, rejected
assert rejected[0]["reason"] == "non-finite values", rejected
bad = [e for e in unit if e["event"] == "non_finite"]
assert len(bad) == 1 and bad[0]["step"] > 12, bad
assert bad[0]["train_loss"] is None or not math.isfinite(bad[0]["train_loss"]), bad  # JSON: NaN is null
crash = [e for e in unit if e["event"] == "crash"]
assert len(crash) == 1 and crash[0]["cause"] == "non_finite" and crash[0]["down_s"] == 0, crash
rejoin = [e for e in unit if e["event"] == "rejoin"]
assert len(rejoin) == 1, rejoin
# The unit went on after it: later snapshots of it are merged.
later = [m for m in ev if m["event"] == "merge" and 1 in m["units"]
         and m["elapsed_s"] > rejoin[0]["elapsed_s"]]
assert later, "unit 1 never merged again"
evals = [e for e in ev if e["event"] == "global_eval"]
assert evals and all(math.isfinite(e["val_loss"]) for e in evals), evals
with h5py.File("n/model.h5") as f:
    for name, d in f["params"].items():
        assert np.isfinite(d[...]).all(), name
done = [e for e in ev if e["event"] == "done"][0]
print(f"refused: {rejected[0]['reason']} (unit 1, seq {rejected[0]['seq']}); unit 1 non-finite "
      f"at step {bad[0]['step']}, back from Θ, merged {len(later)} more times; "
      f"{len(evals)} global evaluations finite, final {done['val_loss']:.3f}")
PY
echo "runtime_non_finite: passed"

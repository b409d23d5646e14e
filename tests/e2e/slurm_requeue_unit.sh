# Slurm, one unit: slurm/train_unit.sbatch (mode single, 2 tasks) on a real one-node cluster
# (scripts/slurm_local.sh) is requeued with `scontrol requeue` (SIGTERM to every rank) after its
# step 300, resumes from the checkpoint it wrote when told to stop, and completes; its final
# parameters equal, bit for bit, those of the same run made straight through with mpirun.
# Step-based, not timed: the ranks wait after step 300 until they are signalled
# (debug.stall_*; the resumed start is past that step and does not wait).
# Skipped (77) only where Slurm cannot run (lib/slurm_cluster.sh).
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"

dump() { echo "---- job output (tail)"; tail -n 40 "$WORK/job.out" 2>/dev/null || true; }
source "$SRC/tests/e2e/lib/slurm_cluster.sh"

make_text_shards text
cat > unit.yaml <<YAML
mode: single
run: {dir: $WORK/run, log_every: 50}
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16}
data: {train: $WORK/text/train_*.bin, val: $WORK/text/val_*.bin}
train: {batch_size: 2, steps: 800, warmup_steps: 2}
eval: {val_tokens: 512, sample_tokens: 0}
checkpoint: {every: 200, every_s: 0}
YAML

# 2 tasks on what may be 2 cores: --overcommit.
job=$(cd "$SRC" && CONFIG=$WORK/unit.yaml DDILOCO=$DDILOCO \
      sbatch --parsable --job-name=ddiloco-unit-e2e --nodes=1 --ntasks-per-node=2 --overcommit \
             --time=10 --output="$WORK/job.out" slurm/train_unit.sbatch \
             --set debug.stall_unit=0 --set debug.stall_at_step=300) || fail "sbatch failed"
echo "submitted job $job"

at_step_300() { grep '"event":"train"' run/metrics.jsonl 2>/dev/null | grep -q '"step":300[,}]'; }
started() { grep -q "restart count $1," job.out 2>/dev/null; }
completed() { [[ $(state) == COMPLETED ]]; }

until_ok 120 "step 300 of the first start" at_step_300
scontrol requeue "$job" || fail "scontrol requeue $job failed"
until_ok 120 "the job's second start (restart count 1)" started 1
until_ok 180 "the job to complete" completed
info=$(scontrol show job "$job")
[[ $info == *"Restarts=1"* && $info == *"ExitCode=0:0"* ]] || fail "job record: $info"

# The same run straight through, outside Slurm (same ranks, one thread each as the job had).
"${DDILOCO_MPIRUN[@]}" -np 2 "$DDILOCO" train --config unit.yaml --set run.dir=$WORK/straight \
  --set run.threads=1 > straight.log 2>&1 || { cat straight.log; fail "the straight run failed"; }

/usr/bin/python3 - <<'PY' || fail "the requeued job did not resume exactly"
import json, re, h5py, numpy as np
ev = [json.loads(l) for l in open("run/metrics.jsonl")]
stops = [e for e in ev if e["event"] == "interrupted"]
assert len(stops) == 1 and stops[0]["signal"] == 15 and stops[0]["step"] == 300, stops
ckpt = [e for e in ev if e["event"] == "checkpoint"]
resume = [e for e in ev if e["event"] == "resume"]
assert len(resume) == 1 and resume[0]["step"] == 300, resume
assert resume[0]["path"].endswith("ckpt_%08d" % [c for c in ckpt if c["step"] == 300][0]["id"]), (resume, ckpt)
done = [e for e in ev if e["event"] == "done"]
assert len(done) == 1 and done[0]["step"] == 800, done
def params(run):
    with h5py.File(f"{run}/model.h5", "r") as f:
        return {k: f["params"][k][()] for k in f["params"]}
a, b = params("run"), params("straight")
diff = [k for k in a if not np.array_equal(a[k], b[k])]
assert not diff, f"differs from the straight run in {diff[:5]}"
counts = re.findall(r"restart count (\d+),", open("job.out").read())
assert counts[:2] == ["0", "1"], counts
print("requeued at step 300, resumed from its stop checkpoint, completed: parameters equal to the straight run's")
PY
echo "slurm_requeue_unit: passed"

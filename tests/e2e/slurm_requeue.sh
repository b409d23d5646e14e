# Slurm: slurm/train.sbatch on a real one-node cluster (scripts/slurm_local.sh). A decoupled job
# (1 syncer + 2 units × 1 rank) is requeued with `scontrol requeue` once it has a checkpoint
# (SIGTERM to every rank), then warned with SIGUSR1 as before its time limit (what
# `--signal=B:USR1@T` delivers: the batch shell forwards it, the ranks checkpoint, the script
# requeues the job). Each start resumes from the checkpoint the previous one wrote last, the
# output file collects all three starts, and the job completes its token budget.
# Skipped (77) only where Slurm cannot run (not root, no apt, no cgroup filesystem for slurmd:
# the helper exits 77); a cluster that is installed but does not start fails the test.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"

dump() { echo "---- job output (tail)"; tail -n 40 "$WORK/job.out" 2>/dev/null || true; }
source "$(dirname "$0")/lib/slurm_cluster.sh"

make_text_shards text
steps=2500 batch=4 seq=64 units=2
cat > job.yaml <<YAML
mode: decoupled
run: {dir: $WORK/run, log_every: 500}
model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: $seq}
data: {train: $WORK/text/train_*.bin, val: $WORK/text/val_*.bin}
train: {batch_size: $batch, steps: $steps, warmup_steps: 5}
eval: {val_tokens: 1024, sample_tokens: 0}
units: {count: $units}
outer: {h: 10}
syncer: {quorum: 1, eval_every: 1000}
checkpoint: {every: 20}
YAML
budget=$((steps * units * batch * seq))  # train.steps × Σ_units batch × seq_len × ranks (1)
ranks=$("$DDILOCO" config --config job.yaml --ranks)
[[ $ranks == 3 ]] || fail "config --ranks: $ranks, expected 3"

# 3 tasks on what may be 2 cores: --overcommit (the syncer mostly waits).
job=$(cd "$SRC" && CONFIG=$WORK/job.yaml DDILOCO=$DDILOCO \
      sbatch --parsable --job-name=ddiloco-e2e --ntasks="$ranks" --overcommit --time=15 \
             --output="$WORK/job.out" slurm/train.sbatch) || fail "sbatch failed"
echo "submitted job $job"

checkpoints() { grep -c '"event":"checkpoint"' run/metrics.jsonl 2>/dev/null || true; }
# checkpointed_since_resume N: a checkpoint event follows the N-th resume event (N = 0: any).
checkpointed_since_resume() {
  awk -v n="$1" '/"event":"resume"/ { r++ } r >= n && /"event":"checkpoint"/ { c++ }
                 END { exit !(c > 0) }' run/metrics.jsonl 2>/dev/null
}
started() { grep -q "restart count $1," job.out 2>/dev/null; }
completed() { [[ $(state) == COMPLETED ]]; }

# 1. First start: wait for a periodic checkpoint, then requeue (SIGTERM to all ranks).
until_ok 120 "the first checkpoint" checkpointed_since_resume 0
n1=$(checkpoints)
t=$SECONDS
scontrol requeue "$job" || fail "scontrol requeue $job failed"
echo "requeued job $job after $n1 checkpoint(s)"
until_ok 120 "the job's second start (restart count 1)" started 1
echo "second start $((SECONDS - t)) s after the requeue"

# 2. Second start: once it has checkpointed on its own, SIGUSR1 to the batch shell only.
until_ok 120 "a checkpoint of the second start" checkpointed_since_resume 1
n2=$(checkpoints)
t=$SECONDS
scancel --batch --signal=USR1 "$job" || fail "scancel --batch --signal=USR1 $job failed"
until_ok 120 "the job's third start (restart count 2)" started 2
echo "third start $((SECONDS - t)) s after SIGUSR1"

# 3. Third start runs to the end.
until_ok 300 "the job to complete" completed
info=$(scontrol show job "$job")
[[ $info == *"Restarts=2"* && $info == *"ExitCode=0:0"* ]] || fail "job record: $info"

/usr/bin/python3 - "$budget" "$n1" "$n2" <<'PY' || fail "the job did not resume and complete"
import json, os, re, sys
budget, n1, n2 = map(int, sys.argv[1:4])
ev = [json.loads(l) for l in open("run/metrics.jsonl")]
# One run per start of the job, each closed by its "done" event.
ends = [i + 1 for i, e in enumerate(ev) if e["event"] == "done"]
assert len(ends) == 3, f"{len(ends)} done events, expected 3 (one per start)"
runs = [ev[a:b] for a, b in zip([0] + ends[:-1], ends)]
ckpt = [[e for e in r if e["event"] == "checkpoint"] for r in runs]
resume = [[e for e in r if e["event"] == "resume"] for r in runs]
done = [r[-1] for r in runs]
assert [d["interrupted"] for d in done] == [True, True, False], done
assert resume[0] == [] and len(resume[1]) == 1 and len(resume[2]) == 1, resume
# The first start had n1 checkpoints when it was requeued, the first two n2 when SIGUSR1 came.
assert len(ckpt[0]) >= n1 >= 1 and len(ckpt[0]) + len(ckpt[1]) >= n2 > len(ckpt[0]), (n1, n2, ckpt)
for k in (1, 2):
    # Each start resumed from the newest checkpoint of the one before (the one it wrote when
    # told to stop, or its last periodic one).
    last, res = ckpt[k - 1][-1], resume[k][0]
    assert res["path"] == last["path"] and res["tokens"] == last["tokens"], (k, res, last)
for k, sig in ((0, 15), (1, 10)):
    stops = [e for e in runs[k] if e["event"] == "interrupted"]
    if stops:
        assert stops[0]["signal"] == sig, (k, stops)
# Tokens: the budget, counted once (no start from scratch, no double count).
tokens = done[2]["tokens"]
assert budget <= tokens <= budget * 1.05, (tokens, budget)
assert resume[2][0]["tokens"] > resume[1][0]["tokens"] > 0
final = ckpt[2][-1]["path"] if ckpt[2] else None
assert final and os.path.exists(os.path.join(final, "manifest.json")), final
out = open("job.out").read()
counts = re.findall(r"restart count (\d+),", out)
assert counts[:3] == ["0", "1", "2"], counts  # output appended across requeues
assert len(re.findall(r"no checkpoint", out)) == 1, "a later start found no checkpoint"
print(f"3 starts: resumed from {resume[1][0]['path'].split('/')[-1]} and "
      f"{resume[2][0]['path'].split('/')[-1]}, {tokens} tokens of a budget of {budget}")
PY
echo "slurm_requeue: passed"

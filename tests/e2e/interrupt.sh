# SIGTERM (what mpirun and Slurm send) ends a run at a step boundary: an "interrupted" event,
# the model saved, exit status 128+15 — on one rank and on a 2-rank unit.
source "$(dirname "$0")/lib/common.sh"
cd "$WORK"
for i in 1 2 3; do
  for j in $(seq 1 300); do echo "Sentence $j of text $i, long enough to give many batches."; done > "t$i.txt"
done
"$DDILOCO" prepare-data --source files --out text t1.txt t2.txt t3.txt >/dev/null
cat > run.yaml <<'YAML'
run: {log_every: 20, progress: false}  # mpirun stops draining stdout once it is told to stop: keep the console quiet
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 4, steps: 100000, warmup_steps: 5}
eval: {every_steps: 0, val_tokens: 1024, sample_tokens: 0}
YAML
check_interrupted() {  # dir rc
  [[ $2 == 143 ]] || fail "$1: exit status $2, expected 143"
  [[ $(json_field "$1/metrics.jsonl" interrupted signal) == 15 ]] || fail "$1: no interrupted event"
  /usr/bin/python3 - "$1/model.h5" <<'PY' || fail "$1: model not saved"
import h5py, json, sys
f = h5py.File(sys.argv[1], "r")
assert json.loads(f.attrs["metadata"])["interrupted"] is True
assert f["params/wte"].shape == (256, 32)
PY
}
"$DDILOCO" train --config run.yaml --set run.dir=one > one.log 2>&1 &
pid=$!
wait_for one/metrics.jsonl '"event":"train"' $pid
kill -TERM $pid
rc=0; wait $pid || rc=$?
check_interrupted one $rc
# Two ranks: mpirun forwards SIGTERM to both; they agree and stop at the same step. (mpirun
# itself in the background, not a shell function, so that $! is mpirun.)
"${DDILOCO_MPIRUN[@]}" -np 2 "$DDILOCO" train --config run.yaml --set run.dir=two > two.log 2>&1 &
pid=$!
wait_for two/metrics.jsonl '"event":"train"' $pid
kill -TERM $pid
rc=0; wait $pid || rc=$?
[[ $rc != 0 ]] || fail "mpirun exited 0 after SIGTERM"
[[ $(json_field two/metrics.jsonl interrupted signal) == 15 ]] || { cat two.log; fail "two ranks: no interrupted event"; }
echo "interrupt: all passed"

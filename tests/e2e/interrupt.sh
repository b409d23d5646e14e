# Stop signals end a run at a step boundary: SIGINT, SIGTERM and SIGUSR1 exit 130, 143 and 138,
# with one "interrupted" event naming the signal and the model saved at that step, on one rank
# and on a 2-rank unit. On two ranks both stop at the same step (the event's rank_steps),
# whichever rank got the signal: SIGINT goes to rank 1 only (the leader learns of it from the
# ranks' agreement), SIGTERM to both ranks (as Slurm sends it), SIGUSR1 to mpirun, which
# forwards it. (Open MPI's mpirun turns SIGINT and SIGTERM into a SIGTERM to the ranks, a
# SIGKILL 1 s later and exit status 1, so those two go to the ranks.)
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

# rank_pid MPIRUN_PID RANK: the pid of that rank of the job (a child of mpirun).
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    if grep -qzx "OMPI_COMM_WORLD_RANK=$2" "/proc/$p/environ" 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  fail "no rank $2 under mpirun $1"
}

# stop RANKS SIGNAL: a run until its first logged step, then SIGNAL; checks the exit status,
# the event and the model.
stop() {
  local ranks=$1 sig=$2 dir=${2,,}_$1 pid rc=0
  if [[ $ranks == 1 ]]; then
    "$DDILOCO" train --config run.yaml --set run.dir="$dir" > "$dir.log" 2>&1 &
  else  # mpirun itself in the background (not a shell function), so that $! is mpirun
    "${DDILOCO_MPIRUN[@]}" -np "$ranks" "$DDILOCO" train --config run.yaml --set run.dir="$dir" > "$dir.log" 2>&1 &
  fi
  pid=$!
  wait_for "$dir/metrics.jsonl" '"event":"train"' $pid
  case $ranks/$sig in
    1/*) kill -"$sig" $pid ;;
    2/INT) kill -INT "$(rank_pid $pid 1)" ;;
    2/TERM) kill -TERM "$(rank_pid $pid 0)" "$(rank_pid $pid 1)" ;;
    2/USR1) kill -USR1 $pid ;;
  esac
  # A stop takes a step; a job still running a minute later ignored the signal (a hang detector,
  # not a race: nothing else bounds a run of 100000 steps).
  local deadline=$((SECONDS + 60))
  while kill -0 $pid 2>/dev/null; do
    ((SECONDS < deadline)) || { cat "$dir.log"; fail "$dir: still running 60 s after SIG$sig"; }
    sleep 0.2
  done
  wait $pid || rc=$?
  local want=$((128 + $(kill -l "$sig")))
  [[ $rc == "$want" ]] || { cat "$dir.log"; fail "$dir: exit status $rc after SIG$sig, expected $want"; }
  /usr/bin/python3 - "$dir" "$(kill -l "$sig")" "$ranks" <<'PY' || { cat "$dir.log"; fail "$dir: not stopped as expected"; }
import h5py, json, sys
run, sig, ranks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ev = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
stops = [e for e in ev if e["event"] == "interrupted"]
assert len(stops) == 1 and not [e for e in ev if e["event"] == "done"], stops
stop = stops[0]
assert stop["signal"] == sig, stop
assert stop["step"] > 0 and stop["rank_steps"] == [stop["step"]] * ranks, stop  # every rank there
with h5py.File(f"{run}/model.h5", "r") as f:
    meta = json.loads(f.attrs["metadata"])
    assert meta["interrupted"] is True and meta["step"] == stop["step"], (meta, stop)
    assert f["params/wte"].shape == (256, 32)
print(f"{run}: signal {sig} -> stopped at step {stop['step']} on {ranks} rank(s), model saved")
PY
}
for ranks in 1 2; do
  for sig in INT TERM USR1; do stop $ranks $sig; done
done
echo "interrupt: all passed"

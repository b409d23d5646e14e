# Helpers for tests of `ddiloco launch` started in the background as $launcher, in $WORK with
# run.dir = run. A test defines show() (what to print when it fails).

# wait_launch SECONDS PYTHON-CONDITION: until the condition over the syncer's events (`ev`,
# `after_resume`: the restarted syncer's; common.sh, wait_event) holds; fails when the
# launcher ends or time runs out.
wait_launch() { wait_event run/metrics.jsonl "$launcher" "$1" "$2" || { show; fail "timed out waiting for: $2"; }; }

# The pid of the syncer process the launcher spawned last.
launch_syncer_pid() {
  /usr/bin/python3 -c "import json; print([json.loads(l) for l in open('run/launch.jsonl') if '\"spawn\"' in l and '\"syncer\"' in l][-1]['pid'])"
}

# Stops the launch with SIGUSR1; it must exit with the syncer's status for it (138).
stop_launch() {
  kill -USR1 "$launcher"
  local rc=0
  wait "$launcher" || rc=$?
  ((rc == 138)) || { show; fail "ddiloco launch exited $rc after SIGUSR1, expected 138 (the syncer's status)"; }
}

# Nothing outlives the launch: every process it spawned, and every rank that wrote a pid file.
launch_left_nothing() {
  local p
  for p in $(/usr/bin/python3 -c "import json; [print(json.loads(l)['pid']) for l in open('run/launch.jsonl') if '\"spawn\"' in l]") \
           $(cat run/pids/*.pid); do
    ! kill -0 "$p" 2>/dev/null || fail "process $p outlived the launch"
  done
}

# start_status_job: the status-page tests' job, started in the background (sets $launcher and
# show): two units of the small model, slowed 3× on one thread each so that the job leaves a
# client (a browser) a core, under `ddiloco launch` with an unbounded budget.
start_status_job() {
  make_text_shards text
  cat > c.yaml <<'YAML'
mode: decoupled
run: {dir: run, log_every: 10, progress: false, threads: 1}
model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 64}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 16, steps: 1000000, warmup_steps: 5}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2, slowdown: [3, 3]}
outer: {fragments: 2, h: 4, overlap: 1}
syncer: {quorum: 1, eval_every: 20, heartbeat_timeout_s: 2, connect_wait_s: 60}
checkpoint: {every: 200}
launch: {backoff_s: 0.5, drain_s: 20}
YAML
  "$DDILOCO" launch --config c.yaml > launch.log 2>&1 &
  launcher=$!
  show() { grep -v '^  ' launch.log | grep -v global_eval | tail -40; }
}

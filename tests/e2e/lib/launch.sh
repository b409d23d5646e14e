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

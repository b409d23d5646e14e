# A hostile peer against the syncer of each link mode (docs/security.md): a client written
# against UCX directly (tests/tools/hostile_ucx_client.cpp) connects to the syncer's address,
# sends no hello, and tries to read the syncer's memory (the address from /proc/PID/maps, the
# truth from /proc/PID/mem) and to write a pattern into it, with an rkey it packed itself.
#   - trusted: the attack reads the syncer's memory (its executable image). This is what the trusted mode is (and what
#     every mode was before the secure modes): the proof that the attack works, so that its
#     failure below means something;
#   - authenticated and encrypted (the default): it reads nothing and writes nothing, and the
#     two honest units go on merging (three more merges of each after the attack);
#   - a unit configured for another link mode is told so at once (exit 2);
#   - a captured hello replayed (a tap in front of the syncer records an honest unit's bytes and
#     plays them again to the syncer) and a wrong secret are refused; the syncer logs the
#     refusals in one rate-limited line each, and goes on.
# Every process the test starts ends with it.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
source "$(dirname "$0")/lib/link_job.sh"
HOSTILE="$(dirname "$DDILOCO")/tests/hostile_ucx_client"
[[ -x $HOSTILE ]] || fail "$HOSTILE is not built"
cd "$WORK"
make_text_shards text
for mode in trusted authenticated encrypted; do
  write_link_config $mode.yaml $mode run_$mode
  start_link_job $mode.yaml $mode $mode
  wait_event run_$mode/metrics.jsonl $syncer 120 \
    "all(sum(1 for e in ev if e['event'] == 'merge' and u in e['units']) >= 2 for u in (0, 1))" ||
    fail "$mode: the units were not merged"
  addr=$(/usr/bin/python3 -c "import json; print(json.load(open('run_$mode/syncer.addr'))['address'])")
  rc=0
  timeout 60 "$HOSTILE" "$addr" $syncer $([[ $mode == trusted ]] || echo --put) > hostile_$mode.log 2>&1 || rc=$?
  cat hostile_$mode.log
  ((rc != 77)) || { echo "SKIP: /proc/PID/mem cannot be read here"; exit 77; }
  if [[ $mode == trusted ]]; then
    ((rc == 1)) || fail "trusted: the hostile client did not reach the syncer's memory (rc $rc): the test's attack does not work"
  else
    ((rc == 0)) || fail "$mode: the hostile client reached the syncer's memory (rc $rc)"
    before0=$(merges_of run_$mode 0); before1=$(merges_of run_$mode 1)
    wait_event run_$mode/metrics.jsonl $syncer 120 \
      "sum(1 for e in ev if e['event'] == 'merge' and 0 in e['units']) >= $before0 + 3 and sum(1 for e in ev if e['event'] == 'merge' and 1 in e['units']) >= $before1 + 3" ||
      fail "$mode: the honest units stopped merging after the attack"
  fi
  if [[ $mode == authenticated ]]; then
    # A wrong secret: refused before any hello is read, with one line; the syncer goes on.
    mkdir -p wrong && cp run_$mode/syncer.addr wrong/ && echo "0000000000000000ffffffffffffffff" > wrong/syncer.secret
    chmod 600 wrong/syncer.secret
    rc=0
    "${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit --config $mode.yaml --unit 0 --set run.dir=wrong \
      --set syncer.connect_wait_s=3 > wrong.log 2>&1 || rc=$?
    ((rc != 0)) || fail "a unit with a wrong secret was admitted"
    grep -q "secret" wrong.log || { cat wrong.log; fail "the wrong-secret failure does not say so"; }
    wait_for syncer_$mode.log "refused a connection: not authenticated" $syncer 30
    # A unit of another link mode is told so at once, not after connect_wait_s.
    rc=0
    timeout 30 "${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit --config $mode.yaml --unit 0 --set wan.security=encrypted \
      > other_mode.log 2>&1 || rc=$?
    ((rc == 2)) || { cat other_mode.log; fail "a unit of another link mode exited $rc, expected 2"; }
    grep -q "the syncer listens with link authenticated.*would speak encrypted" other_mode.log ||
      { cat other_mode.log; fail "the link-mode mismatch is not named"; }
    # A replayed hello: python3 tests/tools/replay_hello.py records an honest unit's first
    # bytes through a tap and plays them to the syncer on a new connection.
    rc=0
    /usr/bin/python3 "$SRC/tests/tools/replay_hello.py" "$addr" -- "${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit \
      --config $mode.yaml --unit 0 > replay.log 2>&1 || rc=$?
    cat replay.log
    ((rc == 0)) || fail "the replay check failed (rc $rc)"
    kill -0 $syncer || fail "the syncer died after the refusals"
  fi
  kill -TERM $syncer
  rc=0; wait $syncer || rc=$?
  ((rc == 143)) || { tail -20 syncer_$mode.log; fail "$mode: the syncer exited $rc after SIGTERM, expected 143"; }
  for p in $unit0 $unit1; do wait $p || true; done
  for p in $syncer $unit0 $unit1; do ! kill -0 $p 2>/dev/null || fail "process $p outlived the test's $mode run"; done
  echo "ok: $mode"
done

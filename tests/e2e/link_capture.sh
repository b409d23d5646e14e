# What an eavesdropper on the link sees (docs/security.md): a tap (tests/tools/tap.py) between
# the units and the syncer records every byte of a short training run with raw fp32 snapshots
# (wan.format: fp32), once per secure mode; tests/tools/find_in_capture.py then looks in the
# capture for every 16-byte run of Θ (model.h5 and the checkpoints taken every 4 merges) and
# for the run's secret.
#   - authenticated: Θ is there in clear (the proof that the search sees what crosses the
#     link); the secret is not (the handshake sends HMACs, never the secret);
#   - encrypted: no 16-byte run of Θ and no secret.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
make_text_shards text
for mode in authenticated encrypted; do
  cat > $mode.yaml <<YAML
mode: decoupled
run: {dir: run_$mode, log_every: 20, progress: false, threads: 1}
model: {n_layer: 1, n_head: 2, n_embd: 32, seq_len: 32}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 8, steps: 60, warmup_steps: 5}
eval: {val_tokens: 256, sample_tokens: 0}
units: {count: 2, ranks: [1, 1]}
outer: {fragments: 2, h: 4}
syncer: {quorum: 1, eval_every: 1000, connect_wait_s: 60}
wan: {security: $mode, format: fp32}
checkpoint: {every: 4, keep: 1000, every_s: 0, at_stop: false}
YAML
  "$DDILOCO" syncer --config $mode.yaml > syncer_$mode.log 2>&1 &
  syncer=$!
  wait_for syncer_$mode.log "listening on .*link $mode" $syncer 60
  addr=$(/usr/bin/python3 -c "import json; print(json.load(open('run_$mode/syncer.addr'))['address'])")
  /usr/bin/python3 "$SRC/tests/tools/tap.py" "$addr" tap_$mode.port cap_$mode &
  tap=$!
  for _ in $(seq 100); do [[ -s tap_$mode.port ]] && break; sleep 0.1; done
  [[ -s tap_$mode.port ]] || fail "the tap did not start"
  units=()
  for u in 0 1; do
    "${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit --config $mode.yaml --unit $u \
      --set syncer.address="$(cat tap_$mode.port)" > unit${u}_$mode.log 2>&1 &
    units+=($!)
  done
  rc=0; wait $syncer || rc=$?
  ((rc == 0)) || { tail -20 syncer_$mode.log; fail "$mode: the syncer exited $rc"; }
  for p in "${units[@]}"; do wait $p || fail "$mode: a unit failed"; done
  kill -TERM $tap; wait $tap || true
  grep -q '"event":"merge"' run_$mode/metrics.jsonl || fail "$mode: nothing was merged"
  found=$(/usr/bin/python3 "$SRC/tests/tools/find_in_capture.py" --secret run_$mode/syncer.secret \
    --theta run_$mode/model.h5 run_$mode/checkpoints/*/*.h5 --capture cap_$mode/*)
  echo "$mode: $found"
  /usr/bin/python3 - "$mode" "$found" <<'PY' || fail "$mode: the capture shows what it must not (or the search is blind)"
import json, sys
mode, f = sys.argv[1], json.loads(sys.argv[2])
assert f["bytes_scanned"] > 0
assert not f["secret_seen"], "the secret crossed the link"
if mode == "authenticated":
    assert f["found"] > 0, "no run of Θ in a clear capture: the search cannot see Θ"
else:
    assert f["found"] == 0, f"{f['found']} runs of 16 bytes of Θ crossed in clear"
PY
done

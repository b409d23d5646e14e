# A small two-unit job over the unit ↔ syncer link in one mode, for the link's e2e tests
# (link_hostile.sh, link_flood.sh). Needs common.sh (wait_for) and text shards in ./text.

# write_link_config FILE MODE RUN_DIR: a decoupled job of two 1-rank units that trains until
# stopped, quorum 1, wan.security MODE.
write_link_config() {
  cat > "$1" <<YAML
mode: decoupled
run: {dir: $3, log_every: 20, progress: false, threads: 1}
model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 64}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 8, steps: 1000000, warmup_steps: 5}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2, ranks: [1, 1]}
outer: {fragments: 2, h: 4}
syncer: {quorum: 1, eval_every: 1000, heartbeat_timeout_s: 5, connect_wait_s: 60}
wan: {security: $2}
checkpoint: {at_stop: false}
YAML
}

# start_link_job CONFIG MODE TAG: the syncer (log syncer_TAG.log), once it listens in MODE, then
# units 0 and 1 (unitU_TAG.log). Sets $syncer, $unit0 and $unit1 to their pids.
start_link_job() {
  "$DDILOCO" syncer --config "$1" > "syncer_$3.log" 2>&1 &
  syncer=$!
  wait_for "syncer_$3.log" "listening on .*link $2" $syncer 60
  local u
  for u in 0 1; do
    "${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit --config "$1" --unit $u > "unit${u}_$3.log" 2>&1 &
    eval "unit$u=\$!"
  done
}

# merges_of RUN_DIR UNIT: merges that included UNIT so far.
merges_of() {
  /usr/bin/python3 -c "import json,sys; print(sum(1 for l in open(sys.argv[1]) if l.endswith('\n') and (e:=json.loads(l))['event']=='merge' and int(sys.argv[2]) in e['units']))" "$1/metrics.jsonl" "$2"
}

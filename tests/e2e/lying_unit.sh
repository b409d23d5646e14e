# Units that lie (issue 34, docs/security.md "A unit that holds the secret"): a process that
# holds the run's secret and is admitted like any unit (tests/tools/lying_unit.cpp) joins two
# honest units of an isolated decoupled job and speaks the protocol wrongly in one way per run:
# sizes that do not match the layout, a sequence number that goes back, a base version from the
# future, a reference version never sent, token counters that cannot be (2^62 tokens in one
# step), a checksum of other data, values far outside any step (Θ ± 1e30 and ± 3e38).
# For each, against a run of the two honest units alone (the third unit never comes):
#   - its snapshots are refused, each with one snapshot_rejected line naming why (values: the
#     merges that took it name it in outer_grads_clipped, syncer.max_outer_grad_ratio);
#   - both honest units merge at least 3 more times after its first lie, and the job ends;
#   - Θ stays finite, and the final val_loss is at most 0.25 nats above the honest-only run's
#     where every lie is refused, 0.6 where the values are merged scaled down (docs/security.md).
#     3000 inner steps: the model is then past its early plateau in every run (honest-only runs
#     end within 0.981..0.993); at 1500 some runs were still leaving it (0.99..1.35), and the
#     comparison measured that, not the lie. Run that long, the "future" lie found a hole: a
#     base version Θ had since reached was taken (docs/results.md "Units that lie");
#   - the syncer's peak resident memory stays within 64 MiB of the honest-only run's.
# Every process the test starts ends with it.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
LIAR="$(dirname "$DDILOCO")/tests/lying_unit"
[[ -x $LIAR ]] || fail "$LIAR is not built"
cd "$WORK"
make_text_shards text

write_config() {  # FILE RUN_DIR
  cat > "$1" <<YAML
mode: decoupled
run: {dir: $2, log_every: 50, progress: false, threads: 1}
model: {n_layer: 1, n_head: 2, n_embd: 32, seq_len: 32}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 4, steps: 3000, warmup_steps: 5}
eval: {val_tokens: 2048, sample_tokens: 0}
units: {count: 3, ranks: [1, 1, 1]}
outer: {fragments: 2, h: 4}
syncer: {quorum: 1, eval_every: 100000, heartbeat_timeout_s: 3, connect_wait_s: 60}
wan: {format: int8}
checkpoint: {at_stop: false}
YAML
}

# run_job TAG [LIE]: the syncer, units 0 and 1, and the liar as unit 2 when LIE is given; waits
# for the job's end and records the syncer's peak RSS (KiB) in peak_TAG.
run_job() {
  local tag=$1 lie=${2:-}
  write_config $tag.yaml run_$tag
  "$DDILOCO" syncer --config $tag.yaml > syncer_$tag.log 2>&1 &
  local syncer=$!
  wait_for syncer_$tag.log "listening on" $syncer 60
  local pids=()
  for u in 0 1; do
    "${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit --config $tag.yaml --unit $u > unit${u}_$tag.log 2>&1 &
    pids+=($!)
  done
  if [[ -n $lie ]]; then
    "$LIAR" --config $tag.yaml --unit 2 --lie $lie --after 4 --period-ms 50 > liar_$tag.log 2>&1 &
    pids+=($!)
  fi
  local peak=0 deadline=$((SECONDS + 300))
  while kill -0 $syncer 2>/dev/null; do
    ((SECONDS < deadline)) || { tail -5 syncer_$tag.log; fail "$tag: the job did not end within 300 s"; }
    local hwm
    hwm=$(awk '/^VmHWM:/ {print $2}' /proc/$syncer/status 2>/dev/null || true)
    [[ -n $hwm ]] && ((hwm > peak)) && peak=$hwm
    sleep 0.2
  done
  wait $syncer || { tail -20 syncer_$tag.log; fail "$tag: the syncer failed"; }
  for p in "${pids[@]}"; do wait $p || { tail -n 5 unit*_$tag.log liar_$tag.log 2>/dev/null || true; fail "$tag: a unit failed"; }; done
  echo $peak > peak_$tag
}

run_job honest
for lie in ${DDILOCO_LIES:-size backwards future reference counters checksum values}; do
  run_job $lie $lie
  cat liar_$lie.log
  LIE=$lie /usr/bin/python3 - <<'PY' || fail "$lie: not refused, or the honest units were held up"
import json, math, os, re
lie = os.environ["LIE"]
ev = [json.loads(l) for l in open(f"run_{lie}/metrics.jsonl")]
base = [json.loads(l) for l in open("run_honest/metrics.jsonl")]
merges = [e for e in ev if e["event"] == "merge"]
rejected = [e for e in ev if e["event"] == "snapshot_rejected" and e["unit"] == 2]
lies = int(re.search(r"published (\d+) lies", open(f"liar_{lie}.log").read()).group(1))
assert lies >= 1, f"the liar published no lie"
expect = {"size": r"announced \d+ bytes, expected", "backwards": r"is below the last consumed",
          "future": r"base version \d+ outside", "reference": r"reference version 999999 is not held",
          "counters": r"token counters", "checksum": r"checksum mismatch"}
if lie in expect:
    assert rejected, "no snapshot_rejected line for the liar"
    for e in rejected:
        assert re.search(expect[lie], e["reason"]), e
    # One line per snapshot refused, never a flood.
    assert len(rejected) <= lies, (len(rejected), lies)
if lie == "values":
    took = [m for m in merges if 2 in m["units"]]
    assert took and all(2 in m["outer_grads_clipped"] for m in took), took[:2]
# The honest units merged on after the liar's first lie.
first = min([e["elapsed_s"] for e in rejected] + [m["elapsed_s"] for m in merges if 2 in m["units"]])
for u in (0, 1):
    n = sum(1 for m in merges if u in m["units"] and m["elapsed_s"] > first)
    assert n >= 3, f"unit {u} merged {n} times after the first lie"
done = next(e for e in ev if e["event"] == "done")
honest = next(e for e in base if e["event"] == "done")
assert math.isfinite(done["val_loss"]), done["val_loss"]
gap = done["val_loss"] - honest["val_loss"]
clipped = sum(1 for e in base if e["event"] == "merge" and e["outer_grads_clipped"])
if lie == "size":
    print(f"honest only: {clipped} of {sum(1 for e in base if e['event'] == 'merge')} merges scaled an honest unit down")
print(f"{lie}: lies {lies}, refused {len(rejected)}, merges {len(merges)}, val_loss {done['val_loss']:.4f} "
      f"(honest only {honest['val_loss']:.4f}, gap {gap:+.4f})")
# Two honest-only runs differ by up to 0.12 here (asynchronous merges): one-sided bounds.
bound = 0.6 if lie == "values" else 0.25  # docs/security.md: what a unit that lies can cost
assert gap <= bound, f"val_loss {done['val_loss']} is {gap:+.4f} from the honest-only run's {honest['val_loss']}"
PY
  peak=$(cat peak_$lie) honest_peak=$(cat peak_honest)
  echo "$lie: syncer peak RSS ${peak} KiB (honest only ${honest_peak} KiB)"
  ((peak <= honest_peak + 65536)) || fail "$lie: the syncer's peak RSS grew from $honest_peak KiB to $peak KiB"
done
echo "PASS"

# Liveness: with quorum K = 3 of 3, a unit that stops reporting (test hook: it stalls,
# silent, until 4 merges exist) would block every merge; after syncer.heartbeat_timeout_s it
# is out of the quorum, the other two are merged, and once it reports again it is back in.
# The budget is unbounded: the job is stopped (SIGUSR1) once unit 2 is back and merged, so no
# speed of the machine can end it before the timeout.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
make_text_shards text
cat > h.yaml <<'YAML'
mode: decoupled
run: {dir: h, log_every: 5, progress: false}
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 2, steps: 1000000000, warmup_steps: 2}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 3}
outer: {fragments: 1, h: 2, overlap: 1}
syncer: {quorum: 3, eval_every: 100, heartbeat_timeout_s: 0.5}
debug: {stall_unit: 2, stall_at_step: 1, stall_until_merges: 4}
YAML
# mpirun itself in the background (not a shell function), so that $! is mpirun, which forwards
# SIGUSR1 to every rank.
"${DDILOCO_MPIRUN[@]}" -np 4 "$DDILOCO" train --config h.yaml > h.log 2>&1 &
pid=$!
wait_event h/metrics.jsonl $pid 120 \
  "last('unit_back') >= 0 and any(e['event'] == 'merge' and 2 in e['units'] for e in ev[last('unit_back'):])" ||
  { cat h.log; fail "unit 2 was not back and merged"; }
kill -USR1 $pid
rc=0; wait $pid || rc=$?
((rc == 138)) || { cat h.log; fail "the job exited $rc after SIGUSR1, expected 138"; }
/usr/bin/python3 - <<'PY' || fail "heartbeat timeout not as expected"
import json
ev = [json.loads(l) for l in open("h/metrics.jsonl")]
assert [e["interrupted"] for e in ev if e["event"] == "done"] == [True], "no done event of a stopped job"
silent = [e for e in ev if e["event"] == "unit_silent"]
back = [e for e in ev if e["event"] == "unit_back"]
assert [e["unit"] for e in silent] == [2], silent
assert [e["unit"] for e in back] == [2], back
merges = [e for e in ev if e["event"] == "merge"]
before = [m for m in merges if m["elapsed_s"] < silent[0]["elapsed_s"]]
assert not before, before  # K = 3: nothing merged while unit 2 still counted
during = [m for m in merges if silent[0]["elapsed_s"] <= m["elapsed_s"] <= back[0]["elapsed_s"]]
assert len(during) >= 4 and all(sorted(m["units"]) == [0, 1] for m in during), during
after = [m for m in merges if m["elapsed_s"] > back[0]["elapsed_s"]]
assert any(2 in m["units"] for m in after), after
print(f"unit 2 silent at {silent[0]['elapsed_s']:.2f}s, {len(during)} merges of units 0 and 1, "
      f"back at {back[0]['elapsed_s']:.2f}s, then in {sum(2 in m['units'] for m in after)} merges")
PY
echo "runtime_heartbeat: passed"

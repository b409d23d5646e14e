# The isolated deployment by hand (docs/deployments.md "Fault isolation"): the syncer and each unit are
# their own processes, started in any order; a unit whose leader is killed with SIGKILL stops
# nobody, and a new process of it rejoins. Checked, with real processes and signals:
#   - a unit started before the syncer waits for it, then joins;
#   - a unit with another model shape, and a second live process of a unit, are refused with
#     one line naming both sides' values (the duplicate after retrying while the holder
#     might be a dead process not yet noticed), and the syncer goes on;
#   - kill -9 of unit 0's leader mid-round: the syncer logs unit_lost and merges on with unit 1
#     (no gap between merges longer than twice the nominal fragment period); a new process of
#     unit 0 joins (unit_connected, restart 1), is merged again (unit_joined with heal_s);
#   - once unit 0 is merged again, SIGTERM to the syncer stops the job (its budget is
#     unbounded: every step of this test waits for an event, none races the wall clock): the
#     syncer exits 143, the units stop when it tells them and exit 0, Θ is finite, and every
#     process the test started has ended (checked by pid).
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
make_text_shards text
cat > c.yaml <<'YAML'
mode: decoupled
run: {dir: run, log_every: 20, progress: false, threads: 1}
model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 64}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 16, steps: 1000000, warmup_steps: 5}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2, ranks: [1, 2], slowdown: [3, 3]}
outer: {fragments: 2, h: 4, overlap: 1}
syncer: {quorum: 1, eval_every: 10, heartbeat_timeout_s: 2, connect_wait_s: 60}
checkpoint: {at_stop: false}
YAML
pids=()
track() { pids+=("$1"); }
# Unit 1 (two ranks) first: it waits for the syncer's rendezvous file with backoff.
"${DDILOCO_MPIRUN[@]}" -np 2 "$DDILOCO" unit --config c.yaml --unit 1 > unit1.log 2>&1 &
u1=$!; track $u1
wait_for unit1.log "unit 1: waiting for the syncer (no rendezvous file" $u1 60
"$DDILOCO" syncer --config c.yaml > syncer.log 2>&1 &
syncer=$!; track $syncer
wait_for run/metrics.jsonl '"event":"unit_connected".*"unit":1[,}]' $syncer 60
"${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit --config c.yaml --unit 0 > unit0.log 2>&1 &
u0=$!; track $u0
wait_for run/metrics.jsonl '"event":"unit_connected".*"unit":0[,}]' $syncer 60

# Refusals: the syncer names both sides and goes on.
rc=0
"${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit --config c.yaml --unit 0 --set model.n_embd=32 \
  > shape.log 2>&1 || rc=$?
((rc != 0)) || fail "a unit with another model shape was not refused"
grep -q "n_embd=32.*n_embd=64" shape.log || { cat shape.log; fail "the refusal does not name both shapes"; }
rc=0
"${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit --config c.yaml --unit 0 > dup.log 2>&1 || rc=$?
((rc != 0)) || fail "a second live process of unit 0 was not refused"
grep -q "already held by a live process" dup.log || { cat dup.log; fail "duplicate refusal unclear"; }
# The duplicate tries again while the holder might be a dead process not yet noticed (longer
# than syncer.heartbeat_timeout_s, and 5 s), then gives up: one shape refusal, several of it.
n=$(grep -c '"event":"unit_refused"' run/metrics.jsonl)
((n >= 3)) || fail "expected the shape refusal and repeated duplicate refusals, got $n unit_refused events"
kill -0 $syncer || fail "the syncer died after refusing units"

# kill -9 of unit 0's leader once it has been merged a few times.
wait_event run/metrics.jsonl $syncer 60 "sum(1 for e in ev if e['event'] == 'merge' and 0 in e['units']) >= 3" ||
  fail "unit 0 was not merged before the kill"
leader=$(cat run/pids/unit0.rank0.pid)
kill -0 "$leader" || fail "unit 0's leader $leader is not running"
kill -KILL "$leader"
rc=0; wait $u0 || rc=$?
((rc != 0)) || fail "unit 0's mpirun exited 0 after its leader was killed"
wait_for run/metrics.jsonl '"event":"unit_lost".*"unit":0[,}]' $syncer 30
# Unit 1 trains and is merged alone meanwhile.
wait_event run/metrics.jsonl $syncer 60 \
  "any(e['event'] == 'merge' and e['units'] == [1] for e in ev[last('unit_lost'):])" ||
  fail "unit 1 was not merged alone after unit 0 was lost"
DDILOCO_RESTART=1 "${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit --config c.yaml --unit 0 > unit0b.log 2>&1 &
u0b=$!; track $u0b
wait_for run/metrics.jsonl '"event":"unit_joined".*"unit":0[,}]' $syncer 60
wait_event run/metrics.jsonl $syncer 60 \
  "sum(1 for e in ev[last('unit_joined'):] if e['event'] == 'merge' and 0 in e['units']) >= 3" ||
  fail "unit 0 was not merged again after it joined"

kill -TERM $syncer
rc=0; wait $syncer || rc=$?
((rc == 143)) || { tail -20 syncer.log; fail "the syncer exited $rc after SIGTERM, expected 143"; }
for p in $u1 $u0b; do
  rc=0; wait $p || rc=$?
  ((rc == 0)) || { tail -20 unit1.log unit0b.log; fail "a unit job exited $rc"; }
done
/usr/bin/python3 - <<'PY' || { tail -30 syncer.log; fail "the isolated deployment's run is wrong"; }
import json, math, h5py, numpy as np
ev = [json.loads(l) for l in open("run/metrics.jsonl")]
def one(name, **kw):
    xs = [e for e in ev if e["event"] == name and all(e.get(k) == v for k, v in kw.items())]
    assert len(xs) == 1, (name, kw, xs)
    return xs[0]
# Lost when its endpoint failed (a heartbeat loss, a slow step on a loaded machine, may come too).
lost = [e for e in ev if e["event"] == "unit_lost" and e["unit"] == 0 and not e["reason"].startswith("heartbeat")]
assert len(lost) == 1 and lost[0]["reason"], lost
lost = lost[0]
conn = [e for e in ev if e["event"] == "unit_connected" and e["unit"] == 0]
assert [c["restart"] for c in conn] == [0, 1], conn
joined = one("unit_joined", unit=0)
assert joined["restart"] == 1 and 0 < joined["heal_s"] < 60, joined
assert joined["heal_s"] >= conn[1]["elapsed_s"] - lost["elapsed_s"], (joined, lost, conn)
merges = [e for e in ev if e["event"] == "merge"]
alone = [m for m in merges if lost["elapsed_s"] < m["elapsed_s"] < conn[1]["elapsed_s"]]
assert alone and all(m["units"] == [1] for m in alone), alone
after = [m for m in merges if m["elapsed_s"] > joined["elapsed_s"] and 0 in m["units"]]
assert after, "unit 0 never merged again"
done = one("done")
assert done["interrupted"] and done["tokens"] > joined["tokens"], done
assert done["unit_restarts"] == 1 and done["heal_s_max"] == joined["heal_s"], done
# Each gap against twice the nominal period as the syncer measured it then (the bound of its
# own global downtime).
pairs = [(b["elapsed_s"] - a["elapsed_s"], b["period_s"]) for a, b in zip(merges, merges[1:])
         if lost["elapsed_s"] - 1 < a["elapsed_s"] < joined["elapsed_s"]]
worst = max(pairs, key=lambda g: g[0] / g[1])
assert worst[0] <= 2 * worst[1], worst
gaps, period = [g for g, _ in pairs], worst[1]
# Unit 0's time book covers its whole life: the killed process's (as it stood at its last
# step), the time no process of it was there (down), and its new process's.
gp = {e["unit"]: e for e in ev if e["event"] == "goodput"}
life = done["train_s"] - conn[0]["elapsed_s"]
assert gp[0]["allocated_s"] >= 0.95 * life, (gp[0], life)
assert gp[0]["down_s"] >= conn[1]["elapsed_s"] - lost["elapsed_s"] - 0.1, (gp[0], lost, conn)
with h5py.File("run/model.h5") as f:
    for name, d in f["params"].items():
        assert np.isfinite(d[...]).all(), name
starts = [json.loads(l) for l in open("run/unit_0.jsonl") if '"event":"start"' in l]
assert [s["restart"] for s in starts] == [0, 1] and all(s["pid"] > 0 and s["host"] for s in starts), starts
print(f"unit 0's books: {gp[0]['allocated_s']:.1f} rank-s allocated over its {life:.1f} s, "
      f"{gp[0]['down_s']:.1f} down, goodput {100 * gp[0]['goodput']:.1f} %")
print(f"unit 0 lost at {lost['elapsed_s']:.1f}s ({lost['reason']}), back at {conn[1]['elapsed_s']:.1f}s, "
      f"heal {joined['heal_s']:.2f}s; {len(alone)} merges without it, longest gap {max(gaps):.2f}s "
      f"(2 x period {2 * period:.2f}s); final val_loss {done['val_loss']:.3f}")
PY
# Every process this test started has ended (mpirun and its ranks, by their pid files too).
for p in "${pids[@]}" $(cat run/pids/*.pid); do
  ! kill -0 "$p" 2>/dev/null || fail "process $p outlived the test"
done
echo "isolated_deployment: passed"

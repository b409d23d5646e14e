# Partitions between data centres that heal (docs/deployments.md "Several hosts"): the syncer and two units
# in their own network namespaces, joined by veth links (tests/e2e/lib/hosts.sh); the links
# are cut with `ip link set ... down`, and every process stays alive throughout. Checked:
#   1. unit 1 cut until the syncer declares it lost for its heartbeat, then restored at once:
#      unit 0 is merged all along (no gap longer than the heartbeat timeout plus two
#      periods); unit 1 comes back (unit_back) without a new connection, and the snapshot it
#      made before the cut, now further behind Θ than syncer.max_staleness, is refused
#      (snapshot_rejected) instead of merged; its next ones are merged;
#   2. unit 1 cut until its link times out (syncer.link_timeout_s: the syncer closes the
#      connection), then restored: the unit, which trained on meanwhile (same pid, more steps),
#      reconnects by itself with backoff, takes Θ from the syncer (rejoin) and is merged again;
#   3. the syncer cut from every unit at once past the link timeout, then restored: both
#      units reconnect by themselves and are merged again.
# No split brain: every version a unit took at a join or rejoin is one the syncer sent.
# Skipped (77) where network namespaces cannot be made (not root, no CAP_NET_ADMIN).
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
source "$(dirname "$0")/lib/hosts.sh"
cd "$WORK"
hosts_add syncer 1
hosts_add unit0 10
hosts_add unit1 11
hosts_env
make_text_shards text
cat > c.yaml <<YAML
mode: decoupled
run: {dir: run, log_every: 10, progress: false, threads: 1}
model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 64}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 16, steps: 1000000, warmup_steps: 5}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2, slowdown: [3, 3]}
outer: {fragments: 2, h: 4, overlap: 1}
syncer: {quorum: 1, eval_every: 50, heartbeat_timeout_s: 2, link_timeout_s: 8, max_staleness: 4,
         connect_wait_s: 60, listen: "$(host_ip syncer):0"}
checkpoint: {at_stop: false}
YAML
start_on syncer "$DDILOCO" syncer --config c.yaml > syncer.log 2>&1
syncer=$!
for u in 0 1; do
  start_on unit$u "${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit --config c.yaml --unit $u > unit$u.log 2>&1
  eval "job$u=$!"
done
M=run/metrics.jsonl
# ev index of the last event matching name/unit/reason fragment (python helpers for wait_event).
merged_after() {  # merged_after UNIT N: N merges with UNIT after the last event the test marked
  echo "sum(1 for e in ev[mark:] if e['event'] == 'merge' and $1 in e['units']) >= $2"
}
wait_event $M $syncer 60 "$(merged_after 1 3 | sed 's/mark/0/')" || fail "unit 1 was never merged"

# 1. A short partition: lost for the heartbeat, back on the same connection.
mark=$(wc -l < $M)
link_down unit1
wait_event $M $syncer 30 "any(e['event'] == 'unit_lost' and e['unit'] == 1 and e['reason'].startswith('heartbeat') for e in ev[$mark:])" ||
  fail "the syncer did not lose unit 1 for its heartbeat while its link was down"
link_up unit1
wait_event $M $syncer 30 "any(e['event'] == 'unit_back' and e['unit'] == 1 for e in ev[$mark:])" ||
  fail "unit 1 did not come back after its link was restored"
wait_event $M $syncer 30 "$(merged_after 1 3 | sed "s/mark/$mark/")" || fail "unit 1 was not merged again after the short partition"
short_end=$(wc -l < $M)

# 2. A long partition: the syncer closes the link; the unit reconnects by itself.
mark=$(wc -l < $M)
steps_before=$(grep -c '"event":"train"' run/unit_1.jsonl)
link_down unit1
wait_event $M $syncer 60 "any(e['event'] == 'unit_lost' and e['unit'] == 1 and 'timed out' in e['reason'] for e in ev[$mark:])" ||
  fail "the syncer did not close unit 1's link after syncer.link_timeout_s"
steps_cut=$(grep -c '"event":"train"' run/unit_1.jsonl)
link_up unit1
wait_event $M $syncer 60 "any(e['event'] == 'unit_connected' and e['unit'] == 1 for e in ev[$mark:])" ||
  { tail unit1.log; fail "unit 1 did not reconnect after its link was restored"; }
wait_event $M $syncer 30 "$(merged_after 1 3 | sed "s/mark/$mark/")" || fail "unit 1 was not merged again after the long partition"
((steps_cut > steps_before)) || fail "unit 1 did not train while it was cut off ($steps_before → $steps_cut train logs)"
long_end=$(wc -l < $M)

# 3. The syncer cut from everyone.
mark=$(wc -l < $M)
link_down syncer
wait_event $M $syncer 60 "all(any(e['event'] == 'unit_lost' and e['unit'] == u and 'timed out' in e['reason'] for e in ev[$mark:]) for u in (0, 1))" ||
  fail "the syncer did not lose both units while it was cut off"
link_up syncer
wait_event $M $syncer 60 "all(any(e['event'] == 'unit_connected' and e['unit'] == u for e in ev[$mark:]) for u in (0, 1))" ||
  fail "the units did not reconnect after the syncer's link was restored"
wait_event $M $syncer 30 "$(merged_after 0 3 | sed "s/mark/$mark/") and $(merged_after 1 3 | sed "s/mark/$mark/")" ||
  fail "the units were not merged again after the syncer's partition"

kill -TERM $syncer
rc=0; wait $syncer || rc=$?
((rc == 143)) || { tail -20 syncer.log; fail "the syncer exited $rc after SIGTERM, expected 143"; }
for u in 0 1; do
  pid=$(eval echo \$job$u)
  deadline=$((SECONDS + 90))
  while kill -0 "$pid" 2>/dev/null; do
    ((SECONDS < deadline)) || { tail -20 unit$u.log; tail -5 run/unit_$u.jsonl; fail "unit $u did not stop after the syncer did"; }
    sleep 0.2
  done
  rc=0; wait "$pid" || rc=$?
  ((rc == 0)) || { tail -20 unit$u.log; fail "unit $u's job exited $rc"; }
done

/usr/bin/python3 - "$short_end" "$long_end" <<'PY' || { tail -30 syncer.log; fail "the partitions' record is wrong"; }
import json, sys
short_end, long_end = int(sys.argv[1]), int(sys.argv[2])
ev = [json.loads(l) for l in open("run/metrics.jsonl")]
merges = [e for e in ev if e["event"] == "merge"]
# 1. While unit 1 was cut (first heartbeat loss → unit_back), unit 0 was merged on: no gap
# longer than the heartbeat timeout plus two of the syncer's periods.
lost = next(e for e in ev if e["event"] == "unit_lost" and e["unit"] == 1)
back = next(e for e in ev if e["event"] == "unit_back" and e["unit"] == 1)
during = [m for m in merges if lost["elapsed_s"] - 3 <= m["elapsed_s"] <= back["elapsed_s"]]
assert during and all(m["units"] == [0] for m in during if m["elapsed_s"] > lost["elapsed_s"]), during
gaps = [(b["elapsed_s"] - a["elapsed_s"], b["period_s"]) for a, b in zip(during, during[1:])]
worst = max(gaps, key=lambda g: g[0] - 2 * g[1])
assert worst[0] <= 2 + 2 * worst[1], f"a gap of {worst[0]:.2f} s between merges during the partition"
# Its snapshot from before the cut was refused for its staleness, not merged.
refused = [e for e in ev[:short_end] if e["event"] == "snapshot_rejected" and e["unit"] == 1]
assert any("exceeds syncer.max_staleness = 4" in e["reason"] for e in refused), refused
late = [m for m in merges if m["elapsed_s"] > back["elapsed_s"] and 1 in m["units"]]
assert late and all(s <= 4 for m in late for s, u in zip(m["staleness"], m["units"]) if u == 1), late[:3]
# 2. and 3.: the same processes reconnected (no restart: the pid is the first one's).
conn = [e for e in ev if e["event"] == "unit_connected"]
for u in (0, 1):
    pids = {e["pid"] for e in conn if e["unit"] == u}
    assert len(pids) == 1, (u, pids)
assert sum(e["unit"] == 1 for e in conn) == 3 and sum(e["unit"] == 0 for e in conn) == 2, conn
# No split brain: every version a unit took at a join or rejoin was sent by the syncer.
sent = {(m["fragment"], m["version"]) for m in merges}
sent |= {(p, v) for e in ev if e["event"] == "rejoin" for p, v in enumerate(e["versions"])}
for u in (0, 1):
    for line in open(f"run/unit_{u}.jsonl"):
        e = json.loads(line)
        for p, v in enumerate(e.get("versions", [])):
            assert v == 0 or (p, v) in sent, (u, e)
print(f"short partition: unit 1 lost at {lost['elapsed_s']:.1f} s, back at {back['elapsed_s']:.1f} s, "
      f"{len(during)} merges of unit 0 meanwhile, longest gap {worst[0]:.2f} s; refused: {refused[0]['reason']}")
for e in ev:
    if e["event"] in ("unit_lost", "unit_connected", "unit_joined"):
        print(f"  {e['elapsed_s']:7.2f} s {e['event']:15} unit {e['unit']} {e.get('reason', e.get('heal_s', ''))}")
PY
echo "netns_partition: passed"

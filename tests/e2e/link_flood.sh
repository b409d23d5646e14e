# A flood against the syncer of the encrypted link (docs/security.md): 500 connections at once
# from 50 loopback addresses (so both the per-address and the global caps are met), half silent, half sending 1 KiB of garbage, held 8 s (tests/tools/flood.py), while two
# honest units train. Checked:
#   - both units go on merging during the flood (three merges each at least);
#   - the syncer's open files stay within twice its pending-connection cap (64: each socket
#     and its duplicate) + 16 of where they were, and its resident memory grows by less than 64 MiB (the figures are printed);
#   - every refused connection is counted: the syncer's connections_refused events plus its
#     printed unit_refused lines add up to the 500 (none lost to the rate limit), and its log
#     has at most 5 single refusal lines per 10 s;
#   - SIGTERM then stops the job; every process the test started has ended.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
source "$(dirname "$0")/lib/link_job.sh"
cd "$WORK"
make_text_shards text
write_link_config c.yaml encrypted run
start_link_job c.yaml encrypted flood
merged() { echo "sum(1 for e in ev if e['event'] == 'merge' and $1 in e['units'])"; }
wait_event run/metrics.jsonl $syncer 120 "$(merged 0) >= 2 and $(merged 1) >= 2" || fail "the units were not merged"
addr=$(/usr/bin/python3 -c "import json; print(json.load(open('run/syncer.addr'))['address'])")
read -r b0 b1 < <(/usr/bin/python3 -c "
import json; ev=[json.loads(l) for l in open('run/metrics.jsonl') if l.endswith('\n')]
print(*[sum(1 for e in ev if e['event']=='merge' and u in e['units']) for u in (0,1)])")
/usr/bin/python3 "$SRC/tests/tools/flood.py" "$addr" $syncer --connections 500 --hold 8 --sources 50 > flood.json
echo "flood: $(cat flood.json)"
read -r a0 a1 < <(/usr/bin/python3 -c "
import json; ev=[json.loads(l) for l in open('run/metrics.jsonl') if l.endswith('\n')]
print(*[sum(1 for e in ev if e['event']=='merge' and u in e['units']) for u in (0,1)])")
echo "merges during the flood: unit 0 $((a0 - b0)), unit 1 $((a1 - b1))"
((a0 - b0 >= 3 && a1 - b1 >= 3)) || fail "the honest units did not keep merging during the flood"
/usr/bin/python3 - flood.json <<'PY' || fail "the syncer's resources were not bounded"
import json, sys
f = json.load(open(sys.argv[1]))
rss0, rss_peak, _ = f["rss_kib"]; fds0, fds_peak, fds1 = f["open_files"]
print(f"syncer: VmRSS {rss0} -> peak {rss_peak} KiB (+{(rss_peak - rss0) / 1024:.1f} MiB); "
      f"open files {fds0} -> peak {fds_peak} -> {fds1}")
ok = fds_peak <= fds0 + 2 * 64 + 16 and rss_peak - rss0 < 64 * 1024
sys.exit(0 if ok else 1)
PY
kill -TERM $syncer
rc=0; wait $syncer || rc=$?
((rc == 143)) || { tail -20 syncer_flood.log; fail "the syncer exited $rc after SIGTERM, expected 143"; }
for p in $unit0 $unit1; do wait $p || true; done
/usr/bin/python3 - run/metrics.jsonl syncer_flood.log <<'PY' || fail "refusals were lost or the log was flooded"
import json, re, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.endswith("\n")]
single = sum(1 for e in ev if e["event"] == "unit_refused")
summed = sum(e["count"] for e in ev if e["event"] == "connections_refused")
total = max((e["total"] for e in ev if e["event"] == "connections_refused"), default=single)
lines = sum(1 for l in open(sys.argv[2]) if l.startswith("syncer: refused a connection"))
print(f"refusals: {single} single lines + {summed} in summaries = {single + summed} (the syncer's total: {total}); "
      f"{lines} single lines printed")
sys.exit(0 if single + summed == total and total >= 500 and lines <= 5 * 4 else 1)
PY
for p in $syncer $unit0 $unit1; do ! kill -0 $p 2>/dev/null || fail "process $p outlived the test"; done

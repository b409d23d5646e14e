# The syncer's HTTP endpoint under `ddiloco launch` (docs/status_page.md), without a browser:
#   - /metrics parses with Prometheus's own Python parser (prometheus_client), carries the
#     documented families and labels, and its counters rise between two scrapes;
#   - /api/state is the documented JSON (schema ddiloco.status/1) and agrees with /metrics;
#   - requests without the run's secret, or with a wrong one, are refused (401) and change
#     nothing: no action is logged, the launcher kills nothing, no request file appears;
#     GET on an action is 405, an unknown action 404, a bad unit 400;
#   - with the page's secret, "checkpoint now" writes a checkpoint (the periodic one's path);
#   - hostile clients (40 slowloris connections for 8 s, then 1,000 requests back to back) do
#     not stop the merges: merges go on through the attack with no gap longer than twice the
#     nominal fragment period, and the page answers the requests once the slow clients are gone;
#   - requests with a body are refused (413), and one longer than the server's buffer is
#     refused; the run's own secret (which admits units) is not the page's;
#   - `ddiloco status` prints this job's table and JSON, and its --watch follows the syncer
#     through a SIGKILL and the launcher's restart of it;
#   - the job stops on SIGUSR1 with 40 slow clients still connected (within 60 s, else the
#     watchdog's SIGKILL fails the test). (How much they slow the
#     merges is measured by scripts/bench_status_page.py, not timed here.)
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
source "$(dirname "$0")/lib/launch.sh"
export PYTHONPATH="$SRC/tests/e2e/lib"
cd "$WORK"
start_status_job
wait_launch 90 "sum(1 for e in ev if e['event'] == 'global_eval') >= 1 and sum(1 for e in ev if e['event'] == 'merge') >= 20"
/usr/bin/python3 - <<'PY' || { show; fail "the status endpoint did not behave"; }
import json, os, threading, time, urllib.error, urllib.request
from prometheus_client.parser import text_string_to_metric_families
import http_load

addr = json.load(open("run/syncer.http"))
url, secret = addr["url"], open("run/status.secret").read().strip()
assert addr["pid"] > 0 and addr["url"] == f"http://{addr['address']}/", addr

def get(path):
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()

def post(path, headers={}):
    req = urllib.request.Request(url + path, data=b"", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())

def scrape():
    status, ctype, text = get("metrics")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4"), (status, ctype)
    out = {}
    for fam in text_string_to_metric_families(text):  # raises on anything malformed
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        out[("#type", fam.name)] = fam.type
    return out

m0 = scrape()
for name, kind in [("ddiloco_merges", "counter"), ("ddiloco_tokens", "counter"),
                   ("ddiloco_link_bytes", "counter"), ("ddiloco_unit_staleness", "gauge"),
                   ("ddiloco_val_loss", "gauge"), ("ddiloco_goodput_ratio", "gauge"),
                   ("ddiloco_unit_up", "gauge"), ("ddiloco_global_downtime_seconds", "counter")]:
    assert m0.get(("#type", name)) == kind, (name, m0.get(("#type", name)))
for u in ("0", "1"):
    assert m0[("ddiloco_unit_up", (("unit", u),))] == 1, u
    for d in ("up", "down"):
        assert m0[("ddiloco_link_bytes_total", (("direction", d), ("unit", u)))] > 0, (u, d)
time.sleep(3)
m1 = scrape()
for key in [("ddiloco_merges_total", ()), ("ddiloco_tokens_total", ()),
            ("ddiloco_unit_steps_total", (("unit", "0"),)),
            ("ddiloco_link_bytes_total", (("direction", "up"), ("unit", "1")))]:
    assert m1[key] > m0[key], (key, m0[key], m1[key])
print(f"/metrics parses ({sum(1 for k in m1 if k[0] == '#type')} families); merges "
      f"{m0[('ddiloco_merges_total', ())]:.0f} -> {m1[('ddiloco_merges_total', ())]:.0f}")

status, ctype, text = get("api/state")
st = json.loads(text)
assert status == 200 and ctype.startswith("application/json") and st["schema"] == "ddiloco.status/1", st.get("schema")
assert [u["state"] for u in st["units"]] == ["training", "training"], st["units"]
assert st["run"]["units"] == 2 and st["run"]["isolated"] and st["actions"] == {"kill": True, "checkpoint": True, "stop": True}
assert st["progress"]["merges"] >= m1[("ddiloco_merges_total", ())] and st["val_loss"], st["progress"]
assert "syncer:" in st["config"] and secret not in text, "config missing, or the secret leaked"

# Without the secret: refused, and nothing changes.
for path in ("api/action/kill?unit=1", "api/action/checkpoint", "api/action/stop"):
    for headers in ({}, {"Authorization": "Bearer " + secret[:-1] + "x"}, {"Authorization": "Bearer "},
                    {"Authorization": secret}, {"Authorization": "Basic " + secret}):
        code, body = post(path, headers)
        assert code == 401 and "secret" in body["error"], (path, headers, code, body)
# The run's secret admits units; it is not the page's.
run_secret = open("run/syncer.secret").read().strip()
assert run_secret != secret
code, _ = post("api/action/stop", {"Authorization": "Bearer " + run_secret})
assert code == 401, code
bearer = {"Authorization": "Bearer " + secret}
for path, want in [("api/action/kill?unit=2", 400), ("api/action/kill?unit=-1", 400),
                   ("api/action/kill?unit=1x", 400), ("api/action/kill", 400),
                   ("api/action/reboot", 404)]:
    code, body = post(path, bearer)
    assert code == want and body["error"], (path, code, body)
try:
    urllib.request.urlopen(url + "api/action/stop", timeout=10)
    raise AssertionError("GET on an action was answered")
except urllib.error.HTTPError as e:
    assert e.code == 405 and e.headers["Allow"] == "POST", e.code
time.sleep(1.5)  # the launcher's loop and the syncer's would have acted by now
ev = [json.loads(l) for l in open("run/metrics.jsonl")]
assert not [e for e in ev if e["event"] == "action"], "a refused request was acted on"
assert not [l for l in open("run/launch.jsonl") if '"kill"' in l], "the launcher killed"
assert not os.path.exists("run/requests") or not os.listdir("run/requests"), os.listdir("run/requests")
assert [u["restarts"] for u in json.loads(get("api/state")[2])["units"]] == [0, 0]
print("requests without the page's secret: 16 refused (401), nothing acted on; 400/404/405 as documented")

# With the secret, "checkpoint now" takes the periodic checkpoint's path: 202, an action event,
# then the checkpoint it asked for (every unit's file, the syncer's, the manifest). A periodic
# checkpoint under way at that moment refuses it (said in the event): ask again.
def events():
    with open("run/metrics.jsonl") as f:
        return [json.loads(l) for l in f if l.endswith("\n")]
deadline = time.time() + 90
for attempt in range(5):
    code, body = post("api/action/checkpoint", bearer)
    assert code == 202, (code, body)
    while not [e for e in events() if e["event"] == "action"][attempt:]:
        assert time.time() < deadline, "the checkpoint action was never logged"
        time.sleep(0.2)
    act = [e for e in events() if e["event"] == "action"][attempt]
    assert act["action"] == "checkpoint", act
    if "refused" not in act:
        break
    assert "under way" in act["refused"], act
    time.sleep(1)
assert "refused" not in act, act
while not [e for e in events() if e["event"] == "checkpoint" and e["elapsed_s"] >= act["elapsed_s"]]:
    assert time.time() < deadline, "no checkpoint followed the action"
    time.sleep(0.2)
cp = [e for e in events() if e["event"] == "checkpoint" and e["elapsed_s"] >= act["elapsed_s"]][0]
files = sorted(os.listdir(cp["path"]))
assert {"manifest.json", "syncer.h5", "unit_0.h5", "unit_1.h5"} <= set(files), files
print(f"checkpoint now (with the secret): {attempt + 1} request(s), checkpoint {cp['id']} written: {files}")

# Bodies are refused, and a request longer than the server's buffer is refused: neither
# grows the server (a chunked body or an endless header line would, read).
import socket
def raw(data, read=True):
    s = socket.create_connection((addr["address"].rsplit(":", 1)[0], int(addr["address"].rsplit(":", 1)[1])), timeout=10)
    try:
        s.sendall(data)
        return s.recv(200).decode(errors="replace") if read else ""
    except OSError as e:  # the server may close while we still send
        return str(e)
    finally:
        s.close()
for req in [b"POST /api/action/stop HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"ffff\r\n" + b"a" * 65535,
            b"POST /api/action/stop HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n" + b"a" * 65536]:
    answer = raw(req)
    assert answer.startswith("HTTP/1.1 413"), answer[:80]
answer = raw(b"GET /api/state HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 200000 + b"\r\n\r\n")
assert not answer.startswith("HTTP/1.1 200"), answer[:80]
assert get("api/state")[0] == 200
print(f"bodies refused (413), a 200 kB header refused ({answer[:30]!r}); the page answers on")

# Hostile clients: merges go on meanwhile, and the page answers again once they are gone.
host, port = addr["address"].rsplit(":", 1)
stop = threading.Event()
t_attack = json.loads(get("api/state")[2])["elapsed_s"]
_, slow = http_load.slowloris(host, int(port), 40, stop)
time.sleep(8)
stop.set()
time.sleep(1.5)
flood = http_load.flood(url, 1000, workers=8)
st = json.loads(get("api/state")[2])
t_end = st["elapsed_s"]
ev = [json.loads(l) for l in open("run/metrics.jsonl")]
merges = [e for e in ev if e["event"] == "merge" and t_attack - 1 <= e["elapsed_s"] <= t_end]
gaps = [(b["elapsed_s"] - a["elapsed_s"], b["period_s"]) for a, b in zip(merges, merges[1:])]
worst = max(gaps, key=lambda g: g[0] / g[1])
assert len(merges) > 10 and worst[0] <= 2 * worst[1], (len(merges), worst)
assert flood[200] >= 990, dict(flood)  # a request may meet a connection the server just closed
assert st["units"][0]["state"] == "training" and st["units"][1]["state"] == "training", st["units"]
print(f"slowloris x40 for 8 s ({dict(slow)}), then 1000 requests ({dict(flood)}): "
      f"{len(merges)} merges in {t_end - t_attack:.1f} s, longest gap {worst[0]:.2f} s "
      f"(2 x period {2 * worst[1]:.2f} s)")
PY
# `ddiloco status`: the table and the JSON of the syncer that answers; asked once, a run with no
# syncer serving is an error naming the file; a watch follows the syncer through a SIGKILL and
# the launcher's restart of it (the new syncer serves on a new port).
first=$(launch_syncer_pid)
"$DDILOCO" status run > status.txt || { show; fail "ddiloco status run failed"; }
grep -q " · syncer $first · mode decoupled · 2 units" status.txt && (($(grep -cE '^ +[01]  training ' status.txt) == 2)) \
  || { cat status.txt; fail "ddiloco status: not the table of this job (syncer $first, 2 units training)"; }
"$DDILOCO" status run --json > status.json || { show; fail "ddiloco status run --json failed"; }
/usr/bin/python3 -c "import json; s = json.load(open('status.json')); assert s['run']['pid'] == $first and len(s['units']) == 2, s['run']" \
  || fail "ddiloco status --json: not this job's /api/state"
mkdir -p idle
rc=0; "$DDILOCO" status idle 2> idle.err || rc=$?
((rc != 0)) && grep -q "no idle/syncer.http" idle.err || { cat idle.err; fail "ddiloco status of a run with no syncer: exit $rc"; }
"$DDILOCO" status run --watch 0.3 > watch.txt 2>&1 &
watcher=$!
sleep 1
kill -KILL "$first"
deadline=$((SECONDS + 90))
until second=$(launch_syncer_pid) && [[ $second != "$first" ]] && grep -q " · syncer $second · " watch.txt; do
  kill -0 "$watcher" 2>/dev/null || { cat watch.txt; fail "ddiloco status --watch ended when the syncer was killed"; }
  ((SECONDS < deadline)) || { show; tail -c 2000 watch.txt; fail "ddiloco status --watch never showed the restarted syncer"; }
  sleep 0.2
done
kill -TERM "$watcher"
rc=0; wait "$watcher" || rc=$?
((rc == 0)) || fail "ddiloco status --watch exited $rc on SIGTERM, expected 0"
echo "ddiloco status: the table, --json, an idle run refused; --watch followed syncer $first to $second" \
     "($(grep -c 'waiting for the syncer' watch.txt) redraws waiting in between)"

# The job ends with slow clients still connected: the server's threads are joined within a
# request deadline, so the syncer's exit does not wait on them.
host_port=$(/usr/bin/python3 -c "import json; print(json.load(open('run/syncer.http'))['address'])")
/usr/bin/python3 -c "
import sys, threading, time, http_load
host, port = sys.argv[1].rsplit(':', 1)
http_load.slowloris(host, int(port), 40, threading.Event())
time.sleep(300)" "$host_port" &
slow=$!
sleep 3
(sleep 60; kill -KILL "$launcher" 2>/dev/null) &
watchdog=$!
stop_launch
kill "$watchdog" "$slow" 2>/dev/null || true
launch_left_nothing
echo "status_metrics: passed"

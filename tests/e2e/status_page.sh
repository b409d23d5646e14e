# The syncer's status page (docs/status_page.md) in a real browser: headless Chromium loads the
# page of a running `ddiloco launch` job and
#   - sees one row per unit, training, and the unit rows and the loss curve update;
#   - without the secret, finds the action buttons disabled (the page is read-only);
#   - with the run's secret, kills unit 1 through its row's button: the launcher's SIGKILL
#     (a `kill` event with source status_page), the row goes lost, then back to training with
#     one restart;
#   - saves a screenshot, kept as an artefact in the build tree (test-artefacts/status_page.png);
#   - stops the run with the page's stop button: the job ends as on SIGTERM, nothing outlives it.
# Exits 77 (skipped) only when Chromium cannot start on this machine.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
source "$(dirname "$0")/lib/launch.sh"
ARTEFACTS=$PWD/test-artefacts
export PYTHONPATH="$SRC/tests/e2e/lib"
cd "$WORK"
if ! why=$(/usr/bin/python3 -c 'import browser, sys; ok, why = browser.can_start(); print(why); sys.exit(0 if ok else 1)'); then
  echo "status_page: skipped: headless Chromium cannot start here: $why"
  exit 77
fi
start_status_job
wait_launch 90 "sum(1 for e in ev if e['event'] == 'global_eval') >= 2"
[[ -f run/syncer.http && -f run/status.secret ]] || { show; fail "no run/syncer.http or run/status.secret"; }
mkdir -p "$ARTEFACTS"
/usr/bin/python3 - "$ARTEFACTS/status_page.png" <<'PY' || { show; fail "the status page did not behave"; }
import json, sys, time
from browser import Browser
url = json.load(open("run/syncer.http"))["url"]
secret = open("run/status.secret").read().strip()
rows = "Array.from(document.querySelectorAll('#units tr[data-unit]'))"
states = f"{rows}.map(r => r.getAttribute('data-state')).join(',')"
cell = lambda u, col: (f"document.querySelector('#units tr[data-unit=\"{u}\"] td[data-col=\"{col}\"]')"
                       ".textContent")
with Browser(width=1400, height=1000) as b:
    b.open(url)
    b.wait_for(f"{states} == 'training,training'", 30)
    # The rows and the curve update: a unit's steps and the chart's evaluations grow.
    steps0 = b.evaluate(cell(1, "steps"))
    val0 = int(b.evaluate("document.getElementById('loss-chart').getAttribute('data-val-points')"))
    b.wait_for(f"{cell(1, 'steps')} != {json.dumps(steps0)}", 15)
    b.wait_for(f"+document.getElementById('loss-chart').getAttribute('data-val-points') > {val0}", 30)
    train_pts = int(b.evaluate("document.getElementById('loss-chart').getAttribute('data-train-points')"))
    assert train_pts > 0, "no training-loss points drawn"
    print(f"rows update (unit 1 steps {steps0} -> {b.evaluate(cell(1, 'steps'))}), "
          f"val points {val0} -> more, train points {train_pts}")
    # Read-only without the secret.
    assert b.evaluate("Array.from(document.querySelectorAll('button.kill, #checkpoint, #stop')).every(x => x.disabled)"), \
        "an action button is enabled without the secret"
    # Every state the row of unit 1 shows from now on.
    b.evaluate("""(() => { window.seen = []; const tr = document.querySelector('#units tr[data-unit="1"]');
        const note = () => { const s = tr.getAttribute('data-state'); if (window.seen[window.seen.length - 1] !== s) window.seen.push(s); };
        note(); new MutationObserver(note).observe(tr, {attributes: true, attributeFilter: ['data-state']}); return true; })()""")
    b.type("#secret", secret)
    b.wait_for("!document.querySelector('button.kill[data-unit=\"1\"]').disabled", 5)
    b.click("button.kill[data-unit='1']")
    b.wait_for("document.getElementById('action-result').getAttribute('data-status') == '202'", 10)
    b.wait_for("window.seen.includes('lost')", 30)
    b.wait_for(f"window.seen.lastIndexOf('training') > window.seen.indexOf('lost') && {cell(1, 'restarts')} == '1'", 60)
    print("unit 1's row:", " -> ".join(b.evaluate("window.seen")))
    time.sleep(2)  # a few more polls: the curve past the heal
    b.screenshot(sys.argv[1])
    print("screenshot:", sys.argv[1])
    assert not b.errors, b.errors
    b.click("#stop")
    b.wait_for("document.getElementById('action-result').getAttribute('data-status') == '202'", 10)
PY
rc=0
wait "$launcher" || rc=$?
((rc == 143)) || { show; fail "ddiloco launch exited $rc after the page's stop, expected 143 (as SIGTERM)"; }
/usr/bin/python3 - <<'PY' || { show; fail "the page's actions did not take the launcher's paths"; }
import json
launch = [json.loads(l) for l in open("run/launch.jsonl")]
kills = [e for e in launch if e["event"] == "kill"]
assert len(kills) == 1 and kills[0]["source"] == "status_page" and kills[0]["unit"] == 1 \
    and not kills[0]["missed"], kills
done = [e for e in launch if e["event"] == "done"][-1]
assert done["restarts"] == {"syncer": 0, "units": [0, 1]}, done
ev = [json.loads(l) for l in open("run/metrics.jsonl")]
acts = [(e["action"], e.get("unit")) for e in ev if e["event"] == "action"]
assert acts == [("kill", 1), ("stop", None)], acts
assert not [e for e in ev if e["event"] == "action" and "refused" in e], "an action was refused"
print("launcher: kill of unit 1 from the status page; the page's stop ended the job")
PY
[[ ! -e run/syncer.http ]] || fail "run/syncer.http outlived the syncer"
launch_left_nothing
echo "status_page: passed"

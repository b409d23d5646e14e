# Helpers for the end-to-end tests: each test is `bash tests/e2e/<name>.sh DDILOCO SOURCE_DIR`.
set -euo pipefail
DDILOCO=$1
SRC=$2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ddiloco-e2e-XXXXXX")
# Background jobs a test started (training runs it signals) never outlive it. The work
# directory goes too, unless DDILOCO_E2E_KEEP=1 (to read a failed test's logs).
trap 'for p in $(jobs -p); do pkill -TERM -P "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
      if [[ ${DDILOCO_E2E_KEEP:-0} == 1 ]]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi' EXIT
source "$SRC/scripts/mpi_env.sh"

fail() { echo "FAIL: $*" >&2; exit 1; }

# wait_for FILE PATTERN PID [SECONDS]: until FILE has a line matching PATTERN; fails when PID
# exits first or the time runs out (default 120 s).
wait_for() {
  local file=$1 pattern=$2 pid=$3 deadline=$((SECONDS + ${4:-120}))
  until grep -q "$pattern" "$file" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || fail "process $pid ended before '$pattern' appeared in $file"
    ((SECONDS < deadline)) || fail "timed out waiting for '$pattern' in $file"
    sleep 0.2
  done
}

# wait_event FILE PID SECONDS CONDITION: until the Python expression CONDITION holds over the
# JSON lines of FILE: `ev` (its complete lines), `last(name)` (the index of the last `name`
# event, -1 if none), `after_resume` (the events from the first `resume` on, [] if none).
# Returns non-zero, saying why, when PID ends first or SECONDS run out (a hang detector: the
# event is what a test waits for, not the time).
wait_event() {
  /usr/bin/python3 - "$@" <<'PY'
import json, os, sys, time
path, pid, seconds, cond = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
deadline = time.time() + seconds
while True:
    ev = []
    try:
        for l in open(path):
            if not l.endswith("\n"):
                break  # a line still being written
            try:
                ev.append(json.loads(l))
            except ValueError:
                break  # torn by a concurrent write: read again next round
    except FileNotFoundError:
        pass
    cut = next((i for i, e in enumerate(ev) if e["event"] == "resume"), len(ev))
    after_resume = ev[cut:]
    last = lambda name: max((i for i, e in enumerate(ev) if e["event"] == name), default=-1)
    if eval("(" + cond + ")"):  # (a condition may span lines)
        sys.exit(0)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(f"process {pid} ended before: {cond}")
    if time.time() > deadline:
        sys.exit(f"timed out after {seconds:g} s waiting for: {cond}")
    time.sleep(0.2)
PY
}

# expect_error "<fragment>" cmd...: the command must exit 2 with exactly one stderr line
# "ddiloco: error: ..." containing the fragment.
expect_error() {
  local fragment=$1; shift
  local out rc=0
  out=$("$@" 2>&1 >/dev/null) || rc=$?
  [[ $rc == 2 ]] || fail "'$*' exited $rc, expected 2 (output: $out)"
  [[ $(printf '%s\n' "$out" | grep -c .) == 1 ]] || fail "'$*' printed more than one line: $out"
  [[ $out == "ddiloco: error: "* ]] || fail "'$*': unexpected error format: $out"
  [[ $out == *"$fragment"* ]] || fail "'$*': error '$out' lacks '$fragment'"
  echo "ok: $out"
}

# json_field FILE EVENT FIELD: the FIELD of the last object with "event": EVENT.
json_field() {
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
path, event, field = sys.argv[1:4]
value = None
for line in open(path, encoding="utf-8"):
    obj = json.loads(line)
    if obj.get("event") == event and field in obj:
        value = obj[field]
if value is None:
    sys.exit(f"{path}: no '{event}' event with field '{field}'")
print(value)
PY
}

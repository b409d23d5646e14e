# `ddiloco simulate` from the command line: the table, the JSON of one column, the sweep's
# JSON array (exactly the documented fields, one object per grid cell), the committed configs
# load, and bad input is refused with the file and key named.
source "$(dirname "$0")/lib/common.sh"
cd "$WORK"
short=(--set sim.days=2 --set sim.repeats=2)

"$DDILOCO" simulate --config "$SRC/configs/sim/paper.yaml" "${short[@]}" > table.txt
cat table.txt
for row in "dp " "elastic_dp " "decoupled M=4 K=1 "; do
  grep -q "^$row" table.txt || fail "table lacks the row '$row'"
done
grep -q "quorum sizes (share of merges):" table.txt || fail "no quorum-size distribution"

"$DDILOCO" simulate --config "$SRC/configs/sim/paper.yaml" "${short[@]}" --json > one.json
"$DDILOCO" simulate --config "$SRC/configs/sim/paper.yaml" "${short[@]}" --sweep --json \
  --set "sweep.chips=[150000, 600000]" --set "sweep.learners=[2, 8]" > sweep.json
/usr/bin/python3 - one.json sweep.json <<'PY'
import json, sys
one = json.load(open(sys.argv[1]))
names = [r["strategy"] for r in one["results"]]
assert names == ["dp", "elastic_dp", "decoupled"], names
for r in one["results"]:
    assert 0 < r["goodput"] <= 1 and 0 < r["uptime"] <= 1, r
    assert abs(sum(r["chip_time"].values()) - 1) < 1e-9, r["chip_time"]
dec = one["results"][2]
assert sum(dec["quorum_sizes"]) == dec["merges"] > 0, dec
grid = json.load(open(sys.argv[2]))
assert isinstance(grid, list) and len(grid) == 2 * 4, len(grid)
for r in grid:
    assert set(r) == {"strategy", "chips", "learners", "goodput"}, r
    assert 0 <= r["goodput"] <= 1, r
# One cell per (strategy, chips, units): dp and elastic_dp are one unit, decoupled takes each
# of sweep.learners.
cells = [(r["strategy"], r["chips"], r["learners"]) for r in grid]
want = {(s, n, m) for n in (150000, 600000)
        for s, m in (("dp", 1), ("elastic_dp", 1), ("decoupled", 2), ("decoupled", 8))}
assert len(set(cells)) == len(cells) and set(cells) == want, sorted(cells)
# More chips, same strategy: lower goodput (failures grow with N).
g = {(r["strategy"], r["chips"], r["learners"]): r["goodput"] for r in grid}
assert g[("dp", 600000, 1)] < g[("dp", 150000, 1)], g
print("PASS: JSON outputs", len(grid), "grid cells")
PY

# --calibrate fits two keys per strategy to its goodput at two chip counts: goodputs simulated
# with known keys are fitted back to those keys.
cal=(--config "$SRC/configs/sim/paper.yaml" --set sim.days=3 --set sim.repeats=2
     --set "sweep.learners=[2]" --set "calibration.decoupled=[0.9]")
known=(--set dp.checkpoint_seconds=5 --set chips.recovery_minutes=0.2
       --set elastic.checkpoint_seconds=1.5 --set elastic.rescale_seconds=8)
for n in 15000 120000; do
  "$DDILOCO" simulate "${cal[@]}" "${known[@]}" --set chips.count=$n \
    --set "sim.strategies=[dp, elastic_dp]" --json > "known_$n.json"
done
targets=$(/usr/bin/python3 - known_15000.json known_120000.json <<'PY'
import json, sys
g = [[r["goodput"] for r in json.load(open(f))["results"]] for f in sys.argv[1:]]
print(f"calibration.dp=[{g[0][0]!r},{g[1][0]!r}] calibration.elastic_dp=[{g[0][1]!r},{g[1][1]!r}]")
PY
)
read -r dp_targets elastic_targets <<< "$targets"
"$DDILOCO" simulate "${cal[@]}" --calibrate --set "calibration.chips=[15000, 120000]" \
  --set "$dp_targets" --set "$elastic_targets" > calibrate.txt
cat calibrate.txt
grep -q "fitted: dp.checkpoint_seconds: 5 *chips.recovery_minutes: 0.2$" calibrate.txt \
  || fail "--calibrate did not find dp's keys back"
grep -q "elastic.checkpoint_seconds: 1.5 *elastic.rescale_seconds: 8$" calibrate.txt \
  || fail "--calibrate did not find elastic's keys back"
expect_error "calibration.dp: [0.5, 0.9] cannot be reached by fitting dp.checkpoint_seconds" \
  "$DDILOCO" simulate "${cal[@]}" --calibrate --set "calibration.chips=[15000, 120000]" \
  --set "calibration.dp=[0.5, 0.9]"

"$DDILOCO" simulate --config "$SRC/configs/sim/planning.yaml" "${short[@]}" > /dev/null
# (Not piped into grep -q: under pipefail, grep leaving early can cut the writer with SIGPIPE.)
"$DDILOCO" simulate --list > list.txt
grep -q "^chips.mtbi_hours" list.txt || fail "--list lacks chips.mtbi_hours"

printf 'chips:\n  count: -5\n' > bad.yaml
expect_error "bad.yaml: chips.count: must be in [1, 10000000000], got -5" "$DDILOCO" simulate --config bad.yaml
printf 'decoupled:\n  learners: 4\n  quorum: 6\n' > bad.yaml
expect_error "bad.yaml: decoupled.quorum: must be ≤ decoupled.learners = 4, got 6" \
  "$DDILOCO" simulate --config bad.yaml
expect_error "unknown key 'chips.mtbi_hour' (did you mean 'chips.mtbi_hours'?)" \
  "$DDILOCO" simulate --set chips.mtbi_hour=3
expect_error "--set: sim.strategies: every element must be one of dp, elastic_dp, decoupled" \
  "$DDILOCO" simulate --set "sim.strategies=[ddp]"
expect_error "--sweep: decoupled on 150000 chips with 4096 units: about" \
  "$DDILOCO" simulate --sweep --set "sweep.learners=[4096]" --set "sweep.chips=[150000]"
expect_error "--calibrate prints its own table: drop --sweep and --json" \
  "$DDILOCO" simulate --calibrate --json
echo "PASS: simulate CLI"

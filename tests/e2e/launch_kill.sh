# Real faults under `ddiloco launch` (docs/deployments.md "Fault isolation"): SIGKILL of a non-leader rank of
# a 2-rank unit (a chaos `kill` the launcher carries out), then of a unit's leader and of the
# syncer (sent by this test once the previous fault has healed). The 2-rank unit shards AdamW's
# state over its ranks (units.zero: 1): its checkpoints gather the shards, and its restarted
# process starts its shards afresh. Checked:
#   - the launcher carries out the scheduled kill and restarts each killed process once;
#   - the other unit and the syncer never stop while a unit is down: merges go on, with no gap
#     between two merges longer than twice the nominal fragment period;
#   - each killed unit is lost (unit_lost), a new process of it joins and is merged again
#     (unit_joined with heal_s);
#   - the killed syncer is restarted from its latest checkpoint (resume) and recovers the newer
#     fragments from the units' copies (syncer_recovered); the units reconnect without
#     restarting (unit_connected with restart unchanged) and are merged again; the time without
#     merges is reported; Θ's evaluation after the kill is within 10 % of the one before
#     (lib/model_kept.py);
#   - the job then stops on SIGUSR1 (its budget is unbounded: every step waits for an event,
#     none races the wall clock), Θ is finite, and no process outlives the launch.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
source "$(dirname "$0")/lib/launch.sh"
cd "$WORK"
make_text_shards text
# The first kill is the launcher's: with an unbounded budget it fires whatever the machine's
# speed; 6 s leaves the units' start-up (about 1 s) a wide margin to write their pid files.
cat > faults.yaml <<'YAML'
faults:
  - {unit: 1, kind: kill, rank: 1, start_s: 6}
YAML
cat > c.yaml <<'YAML'
mode: decoupled
run: {dir: run, log_every: 20, progress: false, threads: 1}
model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 64}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 16, steps: 1000000, warmup_steps: 5}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2, ranks: [1, 2], slowdown: [3, 3], zero: 1}
outer: {fragments: 2, h: 4, overlap: 1}
syncer: {quorum: 1, eval_every: 10, heartbeat_timeout_s: 2, connect_wait_s: 60}
checkpoint: {every: 40}
chaos: {schedule_file: faults.yaml}
launch: {backoff_s: 0.5, drain_s: 20}
YAML
"$DDILOCO" launch --config c.yaml > launch.log 2>&1 &
launcher=$!
show() { grep -v '^  ' launch.log | grep -v global_eval | tail -40; }
joined() { echo "any(e['event'] == 'unit_joined' and e['unit'] == $1 for e in ev)"; }
wait_launch 90 "$(joined 1)"
# The leader of unit 0 once the unit has been merged again after unit 1's heal.
wait_launch 60 "sum(1 for e in ev if e['event'] == 'merge' and 0 in e['units']) >= 20"
kill -KILL "$(cat run/pids/unit0.rank0.pid)"
wait_launch 90 "$(joined 0)"
# The syncer once a checkpoint newer than unit 0's heal exists.
wait_launch 60 "last('checkpoint') > last('unit_joined')"
syncer=$(launch_syncer_pid)
kill -KILL "$syncer"
echo "killed the syncer (pid $syncer)"
# The stop once both units are merged by the restarted syncer and have said they are back: a
# unit says it reconnected at its next step boundary, which a stop skips, and the restarted
# syncer can merge its waiting snapshot before that boundary.
wait_launch 90 "len(after_resume) > 0 and {0, 1} <= {u for e in after_resume if e['event'] == 'merge' for u in e['units']}
  and all('\"syncer_back\"' in open(f'run/unit_{u}.jsonl').read() for u in (0, 1))"
stop_launch
PYTHONPATH="$SRC/tests/e2e/lib" /usr/bin/python3 - <<'PY' || { show; fail "the job did not survive its kills"; }
import json, model_kept, math, h5py, numpy as np
launch = [json.loads(l) for l in open("run/launch.jsonl")]
kills = [e for e in launch if e["event"] == "kill"]
assert len(kills) == 1 and not kills[0]["missed"] and kills[0]["unit"] == 1 and kills[0]["rank"] == 1, kills
done = [e for e in launch if e["event"] == "done"][-1]
assert done["restarts"] == {"syncer": 1, "units": [1, 1]}, done
# metrics.jsonl holds both syncer processes, each with its own clock: split at the resume.
ev = [json.loads(l) for l in open("run/metrics.jsonl")]
cut = next(i for i, e in enumerate(ev) if e["event"] == "resume")
first, second = ev[:cut], ev[cut:]
def of(events, name, unit=None):
    # unit_lost: the endpoint's failure (a heartbeat loss, a slow step on a loaded machine,
    # may come too, and is not what the kill caused).
    return [e for e in events if e["event"] == name and (unit is None or e.get("unit") == unit)
            and not (name == "unit_lost" and e["reason"].startswith("heartbeat"))]
merges = of(first, "merge")
for u in (0, 1):
    lost, joined = of(first, "unit_lost", u), of(first, "unit_joined", u)
    assert len(lost) == 1 and len(joined) == 1, (u, lost, joined)
    lost, joined = lost[0], joined[0]
    assert joined["restart"] == 1 and 0 < joined["heal_s"] < 60, joined
    # The other unit is merged alone meanwhile, without a gap.
    alone = [m for m in merges if lost["elapsed_s"] < m["elapsed_s"] < joined["elapsed_s"]]
    # (A heal shorter than a fragment period may see none: the gap check below still holds.)
    assert all(m["units"] == [1 - u] for m in alone), (u, alone[:3])
    # Each gap against twice the nominal fragment period (H steps at the units' median step
    # time) as the syncer measured it then: the bound of its own global downtime.
    window = [m for m in merges if lost["elapsed_s"] - 1 <= m["elapsed_s"] <= joined["elapsed_s"] + 1]
    gaps = [(b["elapsed_s"] - a["elapsed_s"], b["period_s"]) for a, b in zip(window, window[1:])]
    worst = max(gaps, key=lambda g: g[0] / g[1])
    assert worst[0] <= 2 * worst[1], (u, worst)
    gaps, period = [g for g, _ in gaps], worst[1]
    print(f"unit {u}: lost ({lost['reason']}), healed in {joined['heal_s']:.2f}s; {len(alone)} merges "
          f"without it, longest gap {max(gaps):.2f}s (2 x period {2 * period:.2f}s)")
# The syncer: resumed from a checkpoint; both units reconnected as they were (no unit restart),
# and merged again.
resume = second[0]
assert resume["path"].startswith("run/checkpoints/ckpt_"), resume
conn = of(second, "unit_connected")
assert sorted(c["unit"] for c in conn) == [0, 1] and all(c["restart"] == 1 for c in conn), conn
after = of(second, "merge")
assert {0, 1} <= {u for m in after for u in m["units"]}, "a unit was not merged after the syncer's restart"
spawns = [e for e in launch if e["event"] == "spawn" and e["role"] == "syncer"]
exits = [e for e in launch if e["event"] == "exit" and e["role"] == "syncer"]
assert exits[0]["signal"] == 9, exits
no_merge_s = spawns[1]["elapsed_s"] + after[0]["elapsed_s"] - exits[0]["elapsed_s"]
print(f"syncer killed, resumed from {resume['path']}; no merge for at most {no_merge_s:.2f}s")
# Both units trained on while the syncer was gone, and said how long it was.
for u in (0, 1):
    back = [json.loads(l) for l in open(f"run/unit_{u}.jsonl") if '"syncer_back"' in l]
    assert len(back) == 1 and back[0]["no_syncer_s"] > 0, (u, back)
# The model, not only the job: Θ recovered from the units, its evaluation within 10 % across the kill.
for line in model_kept.check(ev):
    print(line)
fin = of(second, "done")[0]
assert fin["interrupted"] and fin["tokens"] > resume["tokens"], fin
with h5py.File("run/model.h5") as f:
    for name, d in f["params"].items():
        assert np.isfinite(d[...]).all(), name
print(f"stopped by SIGUSR1: {fin['tokens']} tokens, final val_loss {fin['val_loss']:.3f}")
PY
launch_left_nothing
echo "launch_kill: passed"

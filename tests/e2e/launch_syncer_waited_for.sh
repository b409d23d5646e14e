# The syncer killed (SIGKILL) under `ddiloco launch` while every unit waits for a merge: a
# warm-up over the whole run (outer.warmup_steps, post-local SGD: each step's merge is applied
# before the next step; decoupled with τ = 0 waits the same way). The launcher restarts the
# syncer from its latest checkpoint, which holds its deliveries until each unit has started over
# from its Θ: a unit must hear that the syncer is back while it waits, not only between steps
# (before that, both units waited for good). Checked:
#   - the syncer resumes from a checkpoint, recovers Θ from the units' copies (each unit
#     hands back its copy and starts over from the recovered Θ: it waits for merges), Θ's
#     evaluation after the kill is within 10 % of the one before (lib/model_kept.py), and it
#     merges both units again, every merge warm;
#   - each unit says once that the syncer came back (syncer_back) and trains on after it;
#   - the job stops on SIGUSR1 with the syncer's status, and no process outlives the launch.
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
source "$(dirname "$0")/lib/launch.sh"
cd "$WORK"
make_text_shards text
cat > c.yaml <<'YAML'
mode: decoupled
run: {dir: run, log_every: 20, progress: false, threads: 1}
model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 64}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 16, steps: 1000000, warmup_steps: 5}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2}
outer: {fragments: 2, h: 4, overlap: 1, warmup_steps: 1000000}
syncer: {quorum: 2, eval_every: 2, heartbeat_timeout_s: 2, connect_wait_s: 60}
checkpoint: {every: 40}
launch: {backoff_s: 0.5, drain_s: 20}
YAML
"$DDILOCO" launch --config c.yaml > launch.log 2>&1 &
launcher=$!
show() { grep -v '^  ' launch.log | grep -v global_eval | tail -40; for u in 0 1; do tail -3 run/unit_$u.jsonl; done; }
# Once the syncer has written a checkpoint and merged on after it.
wait_launch 90 "last('checkpoint') >= 0 and sum(1 for e in ev[last('checkpoint'):] if e['event'] == 'merge') >= 4"
syncer=$(launch_syncer_pid)
kill -KILL "$syncer"
echo "killed the syncer (pid $syncer) while the units wait for its merges"
wait_launch 90 "len(after_resume) > 0 and {0, 1} <= {u for e in after_resume if e['event'] == 'merge' for u in e['units']}
  and all('\"syncer_back\"' in open(f'run/unit_{u}.jsonl').read() for u in (0, 1))"
stop_launch
PYTHONPATH="$SRC/tests/e2e/lib" /usr/bin/python3 - <<'PY' || { show; fail "the units did not come back from waiting for the killed syncer"; }
import json, model_kept
launch = [json.loads(l) for l in open("run/launch.jsonl")]
done = [e for e in launch if e["event"] == "done"][-1]
assert done["restarts"] == {"syncer": 1, "units": [0, 0]}, done
ev = [json.loads(l) for l in open("run/metrics.jsonl")]
cut = next(i for i, e in enumerate(ev) if e["event"] == "resume")
assert ev[cut]["path"].startswith("run/checkpoints/ckpt_"), ev[cut]
merges = [e for e in ev if e["event"] == "merge"]
assert merges and all(m.get("warm") for m in merges), "a merge of the whole-run warm-up was not warm"
after = [e for e in ev[cut:] if e["event"] == "merge"]
assert {0, 1} <= {u for m in after for u in m["units"]}, after[:3]
for u in (0, 1):
    log = [json.loads(l) for l in open(f"run/unit_{u}.jsonl")]
    back = [e for e in log if e["event"] == "syncer_back"]
    assert len(back) == 1 and back[0]["no_syncer_s"] > 0, (u, back)
    later = [e for e in log if e["event"] == "train" and e["step"] > back[0]["step"]]
    assert later, f"unit {u} trained no step after the syncer came back"
    print(f"unit {u}: the syncer was gone {back[0]['no_syncer_s']:.2f} s; back at step "
          f"{back[0]['step']}, trained to step {later[-1]['step']}")
# The model, not only the job: Θ recovered from the units, its evaluation within 10 % across the kill.
for line in model_kept.check(ev):
    print(line)
print(f"syncer resumed from {ev[cut]['path']}; {len(after)} merges after it, every one warm")
PY
launch_left_nothing
echo "launch_syncer_waited_for: passed"

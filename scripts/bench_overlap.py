#!/usr/bin/python3
"""Does syncing cost the learners time? Inner-step wall time with syncing on vs off.

    /usr/bin/python3 scripts/bench_overlap.py [--config configs/kjv_decoupled.yaml]
        [--steps 200] [--set key=value ...]

Runs the config's decoupled job twice with ONE learner unit of one rank plus the syncer (two
ranks, so on a 2-core machine each has a core, as a syncer has its own host in a real job):
once syncing as configured (a fragment is published, fetched, merged and applied every
H/P steps), once with outer.h larger than the run (nothing is ever synchronised). Prints the
learner's mean wall time per inner step in both (from its unit log: compute, publishing,
applying and any waiting included) and their ratio; the target is ≤ 1.1.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_modes import DDILOCO, ROOT, mpirun_train  # noqa: E402  (same directory)


def run(args, label, extra):
    run_dir = os.path.join(args.out, label)
    sets = list(args.set) + ["mode=decoupled", "units.count=1", "units.ranks_per_unit=1",
                             "units.slowdown=[]", "syncer.quorum=1", f"train.steps={args.steps}",
                             "run.progress=false", "eval.sample_tokens=0", f"run.dir={run_dir}",
                             "run.log_every=10"] + extra
    cmd, env = mpirun_train(args.config, sets, 2)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"bench_overlap: {label} failed:\n{out.stdout[-1500:]}{out.stderr[-1500:]}")
    events = [json.loads(l) for l in open(os.path.join(run_dir, "unit_0.jsonl"))]
    train = [e for e in events if e["event"] == "train"][2:]  # skip warm-up windows
    steps = [e["step_s"] for e in train]
    merges = sum(1 for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"merge"' in l)
    return sum(steps) / len(steps), merges


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "kjv_decoupled.yaml"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_overlap"))
    args = ap.parse_args()
    if not os.access(DDILOCO, os.X_OK):
        sys.exit(f"bench_overlap: {DDILOCO} not found; run scripts/build.sh first")
    off, merges_off = run(args, "sync_off", [f"outer.h={10 * args.steps}", "outer.fragments=1",
                                             "outer.overlap=0", "syncer.eval_every=1000000"])
    on, merges_on = run(args, "sync_on", ["syncer.eval_every=1000000"])
    print(f"learner inner-step time, syncing off: {off * 1e3:.2f} ms ({merges_off} merges)")
    print(f"learner inner-step time, syncing on:  {on * 1e3:.2f} ms ({merges_on} merges)")
    print(f"ratio on/off = {on / off:.3f} (target ≤ 1.1)")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""What the isolated deployment costs a learner, and how fast a killed unit heals.

    /usr/bin/python3 scripts/bench_isolated.py [--config configs/kjv_decoupled.yaml]
        [--steps 200] [--heal-steps 150] [--kill-at 30] [--out runs/bench_isolated]
        [--parts steps,heal,syncer] [--syncer-steps 600] [--syncer-kill-at 16] [--set key=value ...]
        [--security trusted,authenticated,encrypted]

1. Step time, syncing on ÷ off. One learner unit of one rank with one thread (so that the syncer
   has the other core of a 2-core machine) trains `--steps` steps on the demo model several ways:
   alone (`mode: single`, nothing to sync), as the only unit of a one-job `decoupled` run (MPI
   windows), and as the only unit of the isolated deployment (`ddiloco launch`) once per link
   mode, `--set wan.security=trusted|authenticated|encrypted` (trusted: UCX one-sided access and
   the leader's progress thread; authenticated: requests over TCP that the unit's link thread
   carries out; encrypted: the same inside TLS 1.3; `--security` picks the modes). Prints each
   one's mean wall time per inner step (from its first to its last logged train window) and the
   ratio to the alone run (the goal for encrypted: <= 1.05).
2. Heal time. The demo config under `ddiloco launch` (4 units, `--heal-steps` steps' worth of
   tokens), with unit 1's leader killed with SIGKILL at `--kill-at` seconds: the syncer's
   `unit_lost` → `unit_joined` (heal_s), the longest gap between merges meanwhile, and goodput.
3. Heal time after a syncer kill (`--parts syncer`). The demo config under `ddiloco launch`,
   `--syncer-steps` inner steps, run twice: unkilled, and with the syncer killed with SIGKILL
   at `--syncer-kill-at` seconds (a `kill_syncer` fault the launcher carries out). The restarted
   syncer recovers Θ from the units (docs/deployments.md "The syncer dying"). Reported: what it recovered,
   each unit's longest gap between two merges that include it (its heal time), the final global
   val_loss against the unkilled run's, and the tokens trained against the budget.
Needs build/ddiloco and data/kjv (scripts/demo.sh prepares both).
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_modes  # noqa: E402

ROOT, DDILOCO = compare_modes.ROOT, compare_modes.DDILOCO


def run(cmd, env, log):
    start = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        sys.exit(f"bench_isolated: {' '.join(cmd)} exited {rc}:\n{open(log).read()[-2000:]}")
    return time.monotonic() - start


def step_s(path):
    """Mean wall time per inner step between the first and the last logged train window (the
    same measure for every run: everything a step costs, start-up left out)."""
    ev = [e for e in compare_modes.read_events(path) if e.get("event") == "train"]
    first, last = ev[0], ev[-1]
    return (last["elapsed_s"] - first["elapsed_s"]) / (last["step"] - first["step"])


def syncer_share(run_dir):
    """The syncer's CPU while the units trained, as a share of one core (its done event)."""
    done = [e for e in compare_modes.read_events(os.path.join(run_dir, "metrics.jsonl")) if e["event"] == "done"][-1]
    return done["syncer_train_cpu_s"] / done["train_s"]


def step_times(args, env, flags, one):
    rows = []
    d = os.path.join(args.out, "alone")
    run(["mpirun", "-q", "-np", "1", DDILOCO, "train", "--config", args.config, "--overwrite"]
        + flags(["mode=single", "units.count=1", "units.slowdown=[]", "syncer.quorum=1", f"run.dir={d}"]),
        env, d + ".log")
    rows.append(("alone (mode single): no syncing", step_s(os.path.join(d, "metrics.jsonl")), None))
    d = os.path.join(args.out, "one_job")
    run(["mpirun", "-q", "--oversubscribe", "--bind-to", "none", "-np", "2", DDILOCO, "train",
         "--config", args.config, "--overwrite"] + flags(one + [f"run.dir={d}"]), env, d + ".log")
    rows.append(("one job (MPI windows), decoupled M = 1", step_s(os.path.join(d, "unit_0.jsonl")), syncer_share(d)))
    for mode in args.security.split(","):
        d = os.path.join(args.out, f"isolated_{mode}")
        run([DDILOCO, "launch", "--config", args.config, "--overwrite"]
            + flags(one + [f"wan.security={mode}", f"run.dir={d}"]), env, d + ".log")
        rows.append((f"isolated (ddiloco launch), wan.security={mode}, decoupled M = 1",
                     step_s(os.path.join(d, "unit_0.jsonl")), syncer_share(d)))
    base = rows[0][1]
    print(f"\nstep time, one unit of 1 rank x 1 thread, {args.steps} steps of {os.path.basename(args.config)}")
    print("| run | step time (ms) | ÷ alone | syncer CPU while training (share of a core) |\n|---|---|---|---|")
    for label, s, share in rows:
        cpu = "—" if share is None else f"{100 * share:.1f} %"
        print(f"| {label} | {1e3 * s:.1f} | {s / base:.3f} | {cpu} |", flush=True)


def merge_times_per_unit(ev):
    """Unit → the wall-clock times (s) of the merges that included it, over every syncer process
    of the run (each `start` event carries its clock's zero, unix_s)."""
    times, zero = {}, 0.0
    for e in ev:
        if e["event"] == "start":
            zero = e["unix_s"]
        elif e["event"] == "merge":
            for u in e["units"]:
                times.setdefault(u, []).append(zero + e["elapsed_s"])
    return times


def syncer_heal(args, env):
    runs = {}
    for name, kill in (("unkilled", False), ("syncer_killed", True)):
        d = os.path.join(args.out, name)
        sets = [f"train.steps={args.syncer_steps}", "run.progress=false", f"run.dir={d}"]
        if kill:
            kills = os.path.join(args.out, "kill_syncer.yaml")
            with open(kills, "w") as f:
                f.write(f"faults:\n  - {{kind: kill_syncer, start_s: {args.syncer_kill_at}}}\n")
            sets.append(f"chaos.schedule_file={kills}")
        wall = run([DDILOCO, "launch", "--config", args.config, "--overwrite"]
                   + [a for s in sets + args.set for a in ("--set", s)], env, d + ".log")
        runs[name] = (compare_modes.read_events(os.path.join(d, "metrics.jsonl")), wall)
    base = [e for e in runs["unkilled"][0] if e["event"] == "done"][-1]
    ev, wall = runs["syncer_killed"]
    done = [e for e in ev if e["event"] == "done"][-1]
    rec = [e for e in ev if e["event"] == "syncer_recovered"]
    if not rec:
        sys.exit("bench_isolated: the syncer kill did not take (no syncer_recovered): raise --syncer-steps")
    r = rec[0]
    budget = [e for e in ev if e["event"] == "start"][0]["token_budget"]
    gaps = {u: max(b - a for a, b in zip(t, t[1:])) for u, t in sorted(merge_times_per_unit(ev).items())}
    print(f"\nsyncer killed at {args.syncer_kill_at:.0f} s, {os.path.basename(args.config)} under ddiloco launch, "
          f"{args.syncer_steps} steps ({wall:.0f} s in all)")
    print("| run | final val_loss | ÷ unkilled | tokens | ÷ budget | merges recovered | recover_s | "
          "longest gap between a unit's merges (s), per unit |\n|---|---|---|---|---|---|---|---|")
    print(f"| unkilled | {base['val_loss']:.4f} | 1.000 | {base['tokens']:,} | {base['tokens'] / budget:.4f} | — | — | — |")
    print(f"| syncer killed | {done['val_loss']:.4f} | {done['val_loss'] / base['val_loss']:.3f} | "
          f"{done['tokens']:,} | {done['tokens'] / budget:.4f} | {r['merges_recovered']} of {r['merges_before']} "
          f"| {r['recover_s']:.2f} | {', '.join(f'{g:.2f}' for g in gaps.values())} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "kjv_decoupled.yaml"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--heal-steps", type=int, default=150)
    ap.add_argument("--kill-at", type=float, default=30.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_isolated"))
    ap.add_argument("--parts", default="steps,heal", help="steps, heal, syncer (comma-separated)")
    ap.add_argument("--syncer-steps", type=int, default=600)
    ap.add_argument("--syncer-kill-at", type=float, default=16.0)
    ap.add_argument("--set", action="append", default=[], help="key=value for the synced runs")
    ap.add_argument("--security", default="trusted,authenticated,encrypted",
                    help="wan.security of the isolated step-time runs, one run each (comma-separated)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    _, env = compare_modes.mpirun_train(args.config, [], 1)
    sets = [f"train.steps={args.steps}", "run.threads=1", "run.progress=false", "run.log_every=20",
            "eval.every_steps=0", "checkpoint.at_stop=false"]
    # The syncer's global evaluations (a background thread) are not syncing: off, so that the
    # syncer's core is left to merging and the ratio is the link's and the protocol's cost.
    one = ["units.count=1", "units.ranks=[1]", "units.slowdown=[]", "syncer.quorum=1",
           "syncer.eval_every=1000000"] + args.set

    def flags(extra):
        return [a for s in sets + extra for a in ("--set", s)]

    parts = args.parts.split(",")
    if "steps" in parts:
        step_times(args, env, flags, one)
    if "syncer" in parts:
        syncer_heal(args, env)
    if "heal" not in parts:
        return

    d = os.path.join(args.out, "heal")
    kills = os.path.join(args.out, "kill.yaml")
    with open(kills, "w") as f:
        f.write(f"faults:\n  - {{unit: 1, kind: kill, start_s: {args.kill_at}}}\n")
    wall = run([DDILOCO, "launch", "--config", args.config, "--overwrite"]
               + [a for s in [f"train.steps={args.heal_steps}", "run.progress=false",
                              f"run.dir={d}", f"chaos.schedule_file={kills}"] for a in ("--set", s)],
               env, d + ".log")
    ev = compare_modes.read_events(os.path.join(d, "metrics.jsonl"))
    lost = [e for e in ev if e["event"] == "unit_lost" and not e["reason"].startswith("heartbeat")]
    joined = [e for e in ev if e["event"] == "unit_joined"]
    done = [e for e in ev if e["event"] == "done"][-1]
    if not lost or not joined:
        sys.exit("bench_isolated: the kill did not take (no unit_lost / unit_joined): raise --heal-steps")
    merges = [e["elapsed_s"] for e in ev if e["event"] == "merge"]
    gap = max(b - a for a, b in zip(merges, merges[1:]) if lost[0]["elapsed_s"] - 5 < a < joined[0]["elapsed_s"])
    print(f"\nheal time, {os.path.basename(args.config)} under ddiloco launch, unit 1's leader killed at "
          f"{args.kill_at:.0f} s ({wall:.0f} s in all)")
    print("| unit lost (s) | reason | heal_s | longest gap between merges meanwhile (s) | "
          "global downtime (s) | goodput |\n|---|---|---|---|---|---|")
    print(f"| {lost[0]['elapsed_s']:.1f} | {lost[0]['reason']} | {joined[0]['heal_s']:.2f} | {gap:.2f} | "
          f"{done['global_downtime_s']:.1f} | {100 * done['goodput']:.1f} % |")


if __name__ == "__main__":
    main()

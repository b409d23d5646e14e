#!/usr/bin/python3
"""ddp, diloco and decoupled under one fault schedule and one token budget, side by side.

    /usr/bin/python3 scripts/chaos_compare.py [--config configs/kjv_decoupled.yaml]
        [--modes ddp,diloco,decoupled] [--schedule FILE | chaos keys via --set]
        [--baseline] [--kills] [--launch] [--set key=value ...] [--out runs/chaos]

The fault schedule is drawn once from the config's `chaos:` keys (or read from --schedule),
written to OUT/chaos_schedule.yaml, and replayed in every mode (chaos.schedule_file), so every
mode meets the same crashes, straggler episodes and link degradations at the same wall-clock
times. A schedule file that says which failure-free run its times were written for (`run_s`,
seconds: configs/chaos/kjv_faults.yaml) is fitted to this machine: the failure-free
`decoupled` run goes first, and every start_s and duration_s is scaled by its time ÷ run_s,
so that each fault falls at the same share of the run however fast the machine is (--no-fit
replays the times as written). Each row says how many of the schedule's faults began before
its run ended. --baseline adds a failure-free `decoupled` run. --kills adds `decoupled` in the isolated
deployment under `ddiloco launch`, with every crash of the schedule replaced by a real SIGKILL
of the unit's leader at the same time (kind kill; the launcher restarts the unit's job);
--launch runs every decoupled row there (the failure-free one too), not in one MPI job. Prints one table — goodput, global
downtime, wall time, final global validation loss, tokens processed, rejoins — writes it as
Markdown and JSON, and draws OUT/timeline.png: per mode, each unit's up/down/slow intervals
and the outer updates, from the JSON lines. Needs build/ddiloco and Debian's
python3-matplotlib and python3-yaml.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_modes  # noqa: E402  (same directory)

ROOT = compare_modes.ROOT
DDILOCO = compare_modes.DDILOCO


def draw_schedule(config, sets, out_path):
    """The schedule the config's chaos keys draw, through a syncer-free `ddiloco chaos` call."""
    cmd = [DDILOCO, "chaos", "--config", config, "--out", out_path] + [a for s in sets for a in ("--set", s)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr.strip())
    print(r.stdout.strip())


def fit_schedule(path, baseline_s):
    """Scales the schedule at `path` (with its `run_s`) in place to a failure-free run of
    `baseline_s` seconds; returns the factor."""
    import yaml

    doc = yaml.safe_load(open(path))
    scale = baseline_s / float(doc["run_s"])
    for f in doc["faults"] or []:
        f["start_s"] = round(f["start_s"] * scale, 3)
        if "duration_s" in f:
            f["duration_s"] = round(f["duration_s"] * scale, 3)
    doc["run_s"] = round(baseline_s, 3)
    with open(path, "w") as dst:
        dst.write(f"# scaled by {scale:.4f} (scripts/chaos_compare.py) to a failure-free run of "
                  f"{baseline_s:.1f} s\n")
        yaml.safe_dump(doc, dst, default_flow_style=None, sort_keys=False)
    return scale


def faults_in_run(schedule, run_s):
    """(faults that began before the run ended, faults) of a schedule file."""
    import yaml

    faults = yaml.safe_load(open(schedule))["faults"] or []
    return sum(f["start_s"] < run_s for f in faults), len(faults)


def summarise(run_dir, row):
    events = compare_modes.read_events(os.path.join(run_dir, "metrics.jsonl"))
    done = [e for e in events if e["event"] == "done"][-1]
    # Rejoins as the units logged them (in ddp no syncer serves them).
    rejoins = sum(e["event"] == "rejoin" for u in range(row["units"])
                  for e in compare_modes.read_events(os.path.join(run_dir, f"unit_{u}.jsonl")))
    rejoins += done.get("unit_restarts", 0)  # isolated: processes that died and came back
    row.update(goodput=done["goodput"], downtime_s=done["global_downtime_s"],
               downtime_episodes=done["downtime_episodes"], rejoins=rejoins,
               time=done["time"], booking_error=done["booking_error_max"])
    return row


def table(rows):
    head = ("| run | goodput | global downtime (s) | wall time (s) | final global val loss | "
            "tokens | rejoins | compute / discarded / waiting / down (rank-s) |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        t = r["time"]
        lines.append(f"| {r['label']} | {100 * r['goodput']:.1f} % | {r['downtime_s']:.1f} | "
                     f"{r['train_s']:.1f} | {r['val_loss']:.4f} | {r['tokens']:,} | {r['rejoins']} | "
                     f"{t['compute_s']:.0f} / {t['discarded_s']:.0f} / {t['wait_s']:.0f} / "
                     f"{t['down_s']:.0f} |")
    return "\n".join(lines)


def timeline(rows, schedule, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import yaml

    faults = yaml.safe_load(open(schedule))["faults"] or []
    fig, axes = plt.subplots(len(rows), 1, figsize=(11, 1.0 + 1.3 * len(rows)), squeeze=False)
    for ax, r in zip(axes[:, 0], rows):
        units = r["units"]
        end = r["train_s"]
        for u in range(units):
            ax.broken_barh([(0, end)], (u - 0.35, 0.7), color="#cfe8cf")
            ev = compare_modes.read_events(os.path.join(r["dir"], f"unit_{u}.jsonl"))
            crashes = [e for e in ev if e["event"] == "crash"]
            rejoins = [e for e in ev if e["event"] == "rejoin"]
            if not crashes:  # isolated: a killed process logs nothing; the syncer saw it go
                syncer_ev = compare_modes.read_events(os.path.join(r["dir"], "metrics.jsonl"))
                crashes = [e for e in syncer_ev if e["event"] == "unit_lost" and e["unit"] == u]
                rejoins = [e for e in syncer_ev if e["event"] == "unit_connected" and e["unit"] == u][1:]
            for i, c in enumerate(crashes):
                back = rejoins[i]["elapsed_s"] if i < len(rejoins) else end
                ax.broken_barh([(c["elapsed_s"], back - c["elapsed_s"])], (u - 0.35, 0.7),
                               color="#e06666")
            if r["chaos"]:
                for f in faults:
                    if f["unit"] == u and f["kind"] in ("slow", "link") and f["start_s"] < end:
                        ax.broken_barh([(f["start_s"], min(f["duration_s"], end - f["start_s"]))],
                                       (u - 0.35, 0.25 if f["kind"] == "link" else 0.7),
                                       color="#f6b26b" if f["kind"] == "slow" else "#6fa8dc")
        merges = [e["elapsed_s"] for e in compare_modes.read_events(os.path.join(r["dir"], "metrics.jsonl"))
                  if e["event"] == "merge"]
        if r["mode"] == "ddp":  # every step updates the model: show unit 0's logged steps
            merges = [e["elapsed_s"] for e in compare_modes.read_events(os.path.join(r["dir"], "unit_0.jsonl"))
                      if e["event"] == "train"]
        ax.vlines(merges, units - 0.4, units + 0.4, color="black", lw=0.6)
        ax.set_yticks(list(range(units)) + [units])
        ax.set_yticklabels([f"unit {u}" for u in range(units)] + ["updates"])
        ax.set_xlim(0, max(x["train_s"] for x in rows))
        ax.set_title(f"{r['label']}: goodput {100 * r['goodput']:.1f} %, global downtime "
                     f"{r['downtime_s']:.0f} s", fontsize=9)
    axes[-1, 0].set_xlabel("wall time (s); green up, red down, orange slow, blue degraded link")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "kjv_decoupled.yaml"))
    ap.add_argument("--modes", default="ddp,diloco,decoupled")
    ap.add_argument("--schedule", help="fault schedule file to replay (else drawn from chaos keys)")
    ap.add_argument("--baseline", action="store_true", help="also run decoupled without faults")
    ap.add_argument("--kills", action="store_true",
                    help="also run decoupled under ddiloco launch with each crash a real kill -9")
    ap.add_argument("--launch", action="store_true",
                    help="run decoupled under ddiloco launch (the isolated deployment) in every row")
    ap.add_argument("--no-fit", action="store_true",
                    help="replay the schedule's times as written, even where it gives run_s")
    ap.add_argument("--set", action="append", default=[], help="key=value for every run")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "chaos"))
    args = ap.parse_args()
    if not os.access(DDILOCO, os.X_OK):
        sys.exit(f"chaos_compare: {DDILOCO} not found; run scripts/build.sh first")
    os.makedirs(args.out, exist_ok=True)
    schedule = os.path.abspath(os.path.join(args.out, "chaos_schedule.yaml"))
    if args.schedule:
        with open(args.schedule) as src:  # read first: it may be the copy from an earlier run
            text = src.read()
        with open(schedule, "w") as dst:
            dst.write(text)
    else:
        draw_schedule(args.config, args.set, schedule)
    fit = False
    if args.schedule and not args.no_fit:
        import yaml
        fit = "run_s" in (yaml.safe_load(open(schedule)) or {})
    runs = [(m, m, True) for m in args.modes.split(",") if m]
    if fit:  # the failure-free run first: its time scales the schedule
        runs.insert(0, ("decoupled", "decoupled, no faults", False))
    elif args.baseline:
        runs.append(("decoupled", "decoupled, no faults", False))
    scale = None
    if args.kills:
        runs.append(("decoupled", "decoupled, kill -9 (launch)", "kills"))
    rows = []
    for mode, label, chaos in runs:
        if chaos == "kills":
            import yaml
            faults = yaml.safe_load(open(schedule))["faults"] or []
            for f in faults:
                if f["kind"] == "crash":
                    f.update(kind="kill", rank=0)
                    f.pop("duration_s", None)
            kill_schedule = os.path.join(args.out, "kill_schedule.yaml")
            with open(kill_schedule, "w") as dst:
                yaml.safe_dump({"faults": faults}, dst, default_flow_style=None)
        sets = [s for s in args.set if chaos or not s.startswith("chaos.")]
        sets += [f"chaos.schedule_file={kill_schedule if chaos == 'kills' else schedule}"] if chaos else ["chaos.schedule_file=",
                                                                   "chaos.crash_mtbf_s=0",
                                                                   "chaos.slow_mtbf_s=0",
                                                                   "chaos.link_mtbf_s=0"]
        run_dir = os.path.join(args.out, label.replace(", ", "_").replace(" ", "_"))
        sub = argparse.Namespace(config=args.config, set=sets)
        row = compare_modes.run_mode(mode, sub, run_dir,
                                     launch=chaos == "kills" or (args.launch and mode == "decoupled"))
        start = compare_modes.read_events(os.path.join(run_dir, "metrics.jsonl"))[0]
        row.update(label=label, dir=run_dir, chaos=chaos, units=start["units"])
        if chaos:
            row["faults_in_run"] = faults_in_run(kill_schedule if chaos == "kills" else schedule,
                                                 row["train_s"])
        rows.append(summarise(run_dir, row))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        if fit and scale is None:
            scale = fit_schedule(schedule, row["train_s"])
            print(f"chaos_compare: the schedule's times scaled by {scale:.3f} to this machine's "
                  f"failure-free run of {row['train_s']:.1f} s ({schedule})", flush=True)
    text = table(rows)
    notes = []
    base = [r for r in rows if not r["chaos"]]
    for r in rows:
        if base and r["chaos"] and r["mode"] == "decoupled":
            notes.append(f"decoupled under faults vs without: val loss "
                         f"{r['val_loss'] / base[0]['val_loss']:.4f}x, wall time "
                         f"{r['train_s'] / base[0]['train_s']:.3f}x")
    notes.append("worst booking error (|booked − allocated| ÷ allocated, any rank): "
                 + ", ".join(f"{r['label']} {100 * r['booking_error']:.2f} %" for r in rows))
    if scale is not None:
        notes.append(f"schedule times scaled by {scale:.3f} to the failure-free run")
    notes.append("faults that began before the run ended: "
                 + ", ".join(f"{r['label']} {r['faults_in_run'][0]} of {r['faults_in_run'][1]}"
                             for r in rows if r["chaos"]))
    missed = [r["label"] for r in rows if r["chaos"] and r["faults_in_run"][0] < r["faults_in_run"][1]]
    if missed:
        notes.append("WARNING: the schedule outlasts " + ", ".join(missed)
                     + ": not every fault happened (fit it to the run: give the file run_s)")
    title = f"faults from {os.path.relpath(schedule, ROOT)} on {os.path.basename(args.config)}"
    print("\n" + title + "\n" + text + "\n" + "\n".join(notes))
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(title + "\n\n" + text + "\n\n" + "\n".join(notes) + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"config": args.config, "sets": args.set, "schedule_scale": scale, "rows": rows}, f, indent=1)
    try:
        timeline(rows, schedule, os.path.join(args.out, "timeline.png"))
        print(f"chaos_compare: wrote {args.out}/summary.md, summary.json, timeline.png")
    except ImportError:
        print("chaos_compare: matplotlib missing: no timeline (scripts/install_deps.sh installs it)")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""ddp, diloco, streaming and decoupled over the same emulated WAN links, at several bandwidths.

    /usr/bin/python3 scripts/wan_experiment.py [--config configs/paper_regime.yaml]
        [--bandwidths 0.7] [--latency-ms 0.4]
        [--runs decoupled,decoupled:wan.format=bf16,...,ddp:train.lr=4e-3;...]
        [--seeds 1337,1338,1339] [--target LOSS | --target-ratio 1.04] [--max-run-s 150]
        [--ddp-eval-steps 240]
        [--set key=value ...] [--out runs/wan_experiment] [--report-only]

One model and token budget (the config's); every run differs only in its mode (and what a
run spec adds after ':', e.g. decoupled:wan.format=int4), its seed and the link bandwidth. For
each bandwidth (Mbit/s per unit link, each direction) the outer modes run once per seed (the
table gives the mean and the spread); then ddp runs once per seed on unlimited links (its
arithmetic does not depend on the link or on timing: its loss is the same over any link), and
once, with the first seed, over each slow link.

Printed and written (summary.md, summary.json, loss.png in --out):
  * per run: bytes across the links per token, wall time to the target validation loss (the
    first global evaluation at or below it), final validation loss, tokens, train time;
  * per bandwidth: decoupled's speed-up to the target over ddp, and ddp's bytes per token over
    each outer run's;
  * what the links emulate, by the scaling rule (docs/wan.md, "Emulated WAN links"): the time one
    bf16 copy of the model takes on a link, in inner steps, and the bandwidth that gives a
    12B-parameter model with 1 s inner steps the same ratio;
  * a PNG of global validation loss against wall time, one panel per bandwidth.

The target defaults to --target-ratio (1.04, the parity bar of issue 31) × ddp's mean final
loss on unlimited links, or, without a ddp run, to the worst final loss of the decoupled runs. A ddp run over a slow link is
stopped with SIGUSR1 once it has reached the target and its budget would take longer than
--max-run-s (its time to the target is measured), or after --max-run-s without reaching it (its
time to the target is then projected: the tokens the same seed needed on unlimited links at
the pace it kept); its final loss is then not reported. ddp's arithmetic does not depend on
the links, so its loss at every evaluation is the same at every bandwidth; the script checks
that on the evaluations the runs share. ddp evaluates every --ddp-eval-steps steps (outer.h,
which ddp's training does not use, sets that cadence). --report-only rebuilds the table, the
notes and the PNG from --out's summary.json (e.g. for another --target) without running.

Needs build/ddiloco (scripts/build.sh), data/kjv (scripts/demo.sh or `build/ddiloco
prepare-data --source kjv --out data/kjv`) and Debian's python3-matplotlib for the PNG.
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_modes import DDILOCO, ROOT, job_ranks, mpirun_train, read_events  # noqa: E402

OUTER = ("diloco", "streaming", "decoupled")


def parse_runs(text):
    runs = []
    for spec in text.split(","):
        spec = spec.strip()
        if not spec:
            continue
        mode, _, extra = spec.partition(":")
        if mode not in ("ddp",) + OUTER:
            sys.exit(f"wan_experiment: --runs: unknown mode '{mode}' in '{spec}'")
        sets = [s for s in extra.split(";") if s]
        for s in sets:
            if "=" not in s:
                sys.exit(f"wan_experiment: --runs: '{s}' in '{spec}' is not key=value")
        runs.append({"name": spec, "mode": mode, "sets": sets})
    if not runs:
        sys.exit("wan_experiment: --runs is empty")
    return runs


def first_at_or_below(curve, target):
    for tokens, sec, loss in curve:
        if loss <= target:
            return sec
    return None


def run_one(run, bandwidth, args, run_dir, target, seed):
    sets = list(args.set) + run["sets"] + [
        f"mode={run['mode']}", f"run.dir={run_dir}", "run.progress=false", f"run.seed={seed}",
        f"wan.bandwidth_mbit_s={bandwidth}", f"wan.latency_ms={args.latency_ms}"]
    if run["mode"] == "ddp":
        sets += [f"outer.h={args.ddp_eval_steps}", "syncer.eval_every=1"]
    cmd, env = mpirun_train(args.config, sets, job_ranks(args.config, sets))
    print(f"wan_experiment: {run['name']} at {bandwidth} Mbit/s: "
          f"{' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    os.makedirs(run_dir, exist_ok=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    stopped = False
    with open(os.path.join(run_dir, "console.log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        while proc.poll() is None:
            time.sleep(1.0)
            if target is None or stopped or not os.path.exists(metrics):
                continue
            try:
                events = read_events(metrics)
            except (json.JSONDecodeError, OSError):
                continue  # a line being written
            start = next((e for e in events if e["event"] == "start"), None)
            evals = [e for e in events if e["event"] == "global_eval" and "val_loss" in e]
            if not start or not evals:
                continue
            last = evals[-1]
            if run["mode"] == "ddp" and last["elapsed_s"] > args.max_run_s and bandwidth > 0:
                # Too slow to reach the target here: its time to it is projected from its pace
                # and the tokens ddp needs on unlimited links (the same arithmetic).
                print(f"wan_experiment: {run['name']} ran {last['elapsed_s']:.0f} s (--max-run-s) at "
                      f"{bandwidth} Mbit/s: stopping it (SIGUSR1)", flush=True)
                proc.send_signal(signal.SIGUSR1)
                stopped = True
                continue
            if not any(e["val_loss"] <= target for e in evals):
                continue
            projected = last["elapsed_s"] * start["token_budget"] / max(1, last["tokens"])
            if projected > args.max_run_s:
                print(f"wan_experiment: {run['name']} reached the target {target:.4f} at "
                      f"{last['elapsed_s']:.1f} s; projected {projected:.0f} s for its budget: "
                      "stopping it (SIGUSR1)", flush=True)
                proc.send_signal(signal.SIGUSR1)
                stopped = True
        rc = proc.wait()
    # An interrupted job exits with 128 + the signal (docs/checkpoints.md, "Checkpoints and resume").
    if rc != 0 and not (stopped and rc == 128 + signal.SIGUSR1):
        tail = open(os.path.join(run_dir, "console.log")).read()[-2000:]
        raise RuntimeError(f"{run['name']} at {bandwidth} Mbit/s failed (exit {rc}):\n{tail}")
    events = read_events(metrics)
    done = [e for e in events if e["event"] == "done"][-1]
    start = next(e for e in events if e["event"] == "start")
    evals = [e for e in events if e["event"] == "global_eval"]
    steps = [e["step_s"] for f in os.listdir(run_dir) if f.startswith("unit_") and f.endswith(".jsonl")
             for e in read_events(os.path.join(run_dir, f)) if e["event"] == "train" and "step_s" in e]
    return {
        "run": run["name"], "mode": run["mode"], "bandwidth_mbit_s": bandwidth, "seed": seed,
        "parameters": start["parameters"], "format": done["wan_format"],
        "val_loss": None if stopped else done["val_loss"],
        "stopped": stopped,
        "tokens": done["tokens"], "token_budget": start["token_budget"], "train_s": done["train_s"],
        "bytes": done["bytes_across_units"], "bytes_per_token": done["bytes_per_token"],
        "links": done["links"], "merges": done["merges"],
        "step_s_median": sorted(steps)[len(steps) // 2] if steps else None,
        "curve": [(e["tokens"], e["elapsed_s"], e["val_loss"]) for e in evals],
    }


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def spread(xs):
    if len(xs) < 2:
        return None
    m = mean(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def projected_time(row, rows, target):
    """A run stopped before the target (ddp over a slow link): the tokens the same run and seed
    needed on another link, at this run's pace (elapsed s per token at its last evaluation).
    None when no such run reached the target."""
    if not row["stopped"] or not row["curve"]:
        return None
    for other in rows:
        if other is row or other["run"] != row["run"] or other.get("seed") != row.get("seed"):
            continue
        tokens = next((t for t, _, loss in other["curve"] if loss <= target), None)
        if tokens is not None:
            last_tokens, last_s, _ = row["curve"][-1]
            return tokens * last_s / max(1, last_tokens)
    return None


def groups(rows, target):
    """Repeats of one run at one bandwidth, summarised: means, and the sample standard deviation
    of the final loss."""
    out = {}
    for r in rows:
        g = out.setdefault((r["bandwidth_mbit_s"], r["run"]), {
            "bandwidth_mbit_s": r["bandwidth_mbit_s"], "run": r["run"], "mode": r["mode"],
            "format": r["format"], "rows": []})
        g["rows"].append(r)
    for g in out.values():
        rs = g["rows"]
        measured = [first_at_or_below(r["curve"], target) for r in rs]
        projected = [None if t is not None else projected_time(r, rows, target) for r, t in zip(rs, measured)]
        times = [m if m is not None else p for m, p in zip(measured, projected)]
        finals = [r["val_loss"] for r in rs if r["val_loss"] is not None]
        g.update(n=len(rs), bytes_per_token=mean([r["bytes_per_token"] for r in rs]),
                 time_to_target=mean([t for t in times if t is not None]),
                 reached=sum(t is not None for t in times),
                 val_loss=mean(finals), val_loss_sd=spread(finals),
                 stopped=any(r["stopped"] for r in rs),
                 projected=any(p is not None for p in projected),
                 tokens=mean([r["tokens"] for r in rs]), train_s=mean([r["train_s"] for r in rs]))
    # Fastest links first (0 = unlimited), then the runs in the order they were given.
    order = {name: i for i, name in enumerate(dict.fromkeys(r["run"] for r in rows))}
    return sorted(out.values(), key=lambda g: (-(float("inf") if g["bandwidth_mbit_s"] == 0 else g["bandwidth_mbit_s"]),
                                                order[g["run"]]))


def table(rows, target):
    """One line per run and bandwidth; loss and bytes also as ratios to ddp's (its mean final
    loss on unlimited links, every seed: the same arithmetic as over any link)."""
    summary = groups(rows, target)
    ddp = next((g for g in summary if g["mode"] == "ddp" and g["val_loss"]), None)
    lines = ["| link (Mbit/s) | run | seeds | bytes/token | ddp's bytes ÷ | time to target (s) | final val loss | "
             "÷ ddp | tokens | train time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for g in summary:
        if g["reached"] == 0:
            t = "not reached"
        else:
            t = fmt(g["time_to_target"], ".1f") + ("" if g["reached"] == g["n"] else f" ({g['reached']} of {g['n']})")
            if g["projected"]:
                t += " (projected)"
        if g["stopped"]:
            final = "stopped early"
        else:
            final = fmt(g["val_loss"], ".4f") + (f" ± {g['val_loss_sd']:.4f}" if g["val_loss_sd"] else "")
        bytes_ratio = ddp["bytes_per_token"] / g["bytes_per_token"] if ddp and g["bytes_per_token"] else None
        loss_ratio = g["val_loss"] / ddp["val_loss"] if ddp and g["val_loss"] and not g["stopped"] else None
        lines.append(f"| {g['bandwidth_mbit_s']} | {g['run']} | {g['n']} | {g['bytes_per_token']:.3f} | "
                     f"{fmt(bytes_ratio, ',.0f')} | {t} | {final} | {fmt(loss_ratio, '.3f')} | {g['tokens']:,.0f} | "
                     f"{g['train_s']:.1f} |")
    return "\n".join(lines)


def comparisons(rows, target, bandwidths):
    out = []
    summary = groups(rows, target)
    for bw in bandwidths:
        at = [g for g in summary if g["bandwidth_mbit_s"] == bw]
        ddp = next((g for g in at if g["mode"] == "ddp"), None)
        if ddp is None:
            continue
        t_ddp = ddp["time_to_target"]
        for r in at:
            if r is ddp:
                continue
            t = r["time_to_target"]
            speed = (f"{t_ddp / t:.1f}x faster to the target" if t and t_ddp else "no time to compare")
            out.append(f"{bw} Mbit/s: {r['run']} vs ddp: {speed}; "
                       f"ddp moves {ddp['bytes_per_token'] / r['bytes_per_token']:.0f}x its bytes per token")
    bf16 = {g["bandwidth_mbit_s"]: g for g in summary if g["run"] == "decoupled"}
    for r in summary:
        if r["mode"] == "decoupled" and r["run"] != "decoupled" and r["val_loss"] and \
                bf16.get(r["bandwidth_mbit_s"], {}).get("val_loss"):
            base = bf16[r["bandwidth_mbit_s"]]
            out.append(f"{r['bandwidth_mbit_s']} Mbit/s: {r['run']}: mean final loss {r['val_loss']:.4f} "
                       f"vs decoupled ({base['format']}) {base['val_loss']:.4f}: "
                       f"{100 * (r['val_loss'] / base['val_loss'] - 1):+.2f} % (over {r['n']} and {base['n']} runs)")
    return out


def check_ddp_identical(rows):
    """ddp's values do not depend on the link: every evaluation that runs of one seed share has
    one loss."""
    seen, mismatches = {}, []
    for r in rows:
        if r["mode"] != "ddp":
            continue
        for tokens, _, loss in r["curve"]:
            key = (r["run"], r.get("seed"), tokens)
            if key in seen and seen[key] != loss:
                mismatches.append((r["run"], r.get("seed"), tokens, seen[key], loss))
            seen.setdefault(key, loss)
    return mismatches


def scaling_lines(rows, bandwidths):
    """The ratio the scaling rule keeps: one bf16 model over a link, in inner steps."""
    ref = next((r for r in rows if r["run"] == "decoupled" and r["step_s_median"]), None)
    if ref is None:
        return []
    n, step = ref["parameters"], ref["step_s_median"]
    lines = [f"model: {n:,} parameters; inner step {1e3 * step:.1f} ms (decoupled, median over units)"]
    for bw in bandwidths:
        if bw <= 0:
            continue
        steps = (2 * n / (bw * 1e6 / 8)) / step
        equiv = bw * 1e6 * (12e9 / n) * (step / 1.0) / 1e9
        lines.append(f"{bw} Mbit/s: one bf16 model crosses a link in {steps:.0f} inner steps — as a "
                     f"12B-parameter model with 1 s steps on {equiv:.1f} Gbit/s")
    return lines


def plot(rows, bandwidths, target, path, title):
    """Loss against wall time; the first repeat of each run (the others are in summary.json)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(bandwidths), figsize=(5.5 * len(bandwidths), 4), squeeze=False)
    for ax, bw in zip(axes[0], bandwidths):
        for r in rows:
            if r["bandwidth_mbit_s"] != bw or not r["curve"] or r["repeat"] > 0:
                continue
            _, sec, loss = zip(*r["curve"])
            ax.plot(sec, loss, "o-", ms=2.5, label=r["run"])
        ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target:.3f}")
        ax.set_xscale("log")
        ax.set_xlabel("wall time (s, log)")
        ax.set_ylabel("global validation loss (nats/byte)")
        ax.set_title(f"{bw} Mbit/s per unit link" if bw > 0 else "unlimited links")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "paper_regime.yaml"))
    ap.add_argument("--bandwidths", default="0.7", help="Mbit/s per unit link, comma-separated")
    ap.add_argument("--latency-ms", type=float, default=0.4)
    # Each mode at its best of one sweep (docs/results.md, "The paper's claim"): the config
    # holds decoupled's (int4); ddp runs at its own batch and lr, diloco and streaming at theirs.
    ap.add_argument("--runs", default=",".join([
        "decoupled", "decoupled:wan.format=bf16", "decoupled:wan.format=int2",
        "decoupled:wan.format=sparse;outer.anchor=reference;outer.lr=2;outer.momentum=0;"
        "wan.ef_decay=0.95;outer.merge=mean;wan.topk=48;wan.down_topk=192",
        "diloco:train.lr=3e-3", "streaming:train.lr=3e-3",
        "ddp:wan.format=bf16;train.batch_size=8;train.steps=8000;train.lr=4e-3;train.warmup_steps=200"]))
    ap.add_argument("--seeds", default="1337,1338,1339", help="run.seed of each run of a mode at a bandwidth")
    ap.add_argument("--target", type=float, default=None, help="validation loss to time the runs to")
    ap.add_argument("--target-ratio", type=float, default=1.04,
                    help="without --target: this × ddp's mean final loss on unlimited links")
    ap.add_argument("--max-run-s", type=float, default=150)
    ap.add_argument("--ddp-eval-steps", type=int, default=240)
    ap.add_argument("--set", action="append", default=[], help="key=value for every run")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "wan_experiment"))
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    if args.report_only:
        with open(os.path.join(args.out, "summary.json")) as f:
            saved = json.load(f)
        rows = saved["rows"]
        bandwidths = sorted({r["bandwidth_mbit_s"] for r in rows}, key=lambda b: float("inf") if b == 0 else b,
                            reverse=True)
        report(rows, bandwidths, args.target if args.target is not None else default_target(rows, args.target_ratio),
               saved["latency_ms"], saved["config"], saved["sets"], args.out)
        return
    if not os.access(DDILOCO, os.X_OK):
        sys.exit(f"wan_experiment: {DDILOCO} not found; run scripts/build.sh first")
    try:
        bandwidths = sorted({float(b) for b in args.bandwidths.split(",") if b.strip()},
                            key=lambda b: float("inf") if b == 0 else b, reverse=True)
    except ValueError:
        sys.exit(f"wan_experiment: --bandwidths: expected numbers in Mbit/s, got '{args.bandwidths}'")
    if not bandwidths or any(b < 0 for b in bandwidths):
        sys.exit(f"wan_experiment: --bandwidths: expected numbers ≥ 0 (0 = unlimited), got '{args.bandwidths}'")
    runs = parse_runs(args.runs)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        sys.exit(f"wan_experiment: --seeds: expected integers, comma-separated, got '{args.seeds}'")
    os.makedirs(args.out, exist_ok=True)
    target, rows = args.target, []
    # The outer modes at every bandwidth first (they set the target), then ddp: every seed on
    # unlimited links (its loss does not depend on the link), and the first seed over each slow
    # link, stopped after --max-run-s (its time to the target is then projected).
    ddp_bandwidths = [0.0] + [b for b in bandwidths if b > 0]
    plan = [(bw, run, seeds) for run in runs if run["mode"] != "ddp" for bw in bandwidths] + \
           [(bw, run, seeds if bw == 0 else seeds[:1]) for run in runs if run["mode"] == "ddp"
            for bw in ddp_bandwidths]
    bandwidths = sorted(set(bandwidths) | ({0.0} if any(r["mode"] == "ddp" for r in runs) else set()),
                        key=lambda b: float("inf") if b == 0 else b, reverse=True)
    for bw, run, run_seeds in plan:
        if target is None and run["mode"] == "ddp" and bw > 0:  # its stop needs the target
            target = default_target(rows, args.target_ratio)
        name = run["name"].replace(":", "_").replace("=", "-").replace(";", "_")
        for k, seed in enumerate(run_seeds):
            row = run_one(run, bw, args, os.path.join(args.out, f"{bw:g}", f"{name}_{seed}"), target, seed)
            row["repeat"] = k
            rows.append(row)
            print(table([row], target if target is not None else float("-inf")).splitlines()[-1], flush=True)
    if target is None:
        target = default_target(rows, args.target_ratio)
    report(rows, bandwidths, target, args.latency_ms, args.config, args.set, args.out)


def default_target(rows, ratio):
    """ratio × ddp's mean final loss on unlimited links; without one, the worst decoupled run's."""
    ddp = [r["val_loss"] for r in rows if r["mode"] == "ddp" and r["bandwidth_mbit_s"] == 0 and r["val_loss"]]
    if ddp:
        target = ratio * sum(ddp) / len(ddp)
        print(f"wan_experiment: target validation loss {target:.4f} ({ratio:g} × ddp's mean final loss)", flush=True)
    else:
        target = worst_decoupled(rows)
        print(f"wan_experiment: target validation loss {target:.4f} (the worst final loss of the decoupled runs)",
              flush=True)
    return target


def worst_decoupled(rows):
    finals = [r["val_loss"] for r in rows if r["mode"] == "decoupled" and r["val_loss"] is not None]
    if not finals:
        finals = [r["val_loss"] for r in rows if r["val_loss"] is not None]
    if not finals:
        sys.exit("wan_experiment: no finished run to take the target from: give --target LOSS "
                 "(or add a decoupled run to --runs)")
    return max(finals)


def report(rows, bandwidths, target, latency_ms, config, sets, out):
    text = table(rows, target)
    notes = comparisons(rows, target, bandwidths) + scaling_lines(rows, bandwidths)
    mismatches = check_ddp_identical(rows)
    notes.append("ddp: the same loss at every evaluation the bandwidths share" if not mismatches
                 else f"ddp: losses differ between bandwidths at {len(mismatches)} evaluations: {mismatches[:3]}")
    title = (f"{os.path.basename(config)}: target val loss {target:.4f}, "
             f"latency {latency_ms} ms one way" + (", " + ", ".join(sets) if sets else ""))
    print("\n" + title + "\n" + text + "\n" + "\n".join(notes))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"config": config, "sets": sets, "target": target,
                   "latency_ms": latency_ms, "rows": rows, "notes": notes}, f, indent=1)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(title + "\n\n" + text + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    try:
        plot(rows, bandwidths, target, os.path.join(out, "loss.png"), title)
        print(f"wan_experiment: wrote {out}/summary.md, summary.json, loss.png")
    except ImportError:
        print("wan_experiment: matplotlib missing: no plot (scripts/install_deps.sh installs it)")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Run ddp, diloco, streaming and decoupled on one configuration, side by side, and compare.

    /usr/bin/python3 scripts/compare_modes.py [--config configs/kjv_decoupled.yaml]
        [--modes ddp,diloco,streaming,decoupled] [--set key=value ...] [--out runs/compare]
        [--label NAME] [--keep-going]

A --modes entry may carry settings of its own after a colon, `;`-separated: e.g.
`diloco:outer.lr=1;outer.momentum=0` runs diloco at the setting the sweep found best for it
(scripts/sweep.py), the other modes at the config's. Otherwise each mode runs the same config
with only `mode` changed (mpirun with 1 syncer + the units of
the config; everything else equal: model, data, token budget, seed). Prints one table:
final global validation loss, tokens processed, tokens/s, wall time, bytes across units (MB
and per token), merges; writes it as JSON and Markdown, and a PNG of global validation loss
against tokens and against wall time. Needs build/ddiloco (scripts/build.sh) and Debian's
python3-matplotlib; call with /usr/bin/python3.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DDILOCO = os.path.join(ROOT, "build", "ddiloco")


def job_ranks(config, sets):
    """The MPI ranks the job needs, as the binary computes them (`ddiloco config --ranks`)."""
    cmd = [DDILOCO, "config", "--config", config, "--ranks"] + [a for s in sets for a in ("--set", s)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr.strip())
    return int(out.stdout)


def mpirun_train(config, sets, ranks):
    """The `ddiloco train` command under mpirun and its environment (as scripts/mpi_env.sh:
    root allowed, shared-memory and TCP transports, no core binding on an oversubscribed node)."""
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.setdefault("OMPI_MCA_pml", "ob1")
    env.setdefault("OMPI_MCA_btl", "self,vader,tcp")
    cmd = (["mpirun", "-q", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), DDILOCO,
            "train", "--config", config, "--overwrite"] + [a for s in sets for a in ("--set", s)])
    return cmd, env


def read_events(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def parse_mode(spec):
    """'mode' or 'mode:key=value;key=value' → (mode, [key=value, ...]); exits on a bad entry."""
    mode, _, extra = spec.partition(":")
    if mode not in ("ddp", "diloco", "streaming", "decoupled"):
        sys.exit(f"compare_modes: --modes: unknown mode '{mode}' in '{spec}'")
    sets = [s for s in extra.split(";") if s]
    for s in sets:
        if "=" not in s:
            sys.exit(f"compare_modes: --modes: '{s}' in '{spec}' is not key=value")
    return mode, sets


def run_mode(spec, args, run_dir, launch=False):
    """One run of `spec` (a mode, with its own settings after a colon): one MPI job (`mpirun
    ddiloco train`), or with `launch` the isolated deployment (`ddiloco launch`: the syncer and
    every unit as their own processes)."""
    mode, own = parse_mode(spec)
    sets = list(args.set) + own + [f"mode={mode}", f"run.dir={run_dir}", "run.progress=false"]
    cmd, env = mpirun_train(args.config, sets, job_ranks(args.config, sets))
    if launch:
        cmd = [DDILOCO, "launch", "--config", args.config, "--overwrite"] + [a for s in sets for a in ("--set", s)]
    print(f"compare_modes: {spec}: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    os.makedirs(run_dir, exist_ok=True)
    start = time.monotonic()
    with open(os.path.join(run_dir, "console.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.monotonic() - start
    if rc != 0:
        tail = open(os.path.join(run_dir, "console.log")).read()[-2000:]
        raise RuntimeError(f"{mode} failed (exit {rc}):\n{tail}")
    events = read_events(os.path.join(run_dir, "metrics.jsonl"))
    done = [e for e in events if e["event"] == "done"][-1]
    evals = [e for e in events if e["event"] == "global_eval"]
    return {
        "mode": spec,
        "val_loss": done["val_loss"],
        "tokens": done["tokens"],
        "tokens_per_s": done["tokens_per_s"],
        "train_s": done["train_s"],
        "wall_s": wall,
        "bytes": done["bytes_across_units"],
        "bytes_per_token": done["bytes_across_units"] / max(1, done["tokens"]),
        "merges": done["merges"],
        "curve": [(e["tokens"], e["elapsed_s"], e["val_loss"]) for e in evals],
    }


def table(rows):
    """One line per run; with a ddp run among them, each run's loss ÷ ddp's and ddp's bytes per
    token ÷ the run's (both directions of every unit's link counted)."""
    ddp = next((r for r in rows if parse_mode(r["mode"])[0] == "ddp"), None)
    head = ("| mode | final global val loss | ÷ ddp | tokens | tokens/s | train time (s) | "
            "bytes across units (MB) | bytes/token | ddp's bytes ÷ | merges |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        loss = f"{r['val_loss'] / ddp['val_loss']:.3f}" if ddp else "—"
        fewer = f"{ddp['bytes_per_token'] / r['bytes_per_token']:,.0f}" if ddp and r["bytes_per_token"] else "—"
        lines.append(f"| {r['mode']} | {r['val_loss']:.4f} | {loss} | {r['tokens']:,} | "
                     f"{r['tokens_per_s']:.0f} | {r['train_s']:.1f} | {r['bytes'] / 1e6:.1f} | "
                     f"{r['bytes_per_token']:.3f} | {fewer} | {r['merges']} |")
    return "\n".join(lines)


def plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        if not r["curve"]:
            continue
        tok, sec, loss = zip(*r["curve"])
        axes[0].plot(tok, loss, "o-", ms=3, label=r["mode"])
        axes[1].plot(sec, loss, "o-", ms=3, label=r["mode"])
    axes[0].set_xlabel("tokens processed by all units")
    axes[1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.set_ylabel("global validation loss (nats/byte)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "kjv_decoupled.yaml"))
    ap.add_argument("--modes", default="ddp,diloco,streaming,decoupled")
    ap.add_argument("--set", action="append", default=[], help="key=value for every mode")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "compare"))
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    if not os.access(DDILOCO, os.X_OK):
        sys.exit(f"compare_modes: {DDILOCO} not found; run scripts/build.sh first")
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        parse_mode(m)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for m in modes:
        name = m.replace(":", "_").replace("=", "-").replace(";", "_")
        rows.append(run_mode(m, args, os.path.join(args.out, name)))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    base = rows[0]
    ratios = []
    for r in rows[1:]:
        ratios.append(f"{r['mode']} vs {base['mode']}: val loss {r['val_loss'] / base['val_loss']:.3f}x, "
                      f"train time {r['train_s'] / base['train_s']:.3f}x, "
                      f"bytes/token {r['bytes_per_token'] / max(1e-12, base['bytes_per_token']):.4f}x")
    title = "modes on " + os.path.basename(args.config) + (f" ({args.label})" if args.label else "")
    if args.set:
        title += " with " + ", ".join(args.set)
    print("\n" + title + "\n" + text + "\n" + "\n".join(ratios))
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"config": args.config, "sets": args.set, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(title + "\n\n" + text + "\n\n" + "\n".join(ratios) + "\n")
    try:
        plot(rows, os.path.join(args.out, "loss.png"), title)
        print(f"compare_modes: wrote {args.out}/summary.md, summary.json, loss.png")
    except ImportError:
        print("compare_modes: matplotlib missing: no plot (scripts/install_deps.sh installs it)")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The goodput simulator's grid as a PNG: goodput against chip count, one line per strategy,
with the paper's 150k-chip column (the calibration targets) marked.

    /usr/bin/python3 scripts/sim_plot.py [--config configs/sim/paper.yaml]
        [--ddiloco build/ddiloco] [--out docs/sim_goodput.png] [--set key=value ...]

Runs `ddiloco simulate --sweep --json` on the config and prints the grid it plots. The
calibration marks come from the config file's `calibration` and `chips.count` (not from
--set). Needs
Debian's python3-matplotlib and python3-yaml (scripts/install_deps.sh installs both).
"""
import argparse
import json
import subprocess
import sys

import yaml


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/sim/paper.yaml")
    ap.add_argument("--ddiloco", default="build/ddiloco")
    ap.add_argument("--out", default="docs/sim_goodput.png")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()

    cmd = [args.ddiloco, "simulate", "--config", args.config, "--sweep", "--json"]
    for s in args.set:
        cmd += ["--set", s]
    try:
        grid = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    except subprocess.CalledProcessError as e:
        sys.exit(f"sim_plot: {' '.join(cmd)} failed:\n{e.stderr}")
    with open(args.config) as f:
        config = yaml.safe_load(f) or {}
    calibration = config.get("calibration", {})
    calib_chips = config.get("chips", {}).get("count")
    learners_list = config.get("sweep", {}).get("learners", [])

    lines = {}
    for r in grid:
        name = r["strategy"] if r["strategy"] != "decoupled" else f"decoupled M={r['learners']}"
        lines.setdefault(name, []).append((r["chips"], r["goodput"]))
    chips = sorted({r["chips"] for r in grid})
    print(f"{'':16}" + "".join(f"{c:>11,}" for c in chips))
    for name, pts in lines.items():
        by_chips = dict(pts)
        print(f"{name:16}" + "".join(f"{100 * by_chips[c]:10.1f}%" for c in chips))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, pts in lines.items():
        xs, ys = zip(*sorted(pts))
        ax.plot(xs, [100 * y for y in ys], marker="o", label=name)
    paper = []
    if "dp" in calibration:
        paper.append(calibration["dp"])
    if "elastic_dp" in calibration:
        paper.append(calibration["elastic_dp"])
    paper += list(calibration.get("decoupled", []))[: len(learners_list)]
    if calib_chips and paper:
        ax.scatter([calib_chips] * len(paper), [100 * p for p in paper], marker="x", s=60,
                   color="black", zorder=5, label="calibration targets (the config's)")
    ax.set_xscale("log")
    ax.set_xticks(chips)
    ax.set_xticklabels([f"{c / 1e6:g}M" if c >= 1e6 else f"{c / 1e3:g}k" for c in chips])
    ax.minorticks_off()
    ax.set_xlabel("chips")
    ax.set_ylabel("goodput (%)")
    ax.set_ylim(0, 101)
    ax.grid(alpha=0.3)
    ax.set_title(f"Simulated goodput ({args.config}, ddiloco simulate --sweep)", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"sim_plot: wrote {args.out}")


if __name__ == "__main__":
    main()

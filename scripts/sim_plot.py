#!/usr/bin/python3
"""The goodput simulator's grid as a PNG: goodput against chip count, one line per strategy,
with the paper's published values marked: the two fitted columns (dp and elastic dp at
calibration.chips) and the compared decoupled values.

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
    calib_chips = calibration.get("chips", [])
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
    # (chips, goodput) of each published value: dp and elastic dp at both fitted columns,
    # decoupled per sweep.learners at the first and calibration.headline_learners at the
    # second (those two only compared).
    fitted, compared = [], []
    for key in ("dp", "elastic_dp"):
        fitted += list(zip(calib_chips, calibration.get(key, [])))
    if calib_chips:
        compared += [(calib_chips[0], g)
                     for g in list(calibration.get("decoupled", []))[: len(learners_list)]]
    if len(calib_chips) > 1 and "headline_decoupled" in calibration:
        compared.append((calib_chips[1], calibration["headline_decoupled"]))
    for points, marker, label in ((fitted, "x", "paper, fitted (dp, elastic dp)"),
                                  (compared, "+", "paper, compared (decoupled)")):
        if points:
            ax.scatter([c for c, _ in points], [100 * g for _, g in points], marker=marker,
                       s=70, color="black", zorder=5, label=label)
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

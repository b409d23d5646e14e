#!/usr/bin/python3
"""Loss curves from one or more metrics.jsonl files (ddiloco's JSON-lines log).

    /usr/bin/python3 scripts/plot_metrics.py RUN/metrics.jsonl [MORE.jsonl ...] --out loss.png
        [--x tokens|elapsed_s] [--labels a,b,...]

Plots train_loss (thin) and val_loss (markers) against tokens processed or wall time.
Uses Debian's python3-matplotlib (call /usr/bin/python3 explicitly).
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_events(path):
    events = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{lineno}: not a JSON object: {e}")
    return events


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--x", choices=["tokens", "elapsed_s"], default="tokens")
    ap.add_argument("--labels", default="")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    labels = args.labels.split(",") if args.labels else [p.split("/")[-2] if "/" in p else p for p in args.metrics]
    if len(labels) != len(args.metrics):
        sys.exit("--labels: need one label per metrics file")

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for path, label in zip(args.metrics, labels):
        events = read_events(path)
        train = [(e[args.x], e["train_loss"]) for e in events if e.get("event") == "train" and "train_loss" in e]
        val = [(e[args.x], e["val_loss"]) for e in events
               if e.get("event") in ("val", "global_eval") and "val_loss" in e]
        line = None
        if train:
            xs, ys = zip(*train)
            (line,) = ax.plot(xs, ys, lw=0.8, alpha=0.6, label=f"{label} train")
        if val:
            xs, ys = zip(*val)
            ax.plot(xs, ys, "o-", ms=3, color=line.get_color() if line else None, label=f"{label} val")
    ax.set_xlabel("tokens processed" if args.x == "tokens" else "wall time (s)")
    ax.set_ylabel("loss (nats per token)")
    if args.title:
        ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"plot_metrics: wrote {args.out}")


if __name__ == "__main__":
    main()

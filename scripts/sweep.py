#!/usr/bin/python3
"""A small grid of training runs on a reduced budget, side by side: mode × batch × inner lr ×
outer lr × outer momentum × H (× seeds), each mode at every point of the grid it uses.

    /usr/bin/python3 scripts/sweep.py [--config configs/kjv_decoupled.yaml] [--steps 300]
        [--modes ddp,diloco,streaming,decoupled] [--batch 8,16] [--inner-lr 6e-3,3e-3]
        [--outer-lr 0.7] [--momentum 0.9] [--h 20] [--seeds 1337] [--set key=value ...]
        [--mode-set MODE:key=value ...]
        [--out runs/sweep]

Every run is the config with the grid point's keys set (train.batch_size, train.lr, outer.lr,
outer.momentum, outer.h, run.seed) and the same token budget: --steps inner steps at the
config's train.batch_size, so a run at batch b takes --steps × batch_size / b steps (and its
learning-rate warm-up, train.warmup_steps, shrinks or grows with them). Everything else is
equal, so every run processes the same tokens (`decoupled` stops at the same token budget). A mode that ignores a
key (ddp and single the outer ones: `ddiloco config` names them) runs once per value of the
keys it uses. `single` runs one unit of one rank at the job's global batch (units × ranks ×
train.batch_size sequences per step), the baseline of plain training on the same batches per
step. Runs already in --out (their metrics.jsonl has a `done` event with the same settings) are
not run again, so a sweep that was stopped goes on where it was.

Prints one table (final global validation loss per run, mean and spread over seeds, the best
setting of each mode, and each mode's best ÷ ddp's best) and writes OUT/summary.json. Needs
build/ddiloco and the config's data (scripts/demo.sh prepares data/kjv).
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_modes  # noqa: E402  (same directory)

ROOT, DDILOCO = compare_modes.ROOT, compare_modes.DDILOCO
OUTER_KEYS = ("outer.lr", "outer.momentum", "outer.h")
MODES = ("ddp", "diloco", "streaming", "decoupled", "single")


def floats(text):
    return [float(x) for x in text.split(",") if x]


def config_get(config, sets, key):
    """A key's value as the binary reads the config with these --set's (`ddiloco config --get`)."""
    cmd = [DDILOCO, "config", "--config", config, "--get", key] + [a for s in sets for a in ("--set", s)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr.strip())
    return r.stdout.strip()


def job_ranks(config, sets):
    """Learner ranks of the whole job (units × their ranks; the syncer not counted)."""
    return compare_modes.job_ranks(config, sets + ["mode=decoupled"]) - 1


def points(args, config_batch):
    """(mode, {key: value}) for every run of the grid, without runs a mode cannot tell apart."""
    seen = set()
    batches = [int(b) for b in floats(args.batch)] if args.batch else [config_batch]
    grid = itertools.product(args.modes.split(","), batches, floats(args.inner_lr), floats(args.outer_lr),
                             floats(args.momentum), [int(h) for h in floats(args.h)],
                             [int(s) for s in floats(args.seeds)])
    for mode, b, lr, olr, mom, h, seed in grid:
        keys = {"train.batch_size": b, "train.lr": lr, "outer.lr": olr, "outer.momentum": mom, "outer.h": h,
                "run.seed": seed}
        if mode in ("ddp", "single"):  # no outer loop (ddp keeps outer.h: its evaluation cadence)
            keys = {k: v for k, v in keys.items() if k not in ("outer.lr", "outer.momentum")}
        if mode == "single":
            keys.pop("outer.h")
        key = (mode, tuple(sorted(keys.items())))
        if key in seen:
            continue
        seen.add(key)
        yield mode, keys


def run_name(mode, keys):
    short = {"train.batch_size": "b", "train.lr": "lr", "outer.lr": "olr", "outer.momentum": "mom", "outer.h": "h", "run.seed": "seed"}
    return mode + "".join(f"_{short[k]}{v:g}" for k, v in sorted(keys.items()))


def done_event(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    done = [e for e in compare_modes.read_events(path) if e["event"] == "done"]
    return done[-1] if done else None


def mode_sets(args, mode):
    """The --mode-set settings of this mode (e.g. ddp:wan.format=bf16, where the config's format
    is one that only the outer modes can send)."""
    out = []
    for spec in args.mode_set:
        m, _, kv = spec.partition(":")
        if "=" not in kv or m not in MODES:
            sys.exit(f"sweep: --mode-set '{spec}': expected MODE:key=value with MODE one of {', '.join(MODES)}")
        if m == mode:
            out.append(kv)
    return out


def budget_sets(args, base, b):
    """train.steps and train.warmup_steps at batch b for the budget of --steps at the config's
    batch `base` (equal tokens; exits when b does not divide that budget into whole steps)."""
    if args.steps * base % b:
        sys.exit(f"sweep: --batch {b}: {args.steps} steps × batch {base} is not a whole number of steps at batch {b}")
    warmup = int(config_get(args.config, args.set, "train.warmup_steps"))
    return [f"train.steps={args.steps * base // b}", f"train.warmup_steps={max(1, warmup * base // b)}"]


def run(args, mode, keys, base):
    run_dir = os.path.join(args.out, run_name(mode, keys))
    b = keys["train.batch_size"]
    sets = (list(args.set) + mode_sets(args, mode) + budget_sets(args, base, b) + ["run.progress=false", "checkpoint.at_stop=false",
            f"run.dir={run_dir}", f"mode={mode}"] + [f"{k}={v}" for k, v in keys.items()])
    if mode == "single":  # one unit of one rank at the job's global batch
        sets += ["units.count=1", "units.ranks=[]", "units.ranks_per_unit=1", "units.slowdown=[]",
                 "syncer.quorum=1", f"train.batch_size={job_ranks(args.config, args.set) * b}"]
    stamp = os.path.join(run_dir, "sweep.json")
    done = done_event(run_dir)
    if done and os.path.exists(stamp) and json.load(open(stamp)) == sets:
        print(f"sweep: {run_name(mode, keys)}: done before, val loss {done['val_loss']:.4f}", flush=True)
        return done["val_loss"], done.get("train_s")
    os.makedirs(run_dir, exist_ok=True)
    ranks = 1 if mode == "single" else compare_modes.job_ranks(args.config, sets)
    cmd, env = compare_modes.mpirun_train(args.config, sets, ranks)
    with open(os.path.join(run_dir, "console.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        sys.exit(f"sweep: {run_name(mode, keys)} exited {rc}:\n" + open(os.path.join(run_dir, "console.log")).read()[-2000:])
    with open(stamp, "w") as f:
        json.dump(sets, f)
    done = done_event(run_dir)
    print(f"sweep: {run_name(mode, keys)}: val loss {done['val_loss']:.4f}", flush=True)
    return done["val_loss"], done.get("train_s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "kjv_decoupled.yaml"))
    ap.add_argument("--steps", type=int, default=300, help="train.steps of every run (the budget)")
    ap.add_argument("--modes", default="ddp,diloco,streaming,decoupled", help="of ddp, diloco, streaming, decoupled, single")
    ap.add_argument("--batch", default="", help="train.batch_size values (sequences per rank per step); "
                    "each at the token budget of --steps at the config's batch")
    ap.add_argument("--inner-lr", default="6e-3", help="train.lr values, comma-separated")
    ap.add_argument("--outer-lr", default="0.7", help="outer.lr values")
    ap.add_argument("--momentum", default="0.9", help="outer.momentum values")
    ap.add_argument("--h", default="20", help="outer.h values")
    ap.add_argument("--seeds", default="1337", help="run.seed values: each grid point runs once per seed")
    ap.add_argument("--set", action="append", default=[], help="key=value for every run")
    ap.add_argument("--mode-set", action="append", default=[], help="MODE:key=value for every run of MODE")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "sweep"))
    args = ap.parse_args()
    if not os.access(DDILOCO, os.X_OK):
        sys.exit(f"sweep: {DDILOCO} not found; run scripts/build.sh first")
    for m in args.modes.split(","):
        if m not in MODES:
            sys.exit(f"sweep: --modes: unknown mode '{m}'")
    os.makedirs(args.out, exist_ok=True)
    base = int(config_get(args.config, args.set, "train.batch_size"))
    results = {}  # (mode, keys without the seed) -> [(seed, loss, train_s)]
    for mode, keys in points(args, base):
        loss, train_s = run(args, mode, keys, base)
        setting = tuple(sorted((k, v) for k, v in keys.items() if k != "run.seed"))
        results.setdefault((mode, setting), []).append((keys["run.seed"], loss, train_s))

    rows = []
    for (mode, setting), runs in results.items():
        losses = [l for _, l, _ in runs]
        rows.append({"mode": mode, "setting": dict(setting), "losses": losses, "seeds": [s for s, _, _ in runs],
                     "mean": statistics.fmean(losses),
                     "spread": (max(losses) - min(losses)) if len(losses) > 1 else 0.0})
    rows.sort(key=lambda r: (r["mode"], r["mean"]))
    best = {}
    for r in rows:
        if r["mode"] not in best or r["mean"] < best[r["mode"]]["mean"]:
            best[r["mode"]] = r
    ref = best.get("ddp")
    print(f"\nsweep: {os.path.basename(args.config)}, {args.steps} steps per unit, "
          f"{len(rows)} settings, seeds {args.seeds}" + (f", with {' '.join(args.set)}" if args.set else ""))
    print("| mode | batch | inner lr | outer lr | momentum | H | final val loss (mean) | spread | runs |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["setting"]
        mark = " **best**" if best[r["mode"]] is r else ""
        print(f"| {r['mode']}{mark} | {s['train.batch_size']} | {s.get('train.lr', '—'):g} | {s.get('outer.lr', '—')} | "
              f"{s.get('outer.momentum', '—')} | {s.get('outer.h', '—')} | {r['mean']:.4f} | "
              f"{r['spread']:.4f} | {len(r['losses'])} |")
    if ref:
        print("\nbest of each mode ÷ ddp's best: " + ", ".join(
            f"{m} {b['mean'] / ref['mean']:.4f}" for m, b in sorted(best.items())))
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"config": args.config, "steps": args.steps, "sets": args.set, "batch": base, "global_batch": base * job_ranks(args.config, args.set),
                   "rows": rows, "best": {m: b["setting"] for m, b in best.items()}}, f, indent=1)
    print(f"sweep: wrote {args.out}/summary.json")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Does the status page cost the merges anything? The merge rate of one `ddiloco launch` job
while its syncer's HTTP endpoint (docs/status_page.md) is left alone, polled by 20 page
clients, held by slow clients, or flooded.

    /usr/bin/python3 scripts/bench_status_page.py [--config configs/kjv_decoupled.yaml]
        [--phase-s 30] [--cycles 2] [--out runs/bench_status_page] [--set key=value ...]

One job (the config's, with an unbounded step budget) runs through `--cycles` rounds of four
phases of `--phase-s` seconds each, interleaved so that a drift of the machine's speed falls
on every phase alike:
  none       nobody asks the endpoint anything
  pollers    20 page clients, each GET /api/state once a second (what 20 open pages do)
  slowloris  40 connections trickling a request's headers a byte a second, never ending them
  flood      GET /api/state and /metrics back to back from 8 connections, in batches of 1,000
The clients run in this process at nice 19, as a load from elsewhere would not take the
learners' cores (on a 2-core machine a client at nice 0 would measure itself). Each phase's
merge rate is its merges (the syncer's metrics.jsonl) over its span on the syncer's clock
(/api/state's elapsed_s at the phase's start and end). Prints each phase's rate, summed over
the cycles, and its ratio to `none`; the goal for `pollers` is >= 0.95. Also each phase's
rate in each cycle (the spread), and the CPU the syncer process (merge loop and HTTP threads)
and this process's clients used, in cores (CPU seconds per second).
Needs build/ddiloco and data/kjv (scripts/demo.sh prepares both).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e", "lib"))
import http_load  # noqa: E402

PHASES = ("none", "pollers", "slowloris", "flood")


def syncer_clock(url):
    with urllib.request.urlopen(url + "api/state", timeout=30) as r:
        return json.loads(r.read())["elapsed_s"]


def wait_for_endpoint(run_dir, proc, timeout_s=300):
    deadline = time.time() + timeout_s
    path = os.path.join(run_dir, "syncer.http")
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"bench_status_page: ddiloco launch exited {proc.returncode}")
        if os.path.exists(path) and merges(run_dir):
            return json.load(open(path))
        time.sleep(0.5)
    sys.exit("bench_status_page: no merges within %d s" % timeout_s)


def merges(run_dir):
    out = []
    try:
        for line in open(os.path.join(run_dir, "metrics.jsonl")):
            if '"event":"merge"' in line and line.endswith("\n"):
                out.append(json.loads(line)["elapsed_s"])
    except FileNotFoundError:
        pass
    return out


def cpu_s(pid):
    """CPU seconds (user + system) process `pid` has used, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_phase(phase, addr, seconds):
    """Loads the endpoint as `phase` says for `seconds`; returns the answers' counts."""
    url = addr["url"]
    stop = threading.Event()
    counts = {}
    if phase == "pollers":
        _, counts = http_load.pollers(url, 20, 1.0, stop)
    elif phase == "slowloris":
        host, port = addr["address"].rsplit(":", 1)
        _, counts = http_load.slowloris(host, int(port), 40, stop)
    end = time.monotonic() + seconds
    if phase == "flood":
        counts = {}
        while time.monotonic() < end:
            for k, v in http_load.flood(url, 1000, workers=8).items():
                counts[k] = counts.get(k, 0) + v
    else:
        time.sleep(max(0.0, end - time.monotonic()))
    stop.set()
    return dict(counts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/kjv_decoupled.yaml")
    ap.add_argument("--phase-s", type=float, default=30)
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--out", default="runs/bench_status_page")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args()
    os.chdir(ROOT)
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    # No synchronous warm-up (outer.warmup_steps): its merges come H times as often, and the
    # phases that fell in it would not compare with those after.
    cmd = ["build/ddiloco", "launch", "--config", a.config, "--overwrite",
           "--set", f"run.dir={a.out}/run", "--set", "train.steps=100000000", "--set", "run.progress=false",
           "--set", "outer.warmup_steps=0"]
    for kv in a.set:
        cmd += ["--set", kv]
    log = open(os.path.join(a.out, "launch.log"), "w")
    # mpirun's environment (root allowed, its transports) as scripts/mpi_env.sh sets it.
    cmd = ["bash", "-c", 'source scripts/mpi_env.sh && exec "$@"', "bench_status_page"] + cmd
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        run_dir = os.path.join(a.out, "run")
        addr = wait_for_endpoint(run_dir, proc)
        time.sleep(10)  # past the start-up: compile-free, but the first evaluations and warm caches
        os.nice(19)  # this thread, and the client threads it starts from now on
        spans = {p: [] for p in PHASES}
        answers = {p: {} for p in PHASES}
        cpu = {p: [0.0, 0.0] for p in PHASES}  # the syncer's, the clients'; CPU seconds
        for cycle in range(a.cycles):
            for phase in PHASES:
                t0, syncer0, me0 = syncer_clock(addr["url"]), cpu_s(addr["pid"]), sum(os.times()[:2])
                got = run_phase(phase, addr, a.phase_s)
                time.sleep(2 if phase == "slowloris" else 0)  # the slow connections close
                t1, syncer1, me1 = syncer_clock(addr["url"]), cpu_s(addr["pid"]), sum(os.times()[:2])
                spans[phase].append((t0, t1))
                cpu[phase][0] += syncer1 - syncer0
                cpu[phase][1] += me1 - me0
                for k, v in got.items():
                    answers[phase][str(k)] = answers[phase].get(str(k), 0) + v
                print(f"cycle {cycle} {phase:9s} {t1 - t0:6.1f} s", flush=True)
    finally:
        proc.send_signal(signal.SIGUSR1)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    times = merges(run_dir)
    rows = {}
    for phase in PHASES:
        counts = [sum(1 for t in times if t0 <= t < t1) for t0, t1 in spans[phase]]
        n, s = sum(counts), sum(t1 - t0 for t0, t1 in spans[phase])
        rows[phase] = {"merges": n, "seconds": s, "rate": n / s, "answers": answers[phase],
                       "syncer_cpu": cpu[phase][0] / s, "client_cpu": cpu[phase][1] / s,
                       "per_cycle": [c / (t1 - t0) for c, (t0, t1) in zip(counts, spans[phase])]}
    base = rows["none"]["rate"]
    print(f"\n{'phase':10s} {'merges':>7s} {'seconds':>8s} {'merges/s':>9s} {'vs none':>8s}  "
          f"{'each cycle, merges/s':24s} {'syncer CPU':>10s} {'clients CPU':>11s}  answers")
    for phase, r in rows.items():
        r["ratio"] = r["rate"] / base
        each = " ".join(f"{x:.2f}" for x in r["per_cycle"])
        print(f"{phase:10s} {r['merges']:7d} {r['seconds']:8.1f} {r['rate']:9.3f} {r['ratio']:8.3f}  "
              f"{each:24s} {r['syncer_cpu']:10.3f} {r['client_cpu']:11.3f}  {r['answers']}")
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump({"config": a.config, "phase_s": a.phase_s, "cycles": a.cycles, "phases": rows}, f, indent=1)
    print(f"\nwritten {a.out}/result.json")


if __name__ == "__main__":
    main()

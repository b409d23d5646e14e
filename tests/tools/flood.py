#!/usr/bin/env python3
"""A flood of connections to the syncer (docs/security.md, "Tests").

    flood.py ADDR PID [--connections 500] [--hold 8] [--sources 1]

Opens CONNECTIONS TCP connections to ADDR at once, from SOURCES loopback addresses in turn
(127.0.0.10 on; 1: the system's choice), so that both the per-address and the global
pending-connection caps are met: the even ones send nothing, the odd ones 1 KiB of random bytes. Holds them HOLD seconds, sampling the syncer's (PID) resident memory and
open files every 0.2 s, then closes them all. Prints one JSON line: connections opened, the
syncer's VmRSS (KiB) and open files before, at most during, and after.
"""
import argparse
import json
import os
import socket
import time


def sample(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("addr")
    p.add_argument("pid", type=int)
    p.add_argument("--connections", type=int, default=500)
    p.add_argument("--hold", type=float, default=8)
    p.add_argument("--sources", type=int, default=1)
    a = p.parse_args()
    host, port = a.addr.rsplit(":", 1)
    rss0, fds0 = sample(a.pid)
    socks = []
    for i in range(a.connections):
        s = socket.socket()
        if a.sources > 1:
            s.bind((f"127.0.0.{10 + i % a.sources}", 0))
        s.setblocking(False)
        try:
            s.connect((host, int(port)))
        except BlockingIOError:
            pass
        socks.append(s)
    garbage = os.urandom(1024)
    sent = set()
    end = time.time() + a.hold
    peak_rss, peak_fds = rss0, fds0
    while time.time() < end:
        for i, s in enumerate(socks):
            if i % 2 == 1 and i not in sent:
                try:
                    s.send(garbage)  # once the connect completed
                    sent.add(i)
                except OSError:
                    continue
        rss, fds = sample(a.pid)
        peak_rss, peak_fds = max(peak_rss, rss), max(peak_fds, fds)
        time.sleep(0.2)
    for s in socks:
        s.close()
    time.sleep(1)
    rss1, fds1 = sample(a.pid)
    print(json.dumps({"connections": a.connections, "garbage_sends": len(sent),
                      "rss_kib": [rss0, peak_rss, rss1], "open_files": [fds0, peak_fds, fds1]}))


if __name__ == "__main__":
    main()

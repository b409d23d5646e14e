#!/usr/bin/python3
"""HTTP clients that load the syncer's status server (docs/status_page.md), stdlib only.

Shared by the hostile-client test (tests/e2e/status_metrics.sh) and the merge-rate benchmark
(scripts/bench_status_page.py):

    pollers(url, n, period_s, stop)   n page clients, each GET /api/state every period_s
    slowloris(host, port, n, stop)    n connections that each send a request's headers one
                                      byte a second and never finish them
    flood(url, requests, workers)     `requests` GETs of /api/state and /metrics, back to back

Each runs on daemon threads until `stop` (a threading.Event) is set, or to its count; none
raises on a refused or dropped connection (the server is allowed to drop them: it is the
merges, not these clients, that the callers measure). Counts of what was answered are
returned in a Counter so that a caller can say what the server did.
"""

import collections
import http.client
import socket
import threading
import time
import urllib.parse


def _split(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port or 80, (u.path.rstrip("/") or "")


def _get(conn, path, counts):
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        counts[r.status] += 1
        return True
    except (OSError, http.client.HTTPException):
        counts["error"] += 1
        conn.close()
        return False


def pollers(url, n, period_s, stop):
    """n threads, each a page: GET /api/state every period_s on a kept-alive connection."""
    host, port, base = _split(url)
    counts = collections.Counter()

    def page():
        conn = http.client.HTTPConnection(host, port, timeout=5)
        while not stop.is_set():
            t = time.monotonic()
            _get(conn, base + "/api/state", counts)
            stop.wait(max(0.0, period_s - (time.monotonic() - t)))
        conn.close()

    threads = [threading.Thread(target=page, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, counts


def slowloris(host, port, n, stop, byte_every_s=1.0):
    """n connections that trickle a request's headers and never end them (reopened when the
    server drops one: the attacker keeps trying)."""
    counts = collections.Counter()
    line = b"GET /api/state HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4096

    def client():
        while not stop.is_set():
            try:
                s = socket.create_connection((host, port), timeout=5)
            except OSError:
                counts["refused"] += 1
                stop.wait(byte_every_s)
                continue
            counts["opened"] += 1
            try:
                for b in line:
                    if stop.wait(byte_every_s):
                        break
                    s.sendall(bytes([b]))
            except OSError:
                counts["dropped"] += 1
            finally:
                s.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, counts


def flood(url, requests, workers=8):
    """`requests` GETs (alternately /api/state and /metrics) from `workers` threads, each on
    a kept-alive connection, back to back. Returns the Counter of answers once all are done."""
    host, port, base = _split(url)
    counts = collections.Counter()
    left = [requests]
    lock = threading.Lock()

    def worker():
        conn = http.client.HTTPConnection(host, port, timeout=5)
        while True:
            with lock:
                if left[0] == 0:
                    break
                left[0] -= 1
                i = left[0]
            if not _get(conn, base + ("/api/state" if i % 2 else "/metrics"), counts):
                conn = http.client.HTTPConnection(host, port, timeout=5)
        conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts

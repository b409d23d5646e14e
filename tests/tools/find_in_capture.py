#!/usr/bin/env python3
"""Looks for the run's secrets in a capture of the link (docs/security.md, "Tests").

    find_in_capture.py --secret SECRET_FILE --theta H5... --capture CAPTURE_FILE...

Prints one JSON line: how many 16-byte runs of Θ (every float32 dataset of the H5 files: the
final model and the run's checkpoints, each 16-byte window at a 4-byte step) occur anywhere in
the captures, and whether the secret (its text, or the bytes its hex digits spell) does. The
checkpoints matter: the final Θ alone may never have crossed (its last merges may come after
the units stopped listening), while a checkpoint's merged fragments were sent.
"""
import argparse
import json

import h5py
import numpy as np


def theta_windows(path):
    windows = set()
    with h5py.File(path, "r") as f:
        def visit(_, obj):
            if isinstance(obj, h5py.Dataset) and obj.dtype == np.float32 and obj.size >= 4:
                raw = np.ascontiguousarray(obj[()]).tobytes()
                for i in range(0, len(raw) - 15, 4):
                    w = raw[i:i + 16]
                    if w != bytes(16):  # runs of zeros say nothing about Θ
                        windows.add(w)
        f.visititems(visit)
    return windows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--secret", required=True)
    p.add_argument("--theta", nargs="+", required=True)
    p.add_argument("--capture", nargs="+", required=True)
    a = p.parse_args()
    windows = set().union(*(theta_windows(t) for t in a.theta))
    secret = open(a.secret).read().strip()
    needles = [secret.encode(), bytes.fromhex(secret)]
    found, secret_seen, scanned = set(), False, 0
    for c in a.capture:
        data = open(c, "rb").read()
        scanned += len(data)
        secret_seen = secret_seen or any(n in data for n in needles)
        for i in range(len(data) - 15):
            w = data[i:i + 16]
            if w in windows:
                found.add(w)
    print(json.dumps({"theta_windows": len(windows), "found": len(found), "secret_seen": secret_seen,
                      "bytes_scanned": scanned}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Looks for the run's secrets in a capture of the link (docs/security.md, "Tests").

    find_in_capture.py MODEL_H5 SECRET_FILE CAPTURE_FILE...

Prints one JSON line: how many 16-byte runs of Θ (every float32 dataset of MODEL_H5, each
16-byte window at a 4-byte step) occur anywhere in the captures, and whether the secret (its
text, or the bytes its hex digits spell) does.
"""
import json
import sys

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
    model, secret_file, captures = sys.argv[1], sys.argv[2], sys.argv[3:]
    windows = theta_windows(model)
    secret = open(secret_file).read().strip()
    needles = [secret.encode(), bytes.fromhex(secret)]
    found, secret_seen, scanned = set(), False, 0
    for c in captures:
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

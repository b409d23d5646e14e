#!/usr/bin/python3
"""Rewrites, in place, every variable-length string attribute of HDF5 files as a fixed-length
one (the same text and character set, null-padded, size = its bytes, at least 1): converts a
model file written by an earlier ddiloco, whose string attributes were variable-length, to the
format this ddiloco reads (docs/fuzzing.md; ddiloco refuses variable-length strings, which
libhdf5 1.10 cannot read safely from an untrusted file). Only for files you trust: reading one
goes through the same libhdf5 code.

    scripts/h5_fixed_strings.py FILE.h5 [FILE.h5 ...]

Prints one line per attribute converted, and exits 1 (converting nothing) for a file that is
part of a checkpoint (its directory's manifest.json records each file's checksum: such a
checkpoint is resumed by the ddiloco that wrote it). Needs python3-h5py.
"""
import os
import sys

import h5py
import numpy as np


def convert(path: str) -> int:
    """Converts PATH's variable-length string attributes; returns how many it converted."""
    converted = 0
    with h5py.File(path, "r+") as f:
        objects = [f]
        f.visititems(lambda _name, obj: objects.append(obj))
        for obj in objects:
            for name in list(obj.attrs):
                info = h5py.check_string_dtype(obj.attrs.get_id(name).dtype)
                if info is None or info.length is not None:
                    continue  # not a string, or fixed-length already
                value = obj.attrs[name]
                texts = np.asarray(value, dtype=object)
                encoded = np.vectorize(
                    lambda s: s if isinstance(s, bytes) else s.encode(info.encoding),
                    otypes=[object])(texts)
                size = max([1] + [len(b) for b in encoded.flat])
                obj.attrs.create(name, np.asarray(encoded, dtype=f"S{size}"),
                                 dtype=h5py.string_dtype(info.encoding, size))
                print(f"{path}: {obj.name} attribute '{name}': variable-length -> {size} bytes")
                converted += 1
    return converted


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for path in sys.argv[1:]:
        if os.path.exists(os.path.join(os.path.dirname(os.path.abspath(path)), "manifest.json")):
            print(f"{path}: part of a checkpoint (its manifest.json checksums it); not converted",
                  file=sys.stderr)
            return 1
    for path in sys.argv[1:]:
        if convert(path) == 0:
            print(f"{path}: no variable-length string attribute")
    return 0


if __name__ == "__main__":
    sys.exit(main())

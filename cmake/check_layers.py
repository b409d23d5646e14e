#!/usr/bin/env python3
"""The layers of src/ point one way: a file may include, directly or through the headers it
includes, only headers of its own folder or of a folder below it (docs/architecture.md).

    check_layers.py SOURCE_DIR      exit 0, or 1 with one line per wrong-way include
    check_layers.py --layers        the layers, bottom-up, one per line (CMake builds one
                                    library per layer from it, each linking the one below)

The build runs it (CMake target check_layers, before every layer's library), so a wrong-way
include fails the build; tests/e2e/layers.sh shows that on a tree where it plants one. Each
layer is its own static library (ddiloco_<folder>) linking only the layers below.

Where a header lives: include/ddiloco/[gpu/]X.hpp belongs to the folder holding X.cpp (or
X.cu), or to the folder HOMES names; the rest of include/ddiloco/gpu/ to src/gpu; the private
headers src/D/*.hpp to D. A header with no home, or a folder not in LAYERS, is an error too:
a new one is placed on purpose.
"""
import os
import re
import sys

# Bottom-up: each folder may use the ones before it. Folders in one tuple are side by side:
# each may use the layers below, not the other.
LAYERS = [
    "util",    # errors, rng, checksums, metrics, signals, child processes, run dirs, atomic files
    "data",    # token shards, corpora, the data loader
    "model",   # GPT-2 forward and backward on CPU, layers, sampling
    "optim",   # AdamW
    "config",  # the configuration: keys, validation, the outer plan, the chaos schedule
    "goodput",  # goodput books (TimeBook) and global downtime
    "comm",    # MPI, UCX, remote memory, WAN emulation, wire formats, topology
    "io",      # HDF5 checkpoints and model files
    "sim",     # the goodput simulator
    "train",   # the unit trainer (one data-parallel step), the unit backend registry
    "protocol",  # the learner <-> syncer protocol: window layout, control words, membership, fragments
    ("learner", "syncer", "gpu"),  # the two roles and the GPU backend, side by side: none uses another
    "deploy",  # the deployments (one job, isolated) and the set-up they share
    "launch",  # ddiloco launch: supervision of the isolated deployment
    "cli",     # the ddiloco binary's subcommands
]

# Public headers whose implementation is not a same-named .cpp.
HOMES = {
    "ddiloco/error.hpp": "util",  # header only
    "ddiloco/model.hpp": "model",
    "ddiloco/optim.hpp": "optim",
    "ddiloco/simulate.hpp": "sim",
    "ddiloco/gpu/kernels.hpp": "gpu",
    "ddiloco/gpu/nccl.hpp": "gpu",
    "ddiloco/ucx_link.hpp": "comm",  # ucx_syncer_link.cpp, ucx_unit_link.cpp
    "ddiloco/link.hpp": "comm",  # the link's modes; link_auth.cpp throws its LinkRefused
}

# Quoted and angle-bracket includes alike: <ddiloco/x.hpp> must not slip past.
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)


def homes(root):
    home = dict(HOMES)
    src = os.path.join(root, "src")
    impl = {}
    for d in sorted(os.listdir(src)):
        for f in os.listdir(os.path.join(src, d)):
            stem, ext = os.path.splitext(f)
            if ext in (".cpp", ".cu") and d != "cli":
                impl.setdefault(stem, d)
            elif ext == ".hpp":
                home[f"{d}/{f}"] = d
    problems = []
    inc = os.path.join(root, "include")
    for dirpath, _, files in os.walk(os.path.join(inc, "ddiloco")):
        for f in files:
            if not f.endswith(".hpp"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), inc)
            if rel in home:
                continue
            stem = f[:-4]
            if stem in impl:
                home[rel] = impl[stem]
            elif rel.startswith("ddiloco/gpu/"):
                home[rel] = "gpu"
            else:
                problems.append(f"include/{rel}: no home: add src/<folder>/{stem}.cpp or list it in "
                                f"HOMES (cmake/check_layers.py)")
    return home, problems


def resolve(root, name):
    for base in ("include", "src"):
        p = os.path.join(root, base, name)
        if os.path.isfile(p):
            return p
    return None


def check(root):
    home, problems = homes(root)
    rank = {d: i for i, entry in enumerate(LAYERS) for d in (entry if isinstance(entry, tuple) else (entry,))}
    src = os.path.join(root, "src")
    for d in sorted(os.listdir(src)):
        if os.path.isdir(os.path.join(src, d)) and d not in rank:
            problems.append(f"src/{d}: a folder not in LAYERS (cmake/check_layers.py): place it")
    cache = {}

    def canonical(path, name):
        """`name` as written in `path`, as the key homes() uses: relative to include/ or src/
        (an include relative to the including file's folder, such as "../x/y.hpp", too)."""
        local = os.path.normpath(os.path.join(os.path.dirname(path), name))
        for base in ("include", "src"):
            top = os.path.join(root, base)
            if os.path.isfile(local) and local.startswith(top + os.sep):
                return os.path.relpath(local, top)
        return name

    def includes(path):
        if path not in cache:
            with open(path, errors="replace") as fh:
                cache[path] = [canonical(path, n) for n in INCLUDE.findall(fh.read())]
        return cache[path]

    def reached(name):
        """Every header `name` reaches, itself included, with the file that included each."""
        via, queue = {name: None}, [name]
        while queue:
            p = resolve(root, queue.pop(0))
            for inc in includes(p) if p else ():
                if inc not in via:
                    via[inc] = p
                    queue.append(inc)
        return via

    def wrong_way(d, shown, f, path):
        """One line per include of `path` (of layer d) that is, or reaches, a header of a layer
        above d or beside it."""
        lines = []
        for name in includes(path):
            above = [(rank[home[h]], h, v) for h, v in reached(name).items()
                     if home.get(h) in rank and (rank[home[h]] > rank[d] or
                                                 (rank[home[h]] == rank[d] and home[h] != d))]
            if not above:
                continue
            _, h, v = max(above, key=lambda t: (t[0], t[1] == name))  # the include itself first
            how = "" if h == name else f", through {os.path.relpath(v, root)}"
            where = "beside" if rank[home[h]] == rank[d] else "above"
            lines.append(f"{shown}/{f} includes {name}: it reaches {h} of src/{home[h]}, {where} src/{d}{how}")
        return lines

    for d in rank:
        folders = [("src/" + d, os.path.join(src, d))]
        if d == "gpu":  # the CUDA kernels are the GPU backend's too
            folders.append(("kernels", os.path.join(root, "kernels")))
        for shown, folder in folders:
            if not os.path.isdir(folder):
                continue
            for f in sorted(os.listdir(folder)):
                path = os.path.join(folder, f)
                if os.path.isdir(path):  # CMake builds src/<layer>/*.cpp: a subfolder is never compiled
                    problems.append(f"{shown}/{f}: a folder inside a layer; its files would not be built")
                    continue
                problems += wrong_way(d, shown, f, path)
    return problems
    return problems


def order():
    return " < ".join("{" + ", ".join(e) + "}" if isinstance(e, tuple) else e for e in LAYERS)


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--layers":
        # For CMake: one line per layer, bottom-up, side-by-side folders on one line.
        for e in LAYERS:
            print(" ".join(e) if isinstance(e, tuple) else e)
        return 0
    if len(sys.argv) != 2:
        sys.exit("usage: check_layers.py SOURCE_DIR | --layers")
    problems = check(sys.argv[1])
    for p in problems:
        print(f"layers: {p}", file=sys.stderr)
    if problems:
        print(f"layers: {len(problems)} wrong-way includes or unplaced files; the order is "
              f"{order()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

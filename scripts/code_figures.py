#!/usr/bin/env python3
"""The house's figures (issue 32, docs/architecture.md): the longest functions of src/, with
member functions defined inside class bodies, and the data members per class.

    scripts/code_figures.py [ROOT] [--top N]

A function is a definition whose signature ends in "{" within six lines; its length runs to
the matching "}". A data member is a line "type name_;" (or with an initialiser) at the top
level of a class or struct body in include/ or src/ headers. Both are read as text: a
figure to look at, not a parser's verdict.
"""
import argparse
import glob
import os
import re
from collections import Counter

KEYWORDS = ("if", "for", "while", "switch", "return", "else", "do", "catch", "namespace", "class",
            "struct", "enum", "union", "extern", "template", "using", "static_assert", "case")
START = re.compile(r"^\s*(?!(?:%s)\b)[\w:<>,~*&\[\]\s]*?\b(?:\w+|operator\S+)\s*\(" % "|".join(KEYWORDS))


def functions(root):
    rows = []
    for path in sorted(glob.glob(os.path.join(root, "src/**/*.cpp"), recursive=True) +
                       glob.glob(os.path.join(root, "src/**/*.cu"), recursive=True)):
        lines = open(path, errors="replace").read().split("\n")
        i = 0
        while i < len(lines):
            line = lines[i]
            if not START.match(line) or line.rstrip().endswith(";") or line.lstrip().startswith(("//", "#")):
                i += 1
                continue
            j = i
            while j < min(len(lines), i + 6) and not lines[j].rstrip().endswith("{"):
                # a statement, or a one-line definition: not the start of a longer one
                if lines[j].rstrip().endswith(";") or "{" in lines[j] or lines[j].rstrip().endswith("}"):
                    j = None
                    break
                j += 1
            if j is None or j >= len(lines) or not lines[j].rstrip().endswith("{"):
                i += 1
                continue
            depth, k = 0, j
            while k < len(lines):
                code = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'|//.*', "", lines[k])
                depth += code.count("{") - code.count("}")
                if depth <= 0:
                    break
                k += 1
            rows.append((k - i + 1, os.path.relpath(path, root), i + 1, line.strip()[:70]))
            i = k + 1
    return sorted(rows, reverse=True)


def members(root):
    counts = Counter()
    for path in glob.glob(os.path.join(root, "include/**/*.hpp"), recursive=True) + \
            glob.glob(os.path.join(root, "src/**/*.hpp"), recursive=True):
        cls, depth = None, 0
        for line in open(path, errors="replace"):
            m = re.match(r"^\s*(class|struct) (\w+)[^;]*\{\s*$", line)
            if m and cls is None:
                cls, depth = m.group(2), 1
                continue
            if cls:
                depth += line.count("{") - line.count("}")
                if depth <= 0:
                    cls = None
                    continue
                if depth == 1 and re.match(r"^\s+[\w:<>,\s*&\[\]]+?\s\w+_(\s*=[^;]*|\{[^;]*\})?;", line):
                    counts[f"{cls} ({os.path.relpath(path, root)})"] += 1
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    rows = functions(a.root)
    print("longest functions (lines):")
    for n, f, line, sig in rows[:a.top]:
        print(f"{n:6d}  {f}:{line}  {sig}")
    print(f"functions over 80 lines: {sum(1 for r in rows if r[0] > 80)} of {len(rows)}")
    print("data members per class:")
    for k, v in members(a.root).most_common(a.top):
        print(f"{v:6d}  {k}")


if __name__ == "__main__":
    main()

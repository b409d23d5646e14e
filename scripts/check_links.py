#!/usr/bin/python3
"""Checks every relative link in the project's Markdown: the file it names exists, and the
heading its #anchor names is in that file (GitHub's anchors).

    /usr/bin/python3 scripts/check_links.py [ROOT]

Reads README.md and every *.md under docs/ (and any other tracked *.md outside build trees);
links to http(s)/mailto are not followed (CI has no network). Prints one line per broken link,
`FILE:LINE: [text](target): why`, and exits 1 if there is any; else prints how many links it
checked and exits 0. Run by ctest as e2e_docs_links.
"""
import os
import re
import subprocess
import sys
import unicodedata

LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ANCHOR_TAG = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def slug(text):
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation other than - and _
    removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "").lower()
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_" or cat[0] in "LN" or cat == "Mn":
            out.append(ch)
        elif ch == " ":
            out.append("-")
    return "".join(out)


def anchors(path, cache={}):
    if path not in cache:
        seen, found, fenced = {}, set(), False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                if fenced:
                    continue
                found.update(ANCHOR_TAG.findall(line))
                m = HEADING.match(line)
                if not m:
                    continue
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def markdown_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "*.md"], capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
               if f.endswith(".md") and "/build" not in d and "/.git" not in d]
    return sorted(os.path.join(root, p) for p in out if os.path.exists(os.path.join(root, p)))


def check(path, root):
    bad, count, fenced = [], 0, False
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for no, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        code_free = re.sub(r"`[^`]*`", "", line)  # a link shown as code is not a link
        for m in LINK.finditer(code_free):
            text, target = m.group(1), m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            count += 1
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            where = f"{os.path.relpath(path, root)}:{no}: [{text[:40]}]({target})"
            if not os.path.exists(dest):
                bad.append(f"{where}: no such file {os.path.relpath(dest, root)}")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{where}: no heading '#{anchor}' in {os.path.relpath(dest, root)}")
    return bad, count


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    bad, count = [], 0
    files = markdown_files(root)
    for path in files:
        b, n = check(path, root)
        bad += b
        count += n
    for line in bad:
        print(line)
    if bad:
        print(f"check_links: {len(bad)} broken of {count} links in {len(files)} files")
        return 1
    print(f"check_links: {count} links in {len(files)} files, all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

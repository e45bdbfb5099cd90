#!/usr/bin/env python3
"""Fails when a function in the given folders is longer than the limit (default 80 lines).

"A function that does not fit on a screen is two functions": the run path (core/kcp) is held to
it by ctest (tests/scripts/CMakeLists.txt). A function is recognised the way the tree is
formatted (.clang-format): a line at column 0 that ends with '{' and whose signature has a '('
opens a body, which ends at the next line that starts with '}'. Namespaces, classes, structs,
enums and initialiser tables are not functions.

usage: check_function_length.py [--limit N] [--root DIR] FOLDER...
"""
import argparse
import pathlib
import sys

SKIP = ("namespace", "struct", "class", "enum", "extern", "union", "template <", "#")


def long_functions(path, limit):
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        opens = line and not line[0].isspace() and line.rstrip().endswith("{") and not line.startswith(SKIP)
        signature = " ".join(lines[max(0, i - 3): i + 1])
        if opens and "(" in signature and "=" not in line:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("}"):
                j += 1
            n = j - i + 1
            if n > limit:
                yield i + 1, n, line.strip()
            i = j
        i += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--root", default=".")
    ap.add_argument("folders", nargs="+")
    a = ap.parse_args()
    root = pathlib.Path(a.root)
    bad = 0
    for folder in a.folders:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".cpp", ".h", ".cu", ".cuh"):
                continue
            for line, n, text in long_functions(path, a.limit):
                print(f"{path.relative_to(root)}:{line}: {n} lines (limit {a.limit}): {text[:90]}")
                bad += 1
    print(f"{bad} function(s) over {a.limit} lines in {', '.join(a.folders)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

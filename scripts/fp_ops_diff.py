#!/usr/bin/env python3
"""Which floating-point operations a kernel change moved: before a device run, for a change
that must keep the output bits (docs/perf-notes.md session 19: a staging rewrite changed which
product nvcc fused into an fma on a source line it did not touch, and with it dq's bits).

Compiles each named .cu of the work tree and of a base revision to PTX (nvcc -ptx -lineinfo
-O3, the project's defines), and per kernel counts the fp32 / fp64 arithmetic (fma, mul, add,
sub, ex2, rcp, sqrt, div, neg) per source line. Lines whose text is the same in both trees
(difflib over each file) must have the same counts: a difference there is a rounding change the
source does not show (contraction, unrolling). Changed lines are summed per kernel for review.

  python3 scripts/fp_ops_diff.py [--base REV] [--arch sm_90a] kernels/cuda/kda_chunk_bwd.cu ...

Exit status: 0 when every unchanged line keeps its operations, 1 when one does not, 2 on a
usage or compile error. Needs nvcc (NVCC or /usr/local/cuda/bin/nvcc) and git.
"""
import argparse
import collections
import difflib
import os
import re
import subprocess
import sys
import tempfile

FP_OP = re.compile(r"\s*(?:@!?%p\d+\s+)?((?:fma|mul|add|sub|ex2|rcp|sqrt|div|neg)\.[a-z0-9.]*f(?:32|64))\b")
LOC = re.compile(r"\s*\.loc\s+(\d+)\s+(\d+)")
FILE = re.compile(r'\s*\.file\s+(\d+)\s+"([^"]+)"')
ENTRY = re.compile(r"\.entry\s+(\S+?)\(")


def compile_ptx(root, cu, arch, nvcc):
    """PTX text of root/cu (raises on a compile error, with nvcc's message)."""
    out = os.path.join(tempfile.mkdtemp(), "k.ptx")
    cmd = [nvcc, "-ptx", "-lineinfo", "-O3", "-DNDEBUG", "-DKCP_HAVE_SM90A=1", "-std=c++17",
           "--expt-relaxed-constexpr", "-arch=" + arch, "-I" + root, "-o", out, os.path.join(root, cu)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("nvcc failed on %s:\n%s" % (os.path.join(root, cu), r.stderr[-3000:]))
    with open(out) as f:
        return f.read()


def count_ops(ptx, root):
    """{kernel: {(path relative to root, line): Counter(op)}} from PTX with line info."""
    files = {m.group(1): os.path.relpath(os.path.realpath(m.group(2)), os.path.realpath(root))
             for m in map(FILE.match, ptx.splitlines()) if m}  # .file comes after the code
    kernels, kernel, loc = {}, None, None
    for line in ptx.splitlines():
        m = ENTRY.search(line)
        if m:
            kernel = m.group(1)
            kernels[kernel] = collections.defaultdict(collections.Counter)
            continue
        m = LOC.match(line)
        if m:
            loc = (m.group(1), int(m.group(2)))
            continue
        m = FP_OP.match(line)
        if m and kernel and loc:
            kernels[kernel][(files.get(loc[0], loc[0]), loc[1])][m.group(1)] += 1
    return kernels


def line_map(base_root, new_root, path):
    """Base line number -> new line number for the lines of `path` whose text is unchanged."""
    def lines(root):
        p = os.path.join(root, path)
        return open(p).read().splitlines() if os.path.exists(p) else []
    a, b = lines(base_root), lines(new_root)
    m = {}
    for i, j, n in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        for k in range(n):
            m[i + k + 1] = j + k + 1
    return m


class LineMaps:
    """Per file, the unchanged lines: base line -> work-tree line, and the work-tree lines."""

    def __init__(self, base_root, new_root):
        self.roots, self.maps = (base_root, new_root), {}

    def get(self, path):
        if path not in self.maps:
            m = line_map(*self.roots, path)
            self.maps[path] = (m, set(m.values()))
        return self.maps[path]


def compare_kernel(name, old, new, maps):
    """Report lines of one kernel; True when an unchanged line's operations differ."""
    moved, changed_old, changed_new, seen = [], collections.Counter(), collections.Counter(), set()
    for (path, line), ops in sorted(old.items()):
        to = maps.get(path)[0].get(line)
        if to is None:
            changed_old.update(ops)
            continue
        seen.add((path, to))
        if new.get((path, to), collections.Counter()) != ops:
            moved.append("  %s:%d (now %d): %s -> %s" % (path, line, to, dict(ops), dict(new.get((path, to), {}))))
    for (path, line), ops in new.items():
        if (path, line) in seen:
            continue
        if line in maps.get(path)[1]:
            moved.append("  %s:%d (new ops on an unchanged line): %s" % (path, line, dict(ops)))
        else:
            changed_new.update(ops)
    print("%s: %s" % (name, "unchanged lines keep their operations" if not moved else "OPERATIONS MOVED"))
    for m in moved:
        print(m)
    if changed_old or changed_new:
        print("  changed lines: %s -> %s" % (dict(changed_old), dict(changed_new)))
    return bool(moved)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help=".cu files, relative to the repository root")
    ap.add_argument("--base", default="HEAD", help="revision to compare the work tree with (default HEAD)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the work tree (default: this script's repository)")
    args = ap.parse_args()
    nvcc = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
    base_root = tempfile.mkdtemp(prefix="fp_ops_base_")
    try:
        archive = subprocess.run(["git", "-C", args.root, "archive", args.base], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", base_root], input=archive.stdout, check=True)
        bad = False
        for cu in args.files:
            old = count_ops(compile_ptx(base_root, cu, args.arch, nvcc), base_root)
            new = count_ops(compile_ptx(args.root, cu, args.arch, nvcc), args.root)
            maps = LineMaps(base_root, args.root)
            for name in sorted(set(old) | set(new)):
                if name not in old or name not in new:
                    print("%s: only in %s" % (name, "the base" if name in old else "the work tree"))
                    continue
                bad |= compare_kernel(name, old[name], new[name], maps)
        return 1 if bad else 0
    except (subprocess.CalledProcessError, RuntimeError, OSError) as e:
        print("fp_ops_diff: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

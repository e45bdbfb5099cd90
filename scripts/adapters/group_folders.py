#!/usr/bin/env python3
"""Groups prepared external folders (docs/external.md 2) by what a JIT-compiling adapter compiles
for, so that one worker runs a group's folders one after another and only its first folder pays
for compiling and autotuning (FLA's Triton kernels: 20-100 s each on first use; 16 adapters
compiling the same kernels at once were all killed by a 177 s limit, docs/perf-notes.md session 15).

    group_folders.py FOLDER...

Prints one line per group, the folders separated by spaces, the largest group first. Two folders
share a group when their manifests agree on op, dtype, H, HV, K, V, qk_l2norm, the gate's form and
parameters, initial_state, final_state and dht (T, the sequences and the seed do not change what
is compiled). A folder without a readable manifest.json is an error naming it (exit 2).
Python 3 standard library only.
"""
import json
import os
import sys


def compile_key(man):
    s, g = man["shape"], man["gate"]
    gate = (g["form"], bool(g.get("A_log")), bool(g.get("dt_bias")), g.get("lower_bound"))
    return (man["op"], man["dtype"], s["H"], s["HV"], s["K"], s["V"], man["qk_l2norm"], gate,
            man["initial_state"], man["final_state"], man["dht"])


def groups(folders):
    by_key = {}
    for d in folders:
        path = os.path.join(d, "manifest.json")
        try:
            with open(path) as f:
                key = compile_key(json.load(f))
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"group_folders: {path}: {type(e).__name__}: {e}", file=sys.stderr)
            sys.exit(2)
        by_key.setdefault(key, []).append(d)
    return sorted(by_key.values(), key=lambda g: (-len(g), g[0]))


def main(argv):
    if not argv:
        print("usage: group_folders.py FOLDER...", file=sys.stderr)
        sys.exit(2)
    for g in groups(argv):
        print(" ".join(g))


if __name__ == "__main__":
    main(sys.argv[1:])

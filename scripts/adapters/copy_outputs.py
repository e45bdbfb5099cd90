#!/usr/bin/env python3
"""Adapter that judges outputs computed elsewhere (docs/external.md 10): copies
SRC/<row>_seed<seed>/outputs/*.npy into the folder kcpbench made, after checking that SRC's
manifest.json describes the same problem (protocol, row digest, seed, shapes, cu_seqlens).
A source folder whose adapter failed is refused with the adapter's own exit status: whoever ran the
adapter there writes it to SRC/<row>_seed<seed>/adapter.status (scripts/fla_judge_parallel.sh does).
Provenance: first it prints the command that made the outputs (SRC/.../adapter.cmd, written
by the runner) and the first lines of that adapter's log, so kcpbench's JSON (the entry's
external.log_tail) records which kernel, version and flags produced what it judged.

    kcpbench run --rows int1 --backend "exec:python3 scripts/adapters/copy_outputs.py SRC" --json out.json

Standard library only. Use it when the kernel runs on a machine where kcpbench is not built: write
the folders with `kcpbench run --backend exec:true --external-dir SRC` (every entry fails: no
output), run the adapter on each folder of SRC there, bring SRC back, and judge here.
"""
import json
import os
import shutil
import sys

SAME = ("protocol", "op", "row_digest", "seed", "shape", "cu_seqlens", "dtype", "outputs")


def listdir_or_empty(path):
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def refuse_failed_adapter(src):
    """Exit naming the adapter's status when SRC/adapter.status records a nonzero one."""
    try:
        with open(os.path.join(src, "adapter.status")) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return
    if text != "0":
        why = " (killed by the time limit)" if text == "124" else ""
        sys.exit(f"copy_outputs: the adapter on {src} exited with status {text}{why}; see {src}/adapter.log")


def print_provenance(src, head_lines=3):
    """Print SRC's adapter.cmd and the first lines of its adapter.log (those it has)."""
    for name, label in (("adapter.cmd", "made by"), ("adapter.log", "adapter log")):
        try:
            with open(os.path.join(src, name)) as f:
                lines = [ln.rstrip("\n") for ln in f.readlines()[:head_lines]]
        except FileNotFoundError:
            lines = [f"(no {name})"]
        for ln in lines:
            print(f"copy_outputs: {label}: {ln}")


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: copy_outputs.py SRC FOLDER")
    src_root, folder = argv[1], argv[2]
    src = os.path.join(src_root, os.path.basename(os.path.normpath(folder)))
    with open(os.path.join(folder, "manifest.json")) as f:
        want = json.load(f)
    try:
        with open(os.path.join(src, "manifest.json")) as f:
            have = json.load(f)
    except OSError as e:
        sys.exit(f"copy_outputs: no manifest in {src}: {e}")
    differ = [k for k in SAME if want.get(k) != have.get(k)]
    if differ:
        sys.exit(f"copy_outputs: {src}/manifest.json differs from this run's in {', '.join(differ)}")
    print_provenance(src)  # first: a refused source names its adapter too
    refuse_failed_adapter(src)
    names = sorted(n for n in listdir_or_empty(os.path.join(src, "outputs")) if n.endswith(".npy"))
    if not names:
        sys.exit(f"copy_outputs: {src}/outputs holds no .npy file: the adapter there wrote nothing")
    os.makedirs(os.path.join(folder, "outputs"), exist_ok=True)
    for name in names:
        shutil.copyfile(os.path.join(src, "outputs", name), os.path.join(folder, "outputs", name))
        print(f"copy_outputs: {name} from {src}")


if __name__ == "__main__":
    main(sys.argv)

#!/usr/bin/env python3
"""The external backend (`kcpbench run --backend exec:...`, docs/external.md), end to end.

  external_test.py --kcpbench BIN --source-dir DIR --workdir W pass
      the NumPy reference adapter (scripts/adapters/numpy_ref.py) passes int1 rows of GDN and KDA
      (plain, varlen with an empty sequence, GVA with h0 / ht / dht, softplus, lower_bound): exit 0,
      every entry "pass", h_entry / dh_exit with no judged element, the command in the JSON; then
      scripts/adapters/copy_outputs.py judges those outputs again (pass) and refuses another seed's.
  external_test.py --kcpbench BIN --source-dir DIR --workdir W broken
      tests/adapters/broken_adapter.py in each mode is reported as it must be: exit code and the
      reason text in the JSON (dk negated, dk missing, a wrong shape, a wrong dtype, a crash, no
      output, a hang past the row deadline).

Every results file written is also checked against configs/results.schema.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import jsonschema

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg)


def run(args, name, rows, command, extra=()):
    out = os.path.join(args.workdir, name + ".json")
    if os.path.exists(out):
        os.remove(out)
    cmd = [args.kcpbench, "run", "--rows", "int1", "--cache", "none", "--json", out,
           "--backend", "exec:" + command, "--external-dir", os.path.join(args.workdir, name)]
    for r in rows:
        cmd += ["--row", r]
    cmd += list(extra)
    t0 = time.time()
    p = subprocess.run(cmd, cwd=args.source_dir, capture_output=True, text=True)
    secs = time.time() - t0
    print(f"{name}: exit {p.returncode} in {secs:.1f} s")
    doc = None
    if os.path.exists(out):
        with open(out) as f:
            doc = json.load(f)
        errs = list(args.schema.iter_errors(doc))
        check(not errs, f"{name}: {out} breaks configs/results.schema.json: "
                        + "; ".join(f"/{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errs[:3]))
    if p.returncode not in (0, 1, 5) or doc is None:
        print(p.stdout[-3000:], p.stderr[-3000:])
    return p, doc, secs


def test_pass(args):
    rows = ["A2", "B1", "D1", "E1", "F1", "KA1", "KD1", "KE1", "KF1"]
    adapter = f"{sys.executable} scripts/adapters/numpy_ref.py"
    p, doc, _ = run(args, "numpy_ref", rows, adapter)
    check(p.returncode == 0, f"numpy_ref: exit {p.returncode}, expected 0\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    if doc is None:
        return check(False, "numpy_ref: no results file")
    check(doc["context"]["backend"] == "exec", "context.backend is not exec")
    check(adapter in doc["context"]["backend_device"], "context.backend_device does not name the command")
    check("exec:" + adapter in doc["context"]["command_line"], "command_line lacks the --backend exec argument")
    ids = [e["id"] for e in doc["entries"]]
    check(ids == [r + "/external" for r in rows], f"entries {ids}")
    for e in doc["entries"]:
        check(e["status"] == "pass", f"{e['id']}: {e['status']}: {e.get('reason')}")
        check(e["form"] == {"package": "external", "saved": "none", "P": "planned"}, f"{e['id']}: form {e['form']}")
        check(e["external"]["command"] == adapter and e["external"]["exit_status"] == 0, f"{e['id']}: external block")
        ts = e.get("tensors", {})
        for t in ("o", "dq", "dk", "dv", "dg", "dbeta"):
            check(t in ts and ts[t]["pass"] and ts[t]["count"] > 0, f"{e['id']}: {t} not judged or not passing")
        for t in ("h_entry", "dh_exit"):
            check(ts.get(t, {}).get("count") == 0, f"{e['id']}: {t} judged on an external run")
    by = {e["row"]: e["tensors"] for e in doc["entries"]}
    for row, t in (("D1", "ht"), ("D1", "dh0"), ("E1", "dA_log"), ("E1", "ddt_bias"), ("KA1", "dA_log"),
                   ("KE1", "ddt_bias"), ("KD1", "dh0")):
        check(t in by.get(row, {}) and by[row][t]["pass"], f"{row}: {t} not judged or not passing")
    test_copy_outputs(args, os.path.join(args.workdir, "numpy_ref"))
    test_group_folders(args, os.path.join(args.workdir, "numpy_ref"))


def test_copy_outputs(args, src_root):
    """scripts/adapters/copy_outputs.py: outputs computed in an earlier run are judged again (pass),
    and a source folder of another problem (another seed) is refused (fail, naming what differs)."""
    adapter = f"{sys.executable} scripts/adapters/copy_outputs.py {src_root}"
    with open(os.path.join(src_root, "D1_seed1", "adapter.cmd"), "w") as f:
        f.write("python3 my_kernel_adapter.py --flag D1_seed1\n")
    p, doc, _ = run(args, "copy_outputs", ["D1", "KE1"], adapter)
    check(p.returncode == 0 and doc and all(e["status"] == "pass" for e in doc["entries"]),
          f"copy_outputs: exit {p.returncode}\n{p.stdout[-1500:]}")
    tails = {e["row"]: e["external"]["log_tail"] for e in doc["entries"]}
    check("copy_outputs: made by: python3 my_kernel_adapter.py --flag D1_seed1" in tails["D1"]
          and "copy_outputs: made by: (no adapter.cmd)" in tails["KE1"],
          f"copy_outputs provenance in the JSON's log_tail: {tails}")
    other = os.path.join(args.workdir, "copy_other")
    os.makedirs(other, exist_ok=True)
    shutil.copytree(os.path.join(src_root, "D1_seed1"), os.path.join(other, "D1_seed2"), dirs_exist_ok=True)
    p, doc, _ = run(args, "copy_outputs_other", ["D1"], f"{sys.executable} scripts/adapters/copy_outputs.py {other}",
                    ["--seeds", "2"])
    reason = doc["entries"][0].get("reason", "") if doc else ""
    check(p.returncode == 1 and "differs from this run's in row_digest, seed" not in reason
          and "differs from this run's in seed" in reason, f"copy_outputs of another seed: {p.returncode} {reason!r}")
    test_copy_outputs_refusals(args, src_root)


def test_copy_outputs_refusals(args, src_root):
    """A source whose adapter failed (adapter.status 124: killed by a time limit) or wrote nothing is
    refused with that reason, not judged as an adapter that exited 0 without output."""
    cases = (("timeout", "124", True, "the adapter on"), ("empty", "0", False, "holds no .npy file"))
    for name, status, keep_outputs, text in cases:
        src = os.path.join(args.workdir, "copy_" + name)
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(os.path.join(src_root, "D1_seed1"), os.path.join(src, "D1_seed1"))
        with open(os.path.join(src, "D1_seed1", "adapter.status"), "w") as f:
            f.write(status + "\n")
        if not keep_outputs:
            shutil.rmtree(os.path.join(src, "D1_seed1", "outputs"))
        p, doc, _ = run(args, "copy_outputs_" + name, ["D1"], f"{sys.executable} scripts/adapters/copy_outputs.py {src}")
        reason = doc["entries"][0].get("reason", "") if doc else ""
        check(p.returncode == 1 and text in reason, f"copy_outputs {name}: {p.returncode} {reason!r}")
        if name == "timeout":
            check("status 124 (killed by the time limit)" in reason, f"copy_outputs timeout: {reason!r}")


def test_group_folders(args, src_root):
    """scripts/adapters/group_folders.py: a folder that differs only in what is not compiled (seed,
    T, sequences) joins its original's group; one with another K gets its own; every folder is
    listed exactly once; a folder without a manifest is an error naming it (exit 2)."""
    root = os.path.join(args.workdir, "groups")
    shutil.rmtree(root, ignore_errors=True)
    base = os.path.join(src_root, "D1_seed1")
    with open(os.path.join(base, "manifest.json")) as f:
        man = json.load(f)
    variants = {"same": {"seed": 7, "T": 640, "cu_seqlens": [0, 128, 640]}, "otherK": {"K": man["shape"]["K"] * 2}}
    folders = [base]
    for name, change in variants.items():
        m = json.loads(json.dumps(man))
        for k, v in change.items():
            (m["shape"] if k in ("T", "K") else m)[k] = v
        d = os.path.join(root, name)
        os.makedirs(d)
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(m, f)
        folders.append(d)
    script = [sys.executable, "scripts/adapters/group_folders.py"]
    p = subprocess.run(script + folders, cwd=args.source_dir, capture_output=True, text=True)
    lines = [l.split() for l in p.stdout.splitlines()]
    check(p.returncode == 0 and lines == [[base, folders[1]], [folders[2]]],
          f"group_folders: exit {p.returncode}, groups {lines}, {p.stderr}")
    empty = os.path.join(root, "empty")
    os.makedirs(empty)
    p = subprocess.run(script + [base, empty], cwd=args.source_dir, capture_output=True, text=True)
    check(p.returncode == 2 and os.path.join(empty, "manifest.json") in p.stderr,
          f"group_folders without a manifest: exit {p.returncode}, {p.stderr!r}")


def test_broken(args):
    fixture = f"{sys.executable} tests/adapters/broken_adapter.py --break"
    cases = [  # mode, exit code, texts the entry's reason must hold
        ("dk-sign", 1, ["dk: ratio_max"]),
        ("missing-dk", 1, ["dk: not provided (the adapter did not write outputs/dk.npy)"]),
        ("wrong-shape", 1, ["dv: outputs/dv.npy has shape [512, 1, 64], expected [512, 4, 64] ([T, HV, V])"]),
        ("float16", 1, ["o: outputs/o.npy has dtype '<f2', expected float32 ('<f4') or float64 ('<f8')"]),
        ("nan-dq", 1, ["dq: 1 non-finite values"]),
        ("zero-dbeta", 1, ["dbeta: ratio_max"]),
        ("dir-o", 1, ["o: outputs/o.npy is not a regular file"]),
        ("fifo-o", 1, ["o: outputs/o.npy is not a regular file"]),
        ("huge-f64", 1, ["dq: outputs/dq.npy holds 1 finite value(s) beyond the float32 range"]),
        ("long-line", 1, ["the adapter failed: exit status 1", "99999/100000 |"]),
        ("crash", 1, ["the adapter failed: exit status 3", "simulated failure in the backward"]),
        ("sigkill", 1, ["the adapter failed:", "signal 9"]),
        ("nothing", 1, ["wrote no output file"]),
        ("hang", 5, ["deadline passed", "time limit of 3 s", "killed with its process group"]),
    ]
    for mode, code, texts in cases:
        extra = ["--deadline", "3"] if mode == "hang" else []
        p, doc, secs = run(args, "broken_" + mode, ["D1"], f"{fixture} {mode}", extra)
        check(p.returncode == code, f"{mode}: exit {p.returncode}, expected {code}\n{p.stderr[-1500:]}")
        if doc is None:
            check(False, f"{mode}: no results file")
            continue
        e = doc["entries"][0]
        check(e["status"] == "fail", f"{mode}: status {e['status']}")
        for text in texts:
            check(text in e.get("reason", ""), f"{mode}: reason lacks {text!r}: {e.get('reason')!r}")
        check(text.split(":")[0] in p.stdout + p.stderr, f"{mode}: the table line does not say why")
        ts = e.get("tensors", {})
        if mode == "long-line":
            check(len(e["reason"]) < 6000 and len(e["external"]["log_tail"]) < 5000,
                  f"{mode}: reason {len(e['reason'])} and log tail {len(e['external']['log_tail'])} characters")
        if mode in ("crash", "nothing", "hang", "long-line", "sigkill"):
            check(e["worst"]["ratio_max_tensor"] == "", f"{mode}: worst names {e['worst']['ratio_max_tensor']!r}")
        judged_bad = {"dk-sign": "dk", "nan-dq": "dq", "zero-dbeta": "dbeta"}
        if mode in judged_bad:  # judged, and fails alone
            failing = sorted(t for t, m in ts.items() if not m["pass"])
            check(failing == [judged_bad[mode]], f"{mode}: failing tensors {failing}, expected {judged_bad[mode]}")
        refused = {"missing-dk": "dk", "dir-o": "o", "fifo-o": "o", "huge-f64": "dq"}
        if mode in refused:  # not judged, named as not provided; the rest is judged and passes
            name = refused[mode]
            check(name not in ts and e["external"]["not_provided"] == [name], f"{mode}: {name} listed or judged")
            check(ts and all(m["pass"] for m in ts.values()), f"{mode}: the tensors it wrote must pass")
        if mode in ("crash", "nothing", "hang"):
            check(ts == {}, f"{mode}: tensors judged after a failed command")
        if mode == "hang":
            check(e["external"]["timed_out"] and secs < 60, f"{mode}: not timed out, or took {secs:.0f} s")
            folder = e["external"]["folder"]
            left = [pid for pid in os.listdir("/proc") if pid.isdigit() and folder in _cmdline(pid)]
            check(not left, f"{mode}: adapter processes left running: {left}")


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kcpbench", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("which", choices=["pass", "broken"])
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.source_dir, "configs", "results.schema.json")) as f:
        schema = json.load(f)
    args.schema = jsonschema.Draft202012Validator(schema)
    (test_pass if args.which == "pass" else test_broken)(args)
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()

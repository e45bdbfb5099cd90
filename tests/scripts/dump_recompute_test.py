#!/usr/bin/env python3
"""`kcpbench run --dump DIR` lets every verdict be recomputed outside kcpbench.

  dump_recompute_test.py --kcpbench BIN --workdir W

Dumps int1 rows D1 (grouped value heads, h0, ht, dht) and E1 (raw gates: A_log, dt_bias) and,
from the .npy files and manifest.json alone, recomputes max_abs and rel_rms of every tensor each
entry of the results JSON judged (core/report/results.h TensorMetrics), as the manifest's
"verdicts" block says: max |backend - reference| over the elements whose reference is finite, over
every rank; Param gradients against the sum over ranks of the reference parts. Checks that the
inputs the rows have (h0, dht, A_log, dt_bias) are there and the manifest states the loss, scale
and shape. Then the folder rules: a second dump into the folder clears the first dump's files
(and only those), a folder holding anything else is refused with exit 2 naming it.
Needs numpy.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def run(bin_, args, expect_rc=0):
    p = subprocess.run([bin_] + args, capture_output=True, text=True)
    if p.returncode != expect_rc:
        fail("kcpbench %s: exit %d (expected %d)\n%s" % (" ".join(args), p.returncode, expect_rc, p.stderr[-3000:]))
    return p


def form_label(form):
    P = form["P"]
    return "%s/%s/%s" % (form["package"], form["saved"], "planned" if P == "planned" else "P=%s" % P)


def close(a, b, rtol):
    return abs(a - b) <= rtol * max(abs(a), abs(b)) + 1e-300


def recompute(dump_dir, results):
    man = json.load(open(os.path.join(dump_dir, "manifest.json")))
    files = man["files"]

    def find(row, form, kind, tensor):
        return sorted((f for f in files if f["row"] == row and f["form"] == form and f["kind"] == kind
                       and f["tensor"] == tensor), key=lambda f: f["rank"])

    def load(f):
        return np.load(os.path.join(dump_dir, f["file"])).astype(np.float64)

    for key in ("loss", "max_abs", "rel_rms", "params"):
        if key not in man.get("verdicts", {}):
            fail("manifest: verdicts.%s missing" % key)
    for key in ("q, k, dq, dk", "ht, dh0", "h0, dht"):
        if key not in man.get("layouts", {}):
            fail("manifest: layouts[%r] missing" % key)
    checked = 0
    for e in results["entries"]:
        if "tensors" not in e:
            continue
        row, form = e["row"], form_label(e["form"])
        info = man.get("rows", {}).get(row)
        if not info:
            fail("manifest: rows.%s missing" % row)
            continue
        for key in ("scale", "loss", "H", "HV", "K", "V", "seqlens", "gate"):
            if key not in info:
                fail("manifest: rows.%s.%s missing" % (row, key))
        if abs(info.get("scale", 0) - info.get("K", 1) ** -0.5) > 1e-12:
            fail("manifest: rows.%s.scale %s is not K^-1/2" % (row, info.get("scale")))
        want_loss = "sum(o * dO) + sum(ht * dht)" if info.get("dht") else "sum(o * dO)"
        if info.get("loss") != want_loss:
            fail("manifest: rows.%s.loss %r, expected %r" % (row, info.get("loss"), want_loss))
        for name, m in e["tensors"].items():
            got = find(row, form, "backend", name)
            # h_entry / dh_exit: their reference depends on the form's segments, so it is per form.
            ref = find(row, "row", "reference", name) or find(row, form, "reference", name)
            if not got or not ref:
                fail("%s %s %s: backend files %d, reference files %d" % (row, form, name, len(got), len(ref)))
                continue
            if name in ("dA_log", "ddt_bias"):
                b = load(got[0]).ravel()
                r = sum(load(f).ravel() for f in ref)
                for f in got[1:]:
                    if not np.array_equal(load(f).ravel(), b):
                        fail("%s %s %s: rank %d's total differs from rank 0's" % (row, form, name, f["rank"]))
                pairs, rtol = [(b, r)], 1e-9
                scale = find(row, "row", "scale", name)
                if len(scale) != 1:
                    fail("%s %s %s: %d scale files (expected one)" % (row, form, name, len(scale)))
                    continue
                s = load(scale[0]).ravel()
                err = np.abs(b - r)
                rel = float((err ** 2).sum()) ** 0.5 / float((s ** 2).sum()) ** 0.5
                mrel = float(err.max()) / float(s.max())
                if not close(mrel, m["max_rel"], 1e-6):
                    fail("%s %s %s: max_rel from the dump %.17g, JSON %.17g" % (row, form, name, mrel, m["max_rel"]))
                if not close(rel, m["rel_rms"], 1e-6):
                    fail("%s %s %s: rel_rms from the dump %.17g, JSON %.17g" % (row, form, name, rel, m["rel_rms"]))
                checked += 1
                continue
            else:
                if [f["rank"] for f in got] != [f["rank"] for f in ref]:
                    fail("%s %s %s: ranks of backend and reference files differ" % (row, form, name))
                    continue
                pairs, rtol = [(load(g).ravel(), load(f).ravel()) for g, f in zip(got, ref)], 1e-12
            mx, se, sr, nonfinite = 0.0, 0.0, 0.0, 0
            for b, r in pairs:
                if b.shape != r.shape:
                    fail("%s %s %s: shapes %s and %s" % (row, form, name, b.shape, r.shape))
                    continue
                ok = np.isfinite(r)
                nonfinite += int((ok & ~np.isfinite(b)).sum())
                ok &= np.isfinite(b)
                sr += float((r[np.isfinite(r)] ** 2).sum())
                err = np.abs(b[ok] - r[ok])
                if err.size:
                    mx = max(mx, float(err.max()))
                se += float((err ** 2).sum())
            rel = (se / sr) ** 0.5 if sr > 0 else 0.0
            if nonfinite != m.get("nonfinite", 0):
                fail("%s %s %s: non-finite values from the dump %d, JSON %s" % (row, form, name, nonfinite,
                                                                               m.get("nonfinite")))
            if not close(mx, m["max_abs"], rtol):
                fail("%s %s %s: max_abs from the dump %.17g, JSON %.17g" % (row, form, name, mx, m["max_abs"]))
            if not close(rel, m["rel_rms"], 1e-6):
                fail("%s %s %s: rel_rms from the dump %.17g, JSON %.17g" % (row, form, name, rel, m["rel_rms"]))
            checked += 1
    return man, checked


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kcpbench", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    d = os.path.join(a.workdir, "dump")
    res = os.path.join(a.workdir, "r.json")
    common = ["run", "--rows", "int1", "--backend", "cpu", "--cache", "none", "--package", "det", "--saved",
              "full", "--no-det-checks", "--dump", d, "--json", res]

    # 1. D1 and E1: every judged tensor recomputed from the files.
    run(a.kcpbench, common + ["--row", "D1", "--row", "E1"])
    man, checked = recompute(d, json.load(open(res)))
    tensors = {(f["row"], f["kind"], f["tensor"]) for f in man["files"]}
    for want in [("D1", "input", "h0"), ("D1", "input", "dht"), ("E1", "input", "A_log"),
                 ("E1", "input", "dt_bias"), ("D1", "reference", "ht"), ("D1", "reference", "dh0"),
                 ("D1", "backend", "ht"), ("D1", "backend", "dh0"), ("E1", "reference", "dA_log"),
                 ("E1", "reference", "ddt_bias"), ("E1", "backend", "dA_log"), ("E1", "backend", "ddt_bias"),
                 ("D1", "reference", "h_entry"), ("D1", "backend", "dh_exit")]:
        if want not in tensors:
            fail("manifest lists no %s %s %s" % want)
    if checked < 19:
        fail("only %d judged tensors recomputed (D1 and E1 judge 10 each)" % checked)
    print("recomputed %d judged tensors" % checked)

    # 2. A second dump into the same folder clears the first one's files, and only those.
    run(a.kcpbench, common + ["--row", "E1"])
    left = [os.path.basename(p) for p in glob.glob(os.path.join(d, "D1-*"))]
    if left:
        fail("stale files of the first dump left: %s" % left[:3])
    man2, checked2 = recompute(d, json.load(open(res)))
    listed = {f["file"] for f in man2["files"]} | {"manifest.json"}
    extra = sorted(set(os.listdir(d)) - listed)
    if extra:
        fail("files the manifest does not list: %s" % extra[:3])

    # 3. A folder holding anything else is refused, naming the folder and the file, and left alone.
    with open(os.path.join(d, "notes.txt"), "w") as f:
        f.write("mine\n")
    p = run(a.kcpbench, common + ["--row", "E1"], expect_rc=2)
    if d not in p.stderr or "notes.txt" not in p.stderr:
        fail("refusal does not name the folder and the file: %s" % p.stderr.strip()[-500:])
    if not os.path.exists(os.path.join(d, "notes.txt")) or not os.path.exists(os.path.join(d, "manifest.json")):
        fail("a refused folder was changed")
    # 4. A non-empty folder without a manifest: refused too.
    other = os.path.join(a.workdir, "other")
    os.makedirs(other)
    open(os.path.join(other, "x.npy"), "w").close()
    p = run(a.kcpbench, common[:-4] + ["--dump", other, "--row", "E1"], expect_rc=2)
    if other not in p.stderr:
        fail("refusal does not name the folder: %s" % p.stderr.strip()[-500:])

    if failures:
        print("%d failure(s)" % len(failures))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

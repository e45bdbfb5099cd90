#!/usr/bin/env python3
"""Self-test of scripts/mutants.py without building anything: the verdict read from a results
file (worst failing tensor, non-finite as infinite, WEAK below 2, contract-only catches, MISSED
with the ratios that moved), and the refusals (exit 2) of a `find` text that does not occur
exactly once, of an unknown --only id and of a malformed mutants file. Every mutant of
tests/mutants/mutants.json must also find its text exactly once in this checkout.

  mutants_test.py --script scripts/mutants.py --workdir DIR
"""
import argparse
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def tensor(ratio_max, rms_ratio, ok, nonfinite=0):
    return {"ratio_max": ratio_max, "rms_ratio": rms_ratio, "pass": ok, "nonfinite": nonfinite}


def entry(row, status, tensors, P="planned"):
    return {"id": "%s/det/full/%s" % (row, P), "row": row, "status": status,
            "form": {"package": "det", "saved": "full", "P": P}, "tensors": tensors}


def write(path, entries):
    with open(path, "w") as f:
        json.dump({"entries": entries}, f)
    return path


def check_verdicts(mod, work):
    m = {"id": "x", "area": "a", "file": "f.cpp", "why": "w"}
    base = write(os.path.join(work, "base.json"), [entry("A1", "pass", {"o": tensor(0.4, 0.3, True)}),
                                                   entry("B1", "pass", {"dq": tensor(0.2, 0.1, True)})])
    caught = write(os.path.join(work, "caught.json"), [
        entry("A1", "fail", {"o": tensor(3.5, 0.9, False), "dq": tensor(99.0, 1.0, True)}),
        entry("B1", "fail", {"dk": tensor(1.5, 7.25, False)}, P=2)])
    rec = mod.judge(m, 1, caught, base)
    if (rec["result"], rec["row"], rec["tensor"], rec["metric"], rec["ratio"], rec["weak"]) != \
            ("CAUGHT", "B1", "dk", "rms_ratio", 7.25, False):
        fail("worst failing tensor: %s" % rec)
    if rec["form"] != "det/full/P=2":
        fail("form text: %s" % rec["form"])
    nonfinite = write(os.path.join(work, "nonfinite.json"), [
        entry("A1", "fail", {"o": tensor(3.5, 0.9, False)}),
        entry("B1", "fail", {"dq": tensor(0.5, 0.5, False, nonfinite=4)})])
    rec = mod.judge(m, 1, nonfinite, base)
    if rec["ratio"] is not None or rec["tensor"] != "dq" or rec["weak"]:
        fail("a non-finite tensor must count as infinite: %s" % rec)
    weak = write(os.path.join(work, "weak.json"), [entry("A1", "fail", {"o": tensor(1.3, None, False)})])
    rec = mod.judge(m, 1, weak, base)
    if rec["ratio"] is not None:
        fail("a null ratio must count as infinite: %s" % rec)
    weak = write(os.path.join(work, "weak2.json"), [entry("A1", "fail", {"o": tensor(1.3, 0.2, False)})])
    rec = mod.judge(m, 1, weak, base)
    if not rec["weak"] or rec["ratio"] != 1.3:
        fail("a catch at 1.3 must be WEAK: %s" % rec)
    contract = write(os.path.join(work, "contract.json"), [
        entry("A1", "contract_broken", {"o": tensor(0.4, 0.3, True)})])
    rec = mod.judge(m, 4, contract, base)
    if rec["result"] != "CAUGHT" or rec["metric"] != "contract" or not rec["weak"]:
        fail("a contract-only catch: %s" % rec)
    rec = mod.judge(m, 0, base, base)
    if rec["result"] != "MISSED" or rec["metrics_differing"] != 0:
        fail("an unchanged run must be MISSED with no ratio moved: %s" % rec)
    if "dead or equivalent" not in mod.line_of(dict(rec, seconds=1), 4):
        fail("a miss with no ratio moved must say so: %s" % mod.line_of(dict(rec, seconds=1), 4))
    moved = write(os.path.join(work, "moved.json"), [entry("A1", "pass", {"o": tensor(0.8, 0.3, True)}),
                                                     entry("B1", "pass", {"dq": tensor(0.2, 0.1, True)})])
    rec = mod.judge(m, 0, moved, base)
    if rec["metrics_differing"] != 1 or rec["worst_ratio"] != 0.8:
        fail("a miss that moved one ratio: %s" % rec)
    for rc, want in ((3, "CRASHED(3)"), (-11, "CRASHED(-11)"), (None, "CRASHED(timeout)")):
        if mod.judge(m, rc, base, base)["result"] != want:
            fail("exit %s must read %s" % (rc, want))
    text, ok, counts = mod.summarize([{"result": "CAUGHT", "weak": False}, {"result": "CAUGHT", "weak": True},
                                      {"result": "MISSED"}])
    if text != "caught 2 of 3 (1 weak, 1 missed)" or ok:
        fail("summary line: %r %s" % (text, ok))
    if not math.isinf(mod.as_ratio(float("nan"))):
        fail("NaN ratio must count as infinite")


def run(script, args):
    p = subprocess.run([sys.executable, script] + args, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def check_refusals(script, work):
    bad = os.path.join(work, "bad.json")
    with open(bad, "w") as f:
        json.dump([{"id": "nowhere", "area": "a", "file": "kernels/cpu/prep.cpp", "find": "no such text in it",
                    "replace": "x", "why": "w"}], f)
    rc, out = run(script, ["--mutants", bad, "--work", os.path.join(work, "w")])
    if rc != 2 or "nowhere" not in out or "kernels/cpu/prep.cpp" not in out or "0 times" not in out:
        fail("a find text not found: expected exit 2 naming id, file and count, got %d: %s" % (rc, out))
    rc, out = run(script, ["--only", "no-such-mutant", "--work", os.path.join(work, "w")])
    if rc != 2 or "no-such-mutant" not in out:
        fail("unknown --only id: expected exit 2, got %d: %s" % (rc, out))
    with open(bad, "w") as f:
        json.dump([{"id": "a", "area": "a", "file": "f", "find": "x"}], f)
    rc, out = run(script, ["--mutants", bad])
    if rc != 2 or "replace" not in out:
        fail("a mutant without 'replace': expected exit 2 naming the field, got %d: %s" % (rc, out))
    if os.path.exists(os.path.join(work, "w")):
        fail("a refused run must not create its work folder")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--script", required=True, help="scripts/mutants.py")
    ap.add_argument("--workdir", required=True, help="scratch folder (emptied first)")
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    spec = importlib.util.spec_from_file_location("mutants", a.script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    check_verdicts(mod, a.workdir)
    check_refusals(a.script, a.workdir)
    mutants = mod.load_mutants(mod.DEFAULT_MUTANTS)
    for m in mutants:
        mod.check_find(m, mod.ROOT)
    ci = [m for m in mutants if m.get("ci")]
    if len(mutants) < 32 or not 3 <= len(ci) <= 5 or not all(m.get("rows") for m in ci):
        fail("mutants.json: %d mutants (>= 32), %d in the CI subset (3-5, each with rows)" % (len(mutants), len(ci)))
    print("PASS")


if __name__ == "__main__":
    main()

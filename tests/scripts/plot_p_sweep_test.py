#!/usr/bin/env python3
"""CTest driver for scripts/plot_p_sweep.py.

  plot_p_sweep_test.py --script PLOT --fixture SMALL.json --workdir DIR
      renders the committed small sweep JSON; the PNG must start with the PNG magic, the SVG be SVG.
  plot_p_sweep_test.py --script PLOT --kcpbench EXE --workdir DIR
      sweeps an int1 row on the CPU twin (one entry per requested P: pass, fail or skip) and plots it.
Fails (never skips) when matplotlib is not importable: CI installs python3-matplotlib.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fail(msg):
    sys.stderr.write("FAIL: %s\n" % msg)
    sys.exit(1)


def run(cmd, ok=(0,)):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write("$ %s\n%s" % (" ".join(cmd), p.stdout))
    if p.returncode not in ok:
        fail("%s exited %d" % (cmd[0], p.returncode))
    return p


def plot_and_check(script, results, out, expect):
    if os.path.isdir(out):
        shutil.rmtree(out)
    run([sys.executable, script, results, "--out", out])
    for name in expect:
        png = os.path.join(out, name + ".png")
        svg = os.path.join(out, name + ".svg")
        if not os.path.isfile(png):
            fail("no %s" % png)
        with open(png, "rb") as f:
            if f.read(8) != PNG_MAGIC:
                fail("%s does not start with the PNG magic" % png)
        if os.path.getsize(png) < 10000:
            fail("%s is suspiciously small (%d bytes)" % (png, os.path.getsize(png)))
        if not os.path.isfile(svg):
            fail("no %s" % svg)
        with open(svg) as f:
            if "<svg" not in f.read(4096):
                fail("%s is not SVG" % svg)
        print("ok: %s (%d bytes) and %s" % (png, os.path.getsize(png), svg))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--fixture")
    ap.add_argument("--kcpbench")
    a = ap.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        fail("matplotlib is not importable by %s (%s): install python3-matplotlib (scripts/install_deps.sh) "
             "or pip install -r scripts/requirements.txt, or configure with -DKCP_PYTHON3=<a python with it>"
             % (sys.executable, exc))
    os.makedirs(a.workdir, exist_ok=True)

    if a.fixture:
        plot_and_check(a.script, a.fixture, os.path.join(a.workdir, "fixture"), ["A1_det-full"])
        # Not a results file: a clear error, not a traceback and not an empty success.
        bogus = os.path.join(a.workdir, "bogus.json")
        with open(bogus, "w") as f:
            json.dump({"rows": []}, f)
        p = run([sys.executable, a.script, bogus, "--out", os.path.join(a.workdir, "bogus")], ok=(1,))
        if "not a kcpbench results file" not in p.stdout:
            fail("the error for a non-results file does not say so")

    if a.kcpbench:
        results = os.path.join(a.workdir, "sweep.json")
        requested = [1, 2, 4, 8, 16]
        run([a.kcpbench, "-q", "run", "--rows", "int1", "--row", "A1", "--package", "det", "--saved", "full",
             "--cache", "none", "--sweep-P", ",".join(map(str, requested)), "--json", results], ok=(0, 1))
        with open(results) as f:
            entries = json.load(f)["entries"]
        got = sorted(e["form"]["P"] for e in entries if isinstance(e["form"]["P"], int))
        if got != requested:
            fail("forced P in the JSON %s, requested %s" % (got, requested))
        if [e["form"]["P"] for e in entries].count("planned") != 1:
            fail("the planned P is not in the sweep exactly once")
        for e in entries:
            if e["status"] not in ("pass", "fail", "skip"):
                fail("%s: status %s" % (e["id"], e["status"]))
        plot_and_check(a.script, results, os.path.join(a.workdir, "sweep"), ["A1_det-full"])
    print("PASS")


if __name__ == "__main__":
    main()

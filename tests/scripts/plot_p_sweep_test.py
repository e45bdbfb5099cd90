#!/usr/bin/env python3
"""CTest driver for scripts/plot_p_sweep.py.

  plot_p_sweep_test.py --script PLOT --fixture SMALL.json --workdir DIR
      renders the committed small sweep JSON; the PNG must start with the PNG magic, the SVG be SVG.
      Bad input (a missing, corrupt, non-results or non-sweep file): exit 2 and one line naming
      the file and what is wrong, no traceback; --help without matplotlib. The figure itself: a
      skipped P has no point (no y = 0), ratios on a log axis with the budget line at 1, the
      title names the row shape and the timed repeats, no min-max legend with one repeat.
  plot_p_sweep_test.py --script PLOT --kcpbench EXE --workdir DIR
      sweeps an int1 row on the CPU twin (one entry per requested P: pass, fail or skip) and plots it.
Fails (never skips) when matplotlib is not importable: CI installs python3-matplotlib.
"""
import argparse
import copy
import importlib.util
import json
import math
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


def one_line_exit2(script, path, out, words):
    p = run([sys.executable, script, path, "--out", out], ok=(2,))
    lines = [l for l in p.stdout.splitlines() if l.strip() and not l.startswith("$ ")]
    if "Traceback" in p.stdout or len(lines) != 1:
        fail("%s: expected one line, got %r" % (path, p.stdout))
    for w in words:
        if w not in lines[0]:
            fail("%s: the message %r lacks %r" % (path, lines[0], w))
    if os.path.exists(out):
        fail("%s: refused but %s was created" % (path, out))


def bad_inputs(script, fixture, work):
    out = os.path.join(work, "bad_out")
    missing = os.path.join(work, "no_such.json")
    one_line_exit2(script, missing, out, [missing, "cannot read"])
    corrupt = os.path.join(work, "corrupt.json")
    with open(fixture) as f, open(corrupt, "w") as g:
        g.write(f.read()[:500])
    one_line_exit2(script, corrupt, out, [corrupt, "not JSON"])
    with open(fixture) as f:
        doc = json.load(f)
    plain = copy.deepcopy(doc)  # a plain run: the planned entry only, no sweep flags
    plain["entries"] = [e for e in plain["entries"] if e["form"]["P"] == "planned"]
    for e in plain["entries"]:
        e.pop("sweep", None)
    path = os.path.join(work, "not_sweep.json")
    with open(path, "w") as f:
        json.dump(plain, f)
    one_line_exit2(script, path, out, [path, "not a P sweep", "sweep", "forced P"])
    # --help needs no matplotlib.
    p = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.modules['matplotlib'] = None; "
                        "sys.argv = [sys.argv[1], '--help']; runpy.run_path(sys.argv[0], run_name='__main__')",
                        script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0 or "usage" not in p.stdout:
        fail("--help without matplotlib: exit %d\n%s" % (p.returncode, p.stdout))
    print("ok: bad inputs refused with exit 2 and one line; --help without matplotlib")


def capture_figures(script, doc, work, name):
    """Runs the script's main in this process and keeps the figures it draws."""
    spec = importlib.util.spec_from_file_location("plot_p_sweep", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.import_matplotlib()
    figs = []
    real_close = mod.plt.close
    mod.plt.close = lambda fig=None: figs.append(fig) if hasattr(fig, "axes") else real_close(fig)
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(doc, f)
    try:
        mod.main([path, "--out", os.path.join(work, name), "--format", "png"])
    finally:
        mod.plt.close = real_close
    return figs


def figure_checks(script, fixture, work):
    with open(fixture) as f:
        doc = json.load(f)
    skipped = [e["form"]["P"] for e in doc["entries"] if e["status"] == "skip"]
    fig = capture_figures(script, doc, work, "look")[0]
    title = fig._suptitle.get_text()
    for w in ("A1", "H=2", "HV=2", "K=64", "V=64", "1024 tokens", "W=2", "3 timed repeats"):
        if w not in title:
            fail("title %r lacks %r" % (title, w))
    for ax in fig.axes:
        for line in ax.get_lines():
            xs, ys = list(line.get_xdata()), list(line.get_ydata())
            if len(xs) != len(ys):
                continue  # axvline / axhline
            for x, y in zip(xs, ys):
                if x in skipped and isinstance(y, float) and not math.isnan(y):
                    fail("%s: a skipped P (%s) is drawn at y = %s" % (ax.get_title(), x, y))
    for ax in fig.axes[:2]:
        if ax.get_yscale() != "log":
            fail("%s: linear y axis" % ax.get_title())
        lo, hi = ax.get_ylim()
        if not lo < 1 < hi:
            fail("%s: the budget line 1 is outside %s" % (ax.get_title(), (lo, hi)))
    labels = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    if not any("min-max of 3 runs" in l for l in labels):
        fail("3 repeats: no min-max legend entry in %s" % labels)
    # One timed repeat: no min-max bars promised.
    one = copy.deepcopy(doc)
    for e in one["entries"]:
        for t in (e.get("timings_ms") or {}).values():
            t.update(count=1, min=t["median"], max=t["median"], p90=t["median"])
    fig = capture_figures(script, one, work, "one_repeat")[0]
    labels = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    if any("min-max" in l for l in labels) or not any("one timed run" in l for l in labels):
        fail("one repeat: legend %s" % labels)
    if "1 timed repeat per P" not in fig._suptitle.get_text():
        fail("one repeat: title %r" % fig._suptitle.get_text())
    print("ok: figure (skipped P without a value, log ratio axes, title, legend)")


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
        p = run([sys.executable, a.script, bogus, "--out", os.path.join(a.workdir, "bogus")], ok=(2,))
        if "not a kcpbench results file" not in p.stdout:
            fail("the error for a non-results file does not say so")
        bad_inputs(a.script, a.fixture, a.workdir)
        figure_checks(a.script, a.fixture, a.workdir)

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

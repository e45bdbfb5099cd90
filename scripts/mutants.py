#!/usr/bin/env python3
"""Mutation suite: proves that the int1 rows catch realistic one-line bugs of the CPU twin and
the KCP engine.

  mutants.py [--ci] [--only ID ...] [--work DIR] [--json FILE] [--jobs N] [--mutants FILE]

Copies the tracked source tree (git ls-files) of the repository this script lives in into a
work folder, configures ONE CPU-only Release build there (no CUDA, NCCL, MPI or tests) and builds
only the kcpbench target. The unmutated binary must pass int1 first (exit 0), else the suite
stops. Then, per mutant of tests/mutants/mutants.json: replace its `find` text (which must occur
exactly once in its file) by `replace`, rebuild kcpbench, run

  kcpbench --configs configs run --rows int1 -q --json OUT.json --cache WORK/cache [--row X ...]

restore the file, and print one line: the mutant's id and CAUGHT / MISSED / BUILD-FAILED /
CRASHED(exit code), for a caught one the worst failing (row, form, tensor, ratio). The worst
ratio of an entry is the largest ratio_max or rms_ratio of its failing tensors (a non-finite
value or null ratio counts as infinite); a catch below 2 is flagged WEAK (the verdict depends on
the budget's margin, not on a clear breach). A mutant caught only by the det package's bitwise
contracts (exit 4, no failing tensor) is reported CAUGHT with its tensors' worst ratio, and so WEAK
below 2. The mutated sources never reach the repository: the product build carries no mutant path.

The work folder is reused: files whose contents did not change keep their time stamps, so a
second run rebuilds only what changed (the ctest scripts.mutants.ci_subset keeps its folder in
the build tree). The reference cache (WORK/cache) is shared by every run.

Exit codes: 0 every mutant run was caught at a ratio >= 2; 1 some mutant was missed, weak,
crashed or did not build; 2 bad usage (unknown id, bad mutants file, a `find` text not found
exactly once); 3 the unmutated tree does not configure, build or pass int1.
Python 3 standard library only.
"""
import argparse
import hashlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MUTANTS = os.path.join(ROOT, "tests", "mutants", "mutants.json")
CMAKE_OPTIONS = ["-DCMAKE_BUILD_TYPE=Release", "-DKCP_ENABLE_CUDA=OFF", "-DKCP_ENABLE_NCCL=OFF",
                 "-DKCP_ENABLE_MPI=OFF", "-DBUILD_TESTING=OFF"]
WEAK_BELOW = 2.0
REQUIRED = ("id", "area", "file", "find", "replace", "why")


class UsageError(Exception):
    """Bad command line or mutants file: exit 2."""


class SetupError(Exception):
    """The unmutated tree cannot be built or does not pass: exit 3."""


def log(msg):
    print(msg, flush=True)


# ---- the mutants file ----

def load_mutants(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise UsageError("cannot read the mutants file %s: %s" % (path, e.strerror))
    except json.JSONDecodeError as e:
        raise UsageError("%s is not JSON: %s" % (path, e))
    if not isinstance(doc, list) or not doc:
        raise UsageError("%s: expected a non-empty JSON list of mutants" % path)
    seen = set()
    for n, m in enumerate(doc):
        where = "%s: mutant [%d]" % (path, n)
        if not isinstance(m, dict):
            raise UsageError("%s: expected an object" % where)
        for key in REQUIRED:
            if not isinstance(m.get(key), str) or not m[key]:
                raise UsageError("%s (%s): '%s' must be a non-empty string" % (where, m.get("id", "?"), key))
        if m["id"] in seen:
            raise UsageError("%s: duplicate id '%s'" % (where, m["id"]))
        seen.add(m["id"])
        if m["find"] == m["replace"]:
            raise UsageError("%s (%s): 'replace' equals 'find' (no change)" % (where, m["id"]))
        if "ci" in m and not isinstance(m["ci"], bool):
            raise UsageError("%s (%s): 'ci' must be true or false" % (where, m["id"]))
        rows = m.get("rows", [])
        if not isinstance(rows, list) or not all(isinstance(r, str) and r for r in rows):
            raise UsageError("%s (%s): 'rows' must be a list of row names" % (where, m["id"]))
    return doc


def check_find(m, tree):
    """The mutated file's text; UsageError unless `find` occurs exactly once."""
    path = os.path.join(tree, m["file"])
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise UsageError("mutant %s: cannot read %s: %s" % (m["id"], m["file"], e.strerror))
    n = text.count(m["find"])
    if n != 1:
        raise UsageError("mutant %s: its 'find' text occurs %d times in %s (needs exactly 1): %r"
                         % (m["id"], n, m["file"], m["find"]))
    return text


# ---- the work tree and its build ----

def tracked_files():
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SetupError("cannot list the tracked files of %s (git ls-files): %s" % (ROOT, e))
    return [p for p in out.decode().split("\0") if p]


def sync_tree(work_src):
    """Copies every tracked file into work_src; unchanged files keep their time stamps."""
    copied = 0
    for rel in tracked_files():
        src, dst = os.path.join(ROOT, rel), os.path.join(work_src, rel)
        if not os.path.isfile(src) or os.path.islink(src):
            continue  # deleted in the checkout but not yet in the index, or a link: not needed to build
        with open(src, "rb") as f:
            data = f.read()
        if os.path.isfile(dst):
            with open(dst, "rb") as f:
                if f.read() == data:
                    continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(data)
        shutil.copymode(src, dst)
        copied += 1
    return copied


def run_logged(cmd, cwd, log_path, timeout=None, append=False):
    """Runs cmd with stdout+stderr into log_path; returns the exit code (None on timeout)."""
    with open(log_path, "a" if append else "w") as out:
        out.write("$ (cd %s && %s)\n" % (cwd, " ".join(shlex.quote(c) for c in cmd)))
        out.flush()
        try:
            return subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return None


def tail(path, lines=25):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


class MakeBuilder:
    """The default: one CPU-only Release build of the work copy (work/src/build), target kcpbench;
    make rebuilds what a mutant (or its restore) touched."""

    def __init__(self, src, out, jobs):
        self.src, self.out, self.jobs = src, out, jobs
        self.binary = os.path.join(src, "build", "app", "kcpbench")

    def describe(self):
        return "CPU-only Release build in %s" % os.path.join(self.src, "build")

    def build_base(self):
        log_path = os.path.join(self.out, "configure.log")
        if not os.path.isfile(os.path.join(self.src, "build", "CMakeCache.txt")):
            rc = run_logged(["cmake", "-S", ".", "-B", "build"] + CMAKE_OPTIONS, self.src, log_path)
            if rc != 0:
                raise SetupError("cmake configure of %s failed (exit %s); see %s:\n%s"
                                 % (self.src, rc, log_path, tail(log_path)))
        return self._make("base")

    def build_mutant(self, m):
        return self._make(m["id"])

    def _make(self, tag):
        log_path = os.path.join(self.out, "build-%s.log" % tag)
        rc = run_logged(["cmake", "--build", "build", "--target", "kcpbench", "-j", str(self.jobs)], self.src, log_path)
        return rc == 0, log_path


class ReuseBuilder:
    """--reuse-build DIR: the objects and libraries of an existing build of this checkout. A mutant
    is its one translation unit compiled with DIR's own command (compile_commands.json) from the
    mutated copy, then kcpbench linked with DIR's link line and that object placed before the static
    libraries (so the library's unmutated member is never pulled in). DIR is only read."""

    def __init__(self, build_dir, src, out):
        self.dir, self.src, self.out = os.path.abspath(build_dir), src, out
        self.binary = os.path.join(out, "kcpbench")
        link_txt = os.path.join(self.dir, "app", "CMakeFiles", "kcpbench.dir", "link.txt")
        commands = os.path.join(self.dir, "compile_commands.json")
        for path in (link_txt, commands, os.path.join(self.dir, "CMakeCache.txt")):
            if not os.path.isfile(path):
                raise UsageError("--reuse-build %s: no %s (a configured and built CMake build folder of kcpbench "
                                 "is needed)" % (build_dir, os.path.relpath(path, self.dir)))
        with open(link_txt) as f:
            self.link = shlex.split(f.read().strip().splitlines()[0])
        if "-o" not in self.link:
            raise UsageError("--reuse-build: %s has no -o in its link line" % link_txt)
        with open(commands) as f:
            self.commands = {os.path.realpath(e["file"]): e for e in json.load(f)}
        self.home = None
        with open(os.path.join(self.dir, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_HOME_DIRECTORY:"):
                    self.home = line.split("=", 1)[1].strip()
        if not self.home:
            raise UsageError("--reuse-build: no CMAKE_HOME_DIRECTORY in %s/CMakeCache.txt" % build_dir)

    def describe(self):
        return "objects of %s (sources %s)" % (self.dir, self.home)

    def check(self, m):
        """The build's own source of the mutated file must be this checkout's."""
        theirs = os.path.join(self.home, m["file"])
        key = os.path.realpath(theirs)
        if key not in self.commands:
            raise UsageError("mutant %s: %s has no compile command in %s/compile_commands.json"
                             % (m["id"], m["file"], self.dir))
        with open(theirs, "rb") as a, open(os.path.join(ROOT, m["file"]), "rb") as b:
            if a.read() != b.read():
                raise UsageError("mutant %s: %s of the build's sources (%s) differs from this checkout's: rebuild "
                                 "that build from this checkout, or leave out --reuse-build"
                                 % (m["id"], m["file"], self.home))

    def build_base(self):
        if not os.path.isfile(os.path.join(self.dir, "app", "kcpbench")):
            raise SetupError("--reuse-build %s: kcpbench is not built there (build it first)" % self.dir)
        return self._link([], os.path.join(self.out, "build-base.log"))

    def build_mutant(self, m):
        e = self.commands[os.path.realpath(os.path.join(self.home, m["file"]))]
        obj = os.path.join(self.out, "%s.o" % m["id"])
        args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
        i = 0
        cmd = []
        while i < len(args):  # no depfiles into DIR; the object and the source are ours
            a = args[i]
            if a in ("-MF", "-MT", "-MQ", "-o"):
                if a == "-o":
                    cmd += ["-o", obj]
                i += 2
                continue
            if a in ("-MD", "-MMD"):
                i += 1
                continue
            cmd.append(os.path.join(self.src, m["file"]) if os.path.realpath(
                os.path.join(e["directory"], a)) == os.path.realpath(e["file"]) else a)
            i += 1
        log_path = os.path.join(self.out, "build-%s.log" % m["id"])
        if run_logged(cmd, e["directory"], log_path) != 0:
            return False, log_path
        return self._link([obj], log_path, append=True)

    def _link(self, objects, log_path, append=False):
        cmd = list(self.link)
        at = cmd.index("-o")
        cmd[at + 1] = self.binary
        cmd[at + 2:at + 2] = objects
        return run_logged(cmd, os.path.join(self.dir, "app"), log_path, append=append) == 0, log_path


def binary_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run_int1(binary, src, out_json, cache, rows, log_path, timeout):
    """kcpbench run of int1 (or its rows `rows`) from the work copy; returns the exit code."""
    cmd = [binary, "-q", "--configs", os.path.join(src, "configs"), "run", "--rows", "int1", "--backend", "cpu",
           "--json", out_json, "--cache", cache]
    for r in rows:
        cmd += ["--row", r]
    if os.path.exists(out_json):
        os.remove(out_json)
    return run_logged(cmd, src, log_path, timeout)


# ---- verdicts ----

def as_ratio(x):
    if x is None:
        return math.inf
    x = float(x)
    return math.inf if not math.isfinite(x) else x


def form_text(form):
    form = form or {}
    return "%s/%s/P=%s" % (form.get("package", "?"), form.get("saved", "?"), form.get("P", "?"))


def worst_failure(results_path):
    """The worst failing (row, form, tensor, metric, ratio) of a results file, or None.
    Failing tensors of failing entries first; with none (a contract broken only), the worst ratio
    over the tensors of the contract_broken entries, metric 'contract'."""
    with open(results_path) as f:
        doc = json.load(f)
    best, contract = None, None
    for e in doc.get("entries", []):
        status = e.get("status")
        if status not in ("fail", "contract_broken"):
            continue
        for name, t in (e.get("tensors") or {}).items():
            for metric in ("ratio_max", "rms_ratio"):
                r = math.inf if t.get("nonfinite") else as_ratio(t.get(metric))
                cand = (r, e.get("row"), form_text(e.get("form")), name, metric)
                if not t.get("pass", True):
                    if best is None or cand[0] > best[0]:
                        best = cand
                elif status == "contract_broken" and (contract is None or cand[0] > contract[0]):
                    contract = cand
    if best is None and contract is not None:
        best = contract[:4] + ("contract",)
    return best


def metrics_of(results_path):
    """{(entry id, tensor, metric): value} of a results file's run entries."""
    with open(results_path) as f:
        doc = json.load(f)
    return {(e.get("id"), name, metric): t.get(metric)
            for e in doc.get("entries", []) for name, t in (e.get("tensors") or {}).items()
            for metric in ("ratio_max", "rms_ratio")}


def missed_detail(results_path, base_path):
    """For a missed mutant: the run's worst ratio (any tensor) and how many metrics differ from the
    unmutated run's. None differing means int1 never feels the change (dead or equivalent code)."""
    mine, base = metrics_of(results_path), metrics_of(base_path)
    worst = max(((as_ratio(v), k) for k, v in mine.items()), default=(0.0, None), key=lambda x: x[0])
    differ = sum(1 for k, v in mine.items() if k in base and base[k] != v)
    base_worst = max((as_ratio(v) for v in base.values()), default=0.0)
    return {"worst_ratio": None if math.isinf(worst[0]) else worst[0],
            "worst_at": "%s %s %s" % worst[1] if worst[1] else None,
            "metrics_differing": differ, "unmutated_worst_ratio": base_worst}


def fmt_ratio(r):
    return "inf" if math.isinf(r) else "%.4g" % r


def judge(m, rc, results_path, base_path):
    """The mutant's record from the run's exit code and results file."""
    rec = {"id": m["id"], "area": m["area"], "file": m["file"], "why": m["why"], "exit_code": rc}
    if rc is None:
        rec["result"] = "CRASHED(timeout)"
        return rec
    if rc == 0:
        rec["result"] = "MISSED"
        try:
            rec.update(missed_detail(results_path, base_path))
        except (OSError, ValueError) as e:
            rec["note"] = "no results to compare with the unmutated run: %s" % e
        return rec
    if rc not in (1, 4):
        rec["result"] = "CRASHED(%d)" % rc
        return rec
    try:
        w = worst_failure(results_path)
    except (OSError, ValueError) as e:
        rec["result"] = "CRASHED(%d)" % rc
        rec["note"] = "exit %d but no readable results file: %s" % (rc, e)
        return rec
    if w is None:
        rec["result"] = "CRASHED(%d)" % rc
        rec["note"] = "exit %d but no failing or contract_broken entry in the results" % rc
        return rec
    ratio, row, form, tensor, metric = w
    rec.update(result="CAUGHT", row=row, form=form, tensor=tensor, metric=metric,
               ratio=None if math.isinf(ratio) else ratio, weak=ratio < WEAK_BELOW)
    return rec


def line_of(rec, width):
    text = "%-*s %s" % (width, rec["id"], rec["result"])
    if rec["result"] == "CAUGHT":
        ratio = math.inf if rec["ratio"] is None else rec["ratio"]
        text += "  %s %s %s %s %s" % (rec["row"], rec["form"], rec["tensor"], rec["metric"], fmt_ratio(ratio))
        if rec["weak"]:
            text += "  WEAK (< %g)" % WEAK_BELOW
    if rec["result"] == "MISSED" and "metrics_differing" in rec:
        if rec["metrics_differing"] == 0:
            text += "  no ratio differs from the unmutated run (dead or equivalent code?)"
        else:
            worst = math.inf if rec["worst_ratio"] is None else rec["worst_ratio"]
            text += "  %d ratios differ from the unmutated run; worst %s at %s (unmutated worst %s)" % (
                rec["metrics_differing"], fmt_ratio(worst), rec["worst_at"], fmt_ratio(rec["unmutated_worst_ratio"]))
    if rec.get("binary_unchanged"):
        text += "  (binary identical to the unmutated build)"
    if rec.get("note"):
        text += "  (%s)" % rec["note"]
    return text + "  [%.0f s]" % rec.get("seconds", 0)


# ---- the suite ----

def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Builds each single-bug mutant of the CPU twin and the KCP engine (tests/mutants/mutants.json) "
                    "in a separate CPU-only build, runs int1 on it and reports whether int1 catches it.",
        epilog="Exit codes: 0 all caught at ratio >= 2; 1 some missed, weak, crashed or not built; "
               "2 bad usage or mutants file; 3 the unmutated tree does not build or pass int1.")
    p.add_argument("--ci", action="store_true",
                   help="run only the mutants marked \"ci\": true, each on its \"rows\" (the ctest subset)")
    p.add_argument("--only", nargs="+", metavar="ID", default=[],
                   help="run only these mutant ids (with --ci: those of the CI subset)")
    p.add_argument("--work", metavar="DIR",
                   default=os.path.join(tempfile.gettempdir(), "kcpbench-mutants"),
                   help="work folder: the source copy in DIR/src (build in DIR/src/build), logs and results "
                        "in DIR/out, the reference cache in DIR/cache (default: %(default)s); reused between runs")
    p.add_argument("--json", metavar="FILE", help="write a machine-readable summary of every mutant to FILE")
    p.add_argument("--jobs", type=int, default=2, metavar="N", help="parallel build jobs (default: %(default)s)")
    p.add_argument("--mutants", metavar="FILE", default=DEFAULT_MUTANTS,
                   help="the mutants file (default: tests/mutants/mutants.json of this repository)")
    p.add_argument("--reuse-build", metavar="DIR",
                   help="instead of a build of its own, reuse the objects of DIR, an existing build of this checkout "
                        "(kcpbench built there): each mutant compiles its one file with DIR's command and links a "
                        "kcpbench in WORK/out; DIR is only read (the ctest subset uses its own build tree)")
    p.add_argument("--timeout", type=int, default=1800, metavar="SECONDS",
                   help="seconds one int1 run may take before it counts as CRASHED(timeout) (default: %(default)s)")
    a = p.parse_args(argv)
    if a.jobs < 1:
        p.error("--jobs must be >= 1")
    if a.timeout < 1:
        p.error("--timeout must be >= 1")
    return a


def select(mutants, args):
    chosen = [m for m in mutants if m.get("ci")] if args.ci else list(mutants)
    if args.ci and not chosen:
        raise UsageError("%s marks no mutant \"ci\": true" % args.mutants)
    if args.only:
        known = {m["id"] for m in chosen}
        unknown = [i for i in args.only if i not in known]
        if unknown:
            raise UsageError("unknown mutant id(s)%s: %s (see %s)"
                             % (" in the CI subset" if args.ci else "", ", ".join(unknown), args.mutants))
        chosen = [m for m in chosen if m["id"] in args.only]
    return chosen


def rows_text(rows):
    return " (rows %s)" % ", ".join(rows) if rows else ""


def baseline(builder, ctx, rows):
    t0 = time.time()
    ok, log_path = builder.build_base()
    if not ok:
        raise SetupError("the unmutated tree does not build (%s); see %s:\n%s"
                         % (builder.describe(), log_path, tail(log_path)))
    log("mutants: unmutated kcpbench built in %.0f s (%s)" % (time.time() - t0, builder.describe()))
    t0 = time.time()
    run_log = os.path.join(ctx["out"], "run-base.log")
    rc = run_int1(builder.binary, ctx["src"], os.path.join(ctx["out"], "base.json"), ctx["cache"], rows, run_log,
                  ctx["timeout"])
    if rc != 0:
        raise SetupError("the unmutated kcpbench does not pass int1%s (exit %s): the suite cannot judge mutants; "
                         "see %s:\n%s" % (rows_text(rows), rc, run_log, tail(run_log)))
    log("mutants: unmutated int1%s passes (%.0f s)" % (rows_text(rows), time.time() - t0))
    return binary_digest(builder.binary)


def run_mutant(m, builder, ctx, rows):
    path = os.path.join(ctx["src"], m["file"])
    original = check_find(m, ctx["src"])
    t0 = time.time()
    rec = {"id": m["id"], "area": m["area"], "file": m["file"], "why": m["why"]}
    try:
        with open(path, "w") as f:
            f.write(original.replace(m["find"], m["replace"], 1))
        ok, log_path = builder.build_mutant(m)
        if not ok:
            rec.update(result="BUILD-FAILED", exit_code=None, note="see " + log_path)
        else:
            unchanged = binary_digest(builder.binary) == ctx["base_digest"]
            results = os.path.join(ctx["out"], "%s.json" % m["id"])
            rc = run_int1(builder.binary, ctx["src"], results, ctx["cache"], rows,
                          os.path.join(ctx["out"], "run-%s.log" % m["id"]), ctx["timeout"])
            rec.update(judge(m, rc, results, os.path.join(ctx["out"], "base.json")))
            rec["binary_unchanged"] = unchanged
    finally:
        with open(path, "w") as f:  # a fresh time stamp: the next make recompiles the restored file
            f.write(original)
    if rows:
        rec["rows"] = rows
    rec["seconds"] = time.time() - t0
    return rec


def summarize(recs):
    caught = [r for r in recs if r["result"] == "CAUGHT"]
    weak = [r for r in caught if r["weak"]]
    missed = [r for r in recs if r["result"] == "MISSED"]
    other = [r for r in recs if r["result"] not in ("CAUGHT", "MISSED")]
    text = "caught %d of %d (%d weak, %d missed)" % (len(caught), len(recs), len(weak), len(missed))
    if other:
        text += ", %d crashed or not built" % len(other)
    ok = len(caught) == len(recs) and not weak
    return text, ok, {"caught": len(caught), "total": len(recs), "weak": len(weak), "missed": len(missed),
                      "crashed_or_not_built": len(other), "all_caught_strong": ok}


def main(argv):
    args = parse_args(argv)
    t_start = time.time()
    try:
        mutants = select(load_mutants(args.mutants), args)
        for m in mutants:  # every find text checked before the long build
            check_find(m, ROOT)
        work = os.path.abspath(args.work)
        ctx = {"src": os.path.join(work, "src"), "out": os.path.join(work, "out"), "cache": os.path.join(work, "cache"),
               "timeout": args.timeout}
        for d in (ctx["src"], ctx["out"], ctx["cache"]):
            os.makedirs(d, exist_ok=True)
        if args.reuse_build:
            builder = ReuseBuilder(args.reuse_build, ctx["src"], ctx["out"])
            for m in mutants:
                builder.check(m)
        else:
            builder = MakeBuilder(ctx["src"], ctx["out"], args.jobs)
        copied = sync_tree(ctx["src"])
        log("mutants: %d mutant(s)%s; work folder %s (%d file(s) copied)"
            % (len(mutants), " (CI subset)" if args.ci else "", work, copied))
        # CI: each mutant runs its own rows, the baseline their union (all of int1 if one has none).
        rows_of = {m["id"]: (m.get("rows", []) if args.ci else []) for m in mutants}
        base_rows = [] if any(not r for r in rows_of.values()) else sorted({r for v in rows_of.values() for r in v})
        ctx["base_digest"] = baseline(builder, ctx, base_rows)
        width = max(len(m["id"]) for m in mutants)
        recs = []
        for m in mutants:
            rec = run_mutant(m, builder, ctx, rows_of[m["id"]])
            recs.append(rec)
            log(line_of(rec, width))
    except UsageError as e:
        print("mutants: error: %s" % e, file=sys.stderr)
        return 2
    except SetupError as e:
        print("mutants: %s" % e, file=sys.stderr)
        return 3
    text, ok, counts = summarize(recs)
    log("mutants: %s in %.0f s" % (text, time.time() - t_start))
    if args.json:
        doc = {"schema": "kcpbench.mutants/1", "ci": args.ci, "weak_below": WEAK_BELOW, "summary": counts,
               "seconds": round(time.time() - t_start, 1), "mutants": recs}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

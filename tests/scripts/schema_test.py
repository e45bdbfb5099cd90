#!/usr/bin/env python3
"""The JSON schemas against the committed files, and that they can reject.

  schema_test.py --source-dir DIR                     committed files + broken documents
  schema_test.py --source-dir DIR --kcpbench BIN --workdir W
                                                      fresh `kcpbench run` / `replay` / `merge` output

Committed files: every JSON file git tracks (every *.json below DIR outside git) is classified by
its marker: "schema": "kcpbench.rows/1" is a row file, checked against configs/rows.schema.json;
"context.schema_version": "kcpbench.results/1" is a results file, checked against
configs/results.schema.json, and each entry's row_config against the row schema's row. Broken
documents (a real file with one thing changed) must be rejected at the place changed.
Needs python3-jsonschema (draft 2020-12: jsonschema >= 4).
"""
import argparse
import copy
import glob
import json
import os
import subprocess
import sys

import jsonschema

ROWS_MARK = "kcpbench.rows/1"
RESULTS_MARK = "kcpbench.results/1"
# Files that carry a results marker but are not whole results files, with the reason.
NOT_RESULTS = {
    "tests/scripts/data/sweep_small.json":
        "hand-trimmed fixture of scripts/plot_p_sweep.py: only the keys the plot reads",
}

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def validator(schema):
    cls = jsonschema.Draft202012Validator
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def row_validator(rows_schema):
    """A validator of one row (after the defaults are merged in): the rows schema's $defs/row."""
    return validator({"$schema": rows_schema["$schema"], "$defs": rows_schema["$defs"], "$ref": "#/$defs/row"})


def errors_of(v, doc):
    return sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path))


def where(e):
    return "/" + "/".join(str(p) for p in e.absolute_path)


def check_results_doc(name, doc, rv, rowv):
    errs = errors_of(rv, doc)
    for e in errs[:10]:
        fail("%s: %s: %s" % (name, where(e), e.message[:300]))
    if len(errs) > 10:
        fail("%s: %d more schema errors" % (name, len(errs) - 10))
    for i, e in enumerate(doc.get("entries", [])):
        if isinstance(e, dict) and isinstance(e.get("row_config"), dict):
            for x in errors_of(rowv, e["row_config"])[:3]:
                fail("%s: /entries/%d/row_config%s: %s" % (name, i, where(x), x.message[:300]))
    return not errs


def tracked_json(src):
    try:
        out = subprocess.run(["git", "-C", src, "ls-files", "-z", "--", "*.json"], check=True,
                             capture_output=True).stdout.decode()
        return sorted(p for p in out.split("\0") if p)
    except (OSError, subprocess.CalledProcessError):
        return sorted(os.path.relpath(p, src) for p in glob.glob(os.path.join(src, "**", "*.json"), recursive=True)
                      if "/build" not in p)


def committed(src, rv, rowsv, rowv):
    rows_files, results_files = [], []
    for rel in tracked_json(src):
        if rel.startswith("configs/") and rel.endswith(".schema.json"):
            continue
        with open(os.path.join(src, rel)) as f:
            doc = json.load(f)
        if not isinstance(doc, dict):
            continue
        if doc.get("schema") == ROWS_MARK:
            rows_files.append(rel)
            for e in errors_of(rowsv, doc)[:10]:
                fail("%s: %s: %s" % (rel, where(e), e.message[:300]))
        elif isinstance(doc.get("context"), dict) and doc["context"].get("schema_version") == RESULTS_MARK:
            if rel in NOT_RESULTS:
                print("not a whole results file: %s (%s)" % (rel, NOT_RESULTS[rel]))
                continue
            results_files.append(rel)
            check_results_doc(rel, doc, rv, rowv)
    print("row files: %d (%s)" % (len(rows_files), ", ".join(rows_files)))
    print("results files: %d (%s)" % (len(results_files), ", ".join(results_files)))
    # The classification must find what is known to be there (a marker renamed would hide files).
    for need in ["configs/rows/int1.json", "configs/rows/int3.json", "configs/rows/int4.json", "tests/gpu/bench_rows.json"]:
        if need not in rows_files:
            fail("row file %s was not found as a row file" % need)
    if not any(r.startswith("results/") and "/baseline/" in r for r in results_files):
        fail("no results/<device>/baseline/*.json found as a results file")
    for rel in NOT_RESULTS:
        if not os.path.exists(os.path.join(src, rel)):
            fail("NOT_RESULTS names %s, which does not exist (drop it from the list)" % rel)


def find_entry(doc, pred, what):
    for e in doc["entries"]:
        if pred(e):
            return e
    raise SystemExit("schema_test.py: no entry %s in the base document (the committed files changed?)" % what)


def broken_cases(src, rv, rowsv, rowv):
    """Each case changes one thing in a valid document; the schema must reject it at that place."""
    with open(os.path.join(src, "results/h200/baseline/int1.json")) as f:
        res = json.load(f)
    with open(os.path.join(src, "configs/rows/int1.json")) as f:
        rows = json.load(f)
    # The base documents are small cuts of real files: one entry of each kind.
    passing = find_entry(res, lambda e: e["status"] == "pass" and e["form"]["package"] == "det", "det pass")
    skipped = find_entry(res, lambda e: e["status"] == "skip", "skip")
    res = dict(res, entries=[passing, skipped])
    pi = 0
    si = 1
    t0 = next(iter(passing["tensors"]))

    def res_case(label, at, mutate):
        d = copy.deepcopy(res)
        mutate(d)
        return label, rv, d, at

    def row_case(label, at, mutate):
        d = copy.deepcopy(rows)
        mutate(d)
        return label, rowsv, d, at

    def pop(obj, key):
        obj.pop(key)

    def no_budget(t, count, passed):  # a tensor of a row without its budget, as compare.cpp writes it
        for k in ("ratio_max", "rms_ratio"):
            t.pop(k, None)
        t.update(budget=None, count=count, **{"pass": passed})

    cases = [
        res_case("unknown status", "/entries/%d/status" % pi, lambda d: d["entries"][pi].update(status="error")),
        res_case("ratio written as a string", "/entries/%d/tensors/%s/ratio_max" % (pi, t0),
                 lambda d: d["entries"][pi]["tensors"][t0].update(ratio_max="0.5")),
        res_case("unknown entry key", "/entries/%d" % pi, lambda d: d["entries"][pi].update(extra=1)),
        res_case("unknown tensor name", "/entries/%d/tensors" % pi,
                 lambda d: d["entries"][pi]["tensors"].update(dz=d["entries"][pi]["tensors"][t0])),
        res_case("build without git_sha", "/context/build", lambda d: pop(d["context"]["build"], "git_sha")),
        res_case("a pass with a reason", "/entries/%d" % pi, lambda d: d["entries"][pi].update(reason="x")),
        res_case("a skip with tensors", "/entries/%d" % si,
                 lambda d: d["entries"][si].update(tensors=d["entries"][pi]["tensors"])),
        res_case("a skip without its reason", "/entries/%d" % si, lambda d: pop(d["entries"][si], "reason")),
        res_case("a ratio without a budget", "/entries/%d/tensors/%s" % (pi, t0),
                 lambda d: d["entries"][pi]["tensors"][t0].update(budget=None)),
        res_case("a judged tensor passing without a budget", "/entries/%d/tensors/%s" % (pi, t0),
                 lambda d: no_budget(d["entries"][pi]["tensors"][t0], count=5, passed=True)),
        res_case("forced P as text", "/entries/%d/form/P" % pi, lambda d: d["entries"][pi]["form"].update(P="P=2")),
        res_case("negative count in the summary", "/summary/passed", lambda d: d["summary"].update(passed=-1)),
        res_case("stats without a median", "/entries/%d/timings_ms/total" % pi,
                 lambda d: pop(d["entries"][pi]["timings_ms"]["total"], "median")),
        res_case("a run entry without its plan", "/entries/%d" % pi, lambda d: pop(d["entries"][pi], "plan")),
        res_case("no entries", "", lambda d: pop(d, "entries")),
        res_case("another schema version", "/context/schema_version",
                 lambda d: d["context"].update(schema_version="kcpbench.results/2")),
        row_case("unknown row key", "/rows/0", lambda d: d["rows"][0].update(headz=3)),
        row_case("tensor budget without rel_rms", "/rows/0/budgets/tensors/o",
                 lambda d: pop(d["rows"][0]["budgets"]["tensors"]["o"], "rel_rms")),
        row_case("unknown tensor budget", "/rows/0/budgets/tensors",
                 lambda d: d["rows"][0]["budgets"]["tensors"].update(dz={"max_abs": 1, "rel_rms": 1})),
        row_case("unknown package", "/rows/0/forms/packages/0",
                 lambda d: d["rows"][0].update(forms={"packages": ["fast"]})),
        row_case("unknown key in defaults", "/defaults", lambda d: d["defaults"].update(headz=3)),
        row_case("unknown key in inputs", "/rows/0/inputs", lambda d: d["rows"][0].update(inputs={"keyz": "normal"})),
        row_case("row without seqlens", "/rows/0", lambda d: pop(d["rows"][0], "seqlens")),
    ]
    for label, v, base in [("results base", rv, res), ("rows base", rowsv, rows)]:
        for e in errors_of(v, base)[:5]:
            fail("%s is not valid, so the broken cases prove nothing: %s: %s" % (label, where(e), e.message[:300]))
    for label, v, doc, at in cases:
        errs = errors_of(v, doc)
        if not errs:
            fail("broken document accepted: %s" % label)
        elif not any(where(e) == (at or "/") or where(e).startswith(at + "/") for e in errs):
            fail("broken document %s rejected elsewhere than %s: %s" %
                 (label, at or "/", "; ".join("%s: %s" % (where(e), e.message[:120]) for e in errs[:3])))
        else:
            print("rejected as it should be: %s (%s)" % (label, at or "/"))
    # A tensor nothing judged (count 0: h_entry / dh_exit where no boundary carries state) passes
    # without a budget, as compare.cpp's judge() writes it.
    d = copy.deepcopy(res)
    no_budget(d["entries"][pi]["tensors"][t0], count=0, passed=True)
    for e in errors_of(rv, d)[:3]:
        fail("a count-0 tensor passing without a budget rejected: %s: %s" % (where(e), e.message[:200]))
    # row_config of a results entry: checked against the row schema, so a bad one is caught.
    d = copy.deepcopy(res)
    d["entries"][pi]["row_config"]["headz"] = 3
    if not errors_of(rowv, d["entries"][pi]["row_config"]):
        fail("broken document accepted: a row_config with an unknown key")


def fresh(src, rv, rowv, kcpbench, workdir):
    """Files the built kcpbench writes now, in the shapes the committed files may not show."""
    os.makedirs(workdir, exist_ok=True)
    env = dict(os.environ, KCP_CONFIGS_DIR=os.path.join(src, "configs"))
    runs = [
        ("forms", ["run", "--rows", "int1", "--row", "A2", "--phase-times", "--repeats", "2"], 0),
        ("sweep", ["run", "--rows", "int1", "--row", "A1", "--sweep-P", "1,2", "--package", "nondet",
                   "--saved", "full"], 0),
        ("fault", ["run", "--rows", "int1", "--row", "A1", "--package", "nondet", "--saved", "full",
                   "--inject", "drop-segment-entry"], 1),
        ("skip", ["run", "--rows", "int1", "--row", "C1", "--P", "2", "--package", "nondet", "--saved", "full"], 0),
    ]
    for name, args, want_rc in runs:
        out = os.path.join(workdir, name + ".json")
        if os.path.exists(out):
            os.remove(out)
        cmd = [kcpbench, "-q"] + args + ["--cache", "none", "--json", out]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != want_rc or not os.path.exists(out):
            fail("%s: exit %d (expected %d), json %s\n%s" % (" ".join(cmd), p.returncode, want_rc,
                                                            "written" if os.path.exists(out) else "missing",
                                                            p.stdout[-2000:] + p.stderr[-2000:]))
            continue
        with open(out) as f:
            doc = json.load(f)
        if check_results_doc("fresh " + name, doc, rv, rowv):
            print("fresh %s: valid (%d entries)" % (name, len(doc["entries"])))
        if name == "sweep" and not any(e.get("sweep") for e in doc["entries"]):
            fail("fresh sweep: no entry with sweep: true")
        if name == "fault" and not any("fault_at" in e and e["status"] == "fail" for e in doc["entries"]):
            fail("fresh fault: no failed entry with fault_at")
        if name == "skip" and not any(e["status"] == "skip" and "plan" in e for e in doc["entries"]):
            fail("fresh skip: no skip entry of a form (C1's forced P = 2 by the all_ranks_plan_p1 rule)")
        if name == "forms":
            det = [e for e in doc["entries"] if e.get("determinism")]
            phases = [e for e in doc["entries"] if "phases" in e.get("timings_ms", {})]
            if not det or not phases:
                fail("fresh forms: expected det checks and phase times, got %d and %d entries" % (len(det), len(phases)))
            replay_out = os.path.join(workdir, "replay.json")
            entry = doc["entries"][0]["id"]
            cmd = [kcpbench, "-q", "replay", out, "--entry", entry, "--cache", "none", "--json", replay_out]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0 or not os.path.exists(replay_out):
                fail("%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stdout[-2000:] + p.stderr[-2000:]))
            else:
                with open(replay_out) as f:
                    if check_results_doc("fresh replay", json.load(f), rv, rowv):
                        print("fresh replay: valid")
    # merge: the forms and sweep runs (same build, device and row set) as one file.
    merged = os.path.join(workdir, "merged.json")
    cmd = [kcpbench, "-q", "merge", os.path.join(workdir, "forms.json"), os.path.join(workdir, "sweep.json"),
           "--json", merged, "--allow-dirty"]  # the build under test may be a developer's dirty tree
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0 or not os.path.exists(merged):
        fail("%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stdout[-2000:] + p.stderr[-2000:]))
    else:
        with open(merged) as f:
            doc = json.load(f)
        if check_results_doc("fresh merge", doc, rv, rowv):
            print("fresh merge: valid (%d entries from %d files)" % (len(doc["entries"]),
                                                                     len(doc["context"]["merged_from"])))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--kcpbench", help="check what this binary writes instead of the committed files")
    ap.add_argument("--workdir", help="with --kcpbench: where its files go")
    a = ap.parse_args()
    src = os.path.abspath(a.source_dir)
    with open(os.path.join(src, "configs/results.schema.json")) as f:
        results_schema = json.load(f)
    with open(os.path.join(src, "configs/rows.schema.json")) as f:
        rows_schema = json.load(f)
    rv, rowsv, rowv = validator(results_schema), validator(rows_schema), row_validator(rows_schema)
    if a.kcpbench:
        if not a.workdir:
            ap.error("--kcpbench needs --workdir")
        fresh(src, rv, rowv, a.kcpbench, a.workdir)
    else:
        committed(src, rv, rowsv, rowv)
        broken_cases(src, rv, rowsv, rowv)
    if failures:
        print("schema_test: %d failure(s)" % len(failures))
        return 1
    print("schema_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

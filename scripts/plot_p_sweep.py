#!/usr/bin/env python3
"""Plot a segment-count sweep from a kcpbench results JSON (kcpbench.results/1).

    kcpbench run --rows int1 --row A1 --sweep-P 1:64:pow2 --json sweep.json
    python3 scripts/plot_p_sweep.py sweep.json --out plots/

One figure per row and form (package/saved set), written as PNG and SVG:
  * ratio_max of every tensor against P (log-2 axis), the budget line at 1;
  * rms ratio of every tensor against P, the budget line at 1;
  * time against P (timings_ms.total median, min-max bars; forward and backward medians), where
    the entries hold timings.
Forced-P entries are the curves; the planned schedule is drawn as stars at the largest planned P
of its ranks, with a dotted line there labelled with every rank's planned P. Ratios are on a log
axis that holds every value and the budget line at 1. A skipped P has no value: it is a gap in
the curves under a gray band labelled "skipped"; a non-finite ratio is a red triangle at the top.
Min-max bars are drawn only where an entry has more than one timed repeat. The title names the
row's shape (from the entries' row_config), the device and the timed repeats. Reads only the JSON.

Exit codes: 0 written; 2 a file that cannot be read, is not JSON, is not a kcpbench results file
or holds no P sweep (one line on stderr naming the file and what is missing); 3 matplotlib is not
importable (needed only to draw: --help works without it).
Dependencies: scripts/requirements.txt (matplotlib).
"""
import argparse
import json
import math
import os
import re
import sys

plt = FixedLocator = FuncFormatter = NullLocator = Patch = None  # matplotlib, imported by draw()


def import_matplotlib():
    """Imports matplotlib only when something is drawn (--help and bad input do not need it)."""
    global plt, FixedLocator, FuncFormatter, NullLocator, Patch
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    except ImportError as exc:  # fail loudly: a plot that silently is not drawn helps nobody
        sys.stderr.write(
            "plot_p_sweep.py: matplotlib is not importable by %s (%s).\n"
            "Install it: pip install -r scripts/requirements.txt, or apt-get install python3-matplotlib\n"
            % (sys.executable, exc)
        )
        sys.exit(3)


TENSOR_ORDER = ["o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0", "h_entry", "dh_exit"]


def die(msg):
    """One line on stderr, exit 2 (bad input)."""
    sys.stderr.write("plot_p_sweep.py: %s\n" % msg)
    sys.exit(2)


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        die("cannot read %s: %s" % (path, exc.strerror or exc))
    except UnicodeDecodeError as exc:
        die("%s is not JSON (not UTF-8 text: %s)" % (path, exc.reason))
    except ValueError as exc:
        die("%s is not JSON (%s)" % (path, exc))
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        die("%s is not a kcpbench results file (no 'entries' array)" % path)
    schema = (doc.get("context") or {}).get("schema_version")
    if schema != "kcpbench.results/1":
        die("%s has schema %r, expected 'kcpbench.results/1'" % (path, schema))
    return doc


def is_sweep_entry(e):
    form = e.get("form")
    return isinstance(form, dict) and e.get("sweep") is True and isinstance(form.get("P"), int) \
        and not isinstance(form.get("P"), bool)


def number(x):
    """A finite float, or None (JSON null stands for a non-finite value)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def groups(doc, rows):
    """{(row, package, saved): {"forced": [entry...], "planned": entry|None}} in file order."""
    out = {}
    for e in doc["entries"]:
        form = e.get("form")
        if not isinstance(form, dict) or (rows and e.get("row") not in rows):
            continue
        key = (e.get("row", "?"), form.get("package", "?"), form.get("saved", "?"))
        g = out.setdefault(key, {"forced": [], "planned": None})
        if isinstance(form.get("P"), int):
            g["forced"].append(e)
        elif g["planned"] is None:
            g["planned"] = e
    return out


def planned_x(entry):
    ps = entry.get("planned_P") or (entry.get("plan") or {}).get("P") or [1]
    return max(ps), ps


def tensors_of(entries):
    names = set()
    for e in entries:
        names.update((e.get("tensors") or {}).keys())
    return sorted(names, key=lambda n: (TENSOR_ORDER.index(n) if n in TENSOR_ORDER else 99, n))


def log2_axis(ax, xs):
    ax.set_xscale("log", base=2)
    ticks = sorted(set(xs))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: "%g" % v))
    if ticks:
        ax.set_xlim(ticks[0] / 1.3, ticks[-1] * 1.3)
    ax.set_xlabel("segments per rank P (forced on every rank)")
    ax.grid(True, which="major", alpha=0.3)


def ratio_panel(ax, metric, title, forced, planned, names, colors):
    top = 1.0
    low = None
    for name in names:
        pts = []
        for e in forced:
            v = number(((e.get("tensors") or {}).get(name) or {}).get(metric))
            if e.get("status") != "skip" and v is not None:
                pts.append((e["form"]["P"], v))
        pts.sort()
        if pts:
            # Skipped P values are gaps, not zeros: the line breaks there.
            xs_all = sorted({e["form"]["P"] for e in forced})
            present = dict(pts)
            ys = [present.get(x, float("nan")) for x in xs_all]
            pts = [(x, y) for x, y in zip(xs_all, ys)]
            ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", ms=4, lw=1.2, color=colors[name], label=name)
            top = max(top, max(v for _, v in pts if v == v))
            pos = [v for _, v in pts if v > 0]
            if pos:
                low = min(pos + ([low] if low is not None else []))
        if planned is not None and planned.get("status") != "skip":
            v = number(((planned.get("tensors") or {}).get(name) or {}).get(metric))
            if v is not None:
                ax.plot([planned_x(planned)[0]], [v], marker="*", ms=12, color=colors[name], mec="black", mew=0.5,
                        ls="none")
                top = max(top, v)
    # Non-finite ratios (null in the JSON): red triangles at the top.
    bad = [e["form"]["P"] for e in forced if e.get("status") != "skip" and any(
        name in (e.get("tensors") or {}) and metric in e["tensors"][name] and number(e["tensors"][name][metric]) is None
        for name in names)]
    if bad:
        ax.plot(bad, [0.97] * len(bad), marker="^", color="red", ls="none", transform=ax.get_xaxis_transform(),
                label="non-finite", clip_on=False)
    ax.axhline(1.0, color="black", lw=1.0, ls="--", label="budget (ratio 1)")
    # Log axis holding every value and the budget line: tensors a few percent apart stay apart,
    # and a ratio of 0.3 is as far from the budget as one of 3. (A ratio of exactly 0 is a gap.)
    ax.set_yscale("log")
    low = min(low if low is not None else 1.0, 1.0)
    lo, hi = low / 2.0, max(top, 1.0) * 1.6
    ax.set_ylim(lo, hi)
    # 1-2-5 ticks (LogLocator leaves most of them out on a range of one or two decades).
    ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
             for m in (1, 2, 5)]
    ticks = [t for t in ticks if lo <= t <= hi]
    if len(ticks) > 9:
        ticks = [t for t in ticks if round(t / 10.0 ** math.floor(math.log10(t))) == 1]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "%g" % v))
    ax.set_ylabel(metric.replace("_", " ") + " (error / budget)")
    ax.set_title(title)


def time_panel(ax, forced, planned):
    def stat(e, phase):
        t = ((e.get("timings_ms") or {}).get(phase)) or {}
        return number(t.get("median")), number(t.get("min")), number(t.get("max"))

    rows = []
    for e in forced:
        if e.get("status") == "skip":
            continue
        med, lo, hi = stat(e, "total")
        if med is not None:
            rows.append((e["form"]["P"], med, lo if lo is not None else med, hi if hi is not None else med, e))
    rows.sort(key=lambda r: r[0])
    if rows:
        # A skipped P between timed ones is a gap in the line, not a point at 0 ms.
        nan = float("nan")
        timed_P = {r[0] for r in rows}
        rows += [(e["form"]["P"], nan, nan, nan, {}) for e in forced
                 if e.get("status") == "skip" and e["form"]["P"] not in timed_P]
        rows.sort(key=lambda r: r[0])
        xs = [r[0] for r in rows]
        counts = [int(((r[4].get("timings_ms") or {}).get("total") or {}).get("count") or 1) for r in rows if r[4]]
        if max(counts) > 1:
            n = "%d" % max(counts) if min(counts) == max(counts) else "%d-%d" % (min(counts), max(counts))
            ax.errorbar(xs, [r[1] for r in rows], yerr=[[r[1] - r[2] for r in rows], [r[3] - r[1] for r in rows]],
                        marker="o", ms=4, color="black", capsize=3, label="total (median, min-max of %s runs)" % n)
        else:  # one timed run per P: nothing to draw a spread from
            ax.plot(xs, [r[1] for r in rows], marker="o", ms=4, color="black", label="total (one timed run)")
        for phase, style in (("forward", ":"), ("backward", "--")):
            pts = [(r[0], stat(r[4], phase)[0]) for r in rows]
            pts = [(p, v) for p, v in pts if v is not None]
            if pts:
                ax.plot([p for p, _ in pts], [v for _, v in pts], ls=style, color="gray", label=phase + " (median)")
    if planned is not None and planned.get("status") != "skip":
        med = stat(planned, "total")[0]
        if med is not None:
            ax.plot([planned_x(planned)[0]], [med], marker="*", ms=12, color="gold", mec="black", mew=0.5, ls="none",
                    label="planned")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("time per forward + backward (ms)")
    ax.set_title("time")


def has_timings(entries):
    return any(number((((e.get("timings_ms") or {}).get("total")) or {}).get("median")) is not None
               for e in entries if e.get("status") != "skip")


def shape_text(entries):
    """The row's shape from an entry's row_config (results files echo the row as loaded)."""
    rc = next((e["row_config"] for e in entries if isinstance(e.get("row_config"), dict)), None)
    if rc is None:
        return "row shape not in the file (no row_config)"
    seqlens = rc.get("seqlens") or []
    parts = ["%s" % str(rc.get("op", "?")).upper()]
    parts.append(" ".join("%s=%s" % (k, rc[k]) for k in ("H", "HV", "K", "V") if k in rc))
    tokens = sum(x for x in seqlens if isinstance(x, int))
    parts.append("%d token%s in %d sequence%s" % (tokens, "" if tokens == 1 else "s", len(seqlens),
                                                    "" if len(seqlens) == 1 else "s"))
    if "world" in rc:
        parts.append("W=%s" % rc["world"])
    if "dtype" in rc:
        parts.append(str(rc["dtype"]))
    return ", ".join(parts)


def repeats_text(entries):
    counts = sorted({int(((e.get("timings_ms") or {}).get("total") or {}).get("count") or 0)
                     for e in entries if e.get("status") != "skip" and e.get("timings_ms")} - {0})
    if not counts:
        return "no timings"
    n = "%d" % counts[0] if len(counts) == 1 else "%d-%d" % (counts[0], counts[-1])
    return "%s timed repeat%s per P" % (n, "" if n == "1" else "s")


def safe(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def plot_group(key, g, context, out_dir, formats):
    row, package, saved = key
    forced, planned = g["forced"], g["planned"]
    everything = forced + ([planned] if planned else [])
    names = tensors_of(everything)
    cmap = plt.get_cmap("tab10")
    colors = {n: cmap(i % 10) for i, n in enumerate(names)}
    timed = has_timings(everything)
    panels = 3 if timed else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.4), squeeze=False)
    axes = axes[0]
    ratio_panel(axes[0], "ratio_max", "ratio_max per tensor", forced, planned, names, colors)
    ratio_panel(axes[1], "rms_ratio", "rms ratio per tensor", forced, planned, names, colors)
    if timed:
        time_panel(axes[2], forced, planned)
    xs = [e["form"]["P"] for e in forced]
    px = None
    if planned is not None:
        px, per_rank = planned_x(planned)
        xs.append(px)
    skipped = sorted({e["form"]["P"] for e in forced if e.get("status") == "skip"})
    for ax in axes:
        log2_axis(ax, xs or [1])
        if px is not None:
            ax.axvline(px, color="green", lw=1.0, ls=":",
                       label="planned P = %s" % ",".join(str(p) for p in per_rank))
        # A skipped P has no value: a gray band over the whole panel, named at its top.
        for p in skipped:
            ax.axvspan(p / 1.12, p * 1.12, color="0.85", zorder=0, lw=0)
            ax.text(p, 0.22, "skipped", transform=ax.get_xaxis_transform(), rotation=90, ha="center", va="center",
                    fontsize=8, color="0.35")
    handles, labels = [], []
    for ax in axes:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    if skipped:
        handles.append(Patch(color="0.85"))
        labels.append("skipped P (no value)")
    fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
    failed = [str(e["form"]["P"]) for e in forced if e.get("status") in ("fail", "contract_broken")]
    if planned is not None and planned.get("status") in ("fail", "contract_broken"):
        failed.insert(0, "planned")
    device = context.get("backend_device") or context.get("backend") or "?"
    line2 = "on %s, %s" % (device, repeats_text(everything))
    if failed:
        line2 += ";  fails at P = %s" % ", ".join(failed)
    fig.suptitle("%s  %s/%s:  %s\n%s" % (row, package, saved, shape_text(everything), line2), fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.83, 0.92))
    written = []
    base = os.path.join(out_dir, safe("%s_%s-%s" % (row, package, saved)))
    for fmt in formats:
        path = base + "." + fmt
        meta = {"Date": None} if fmt == "svg" else None
        fig.savefig(path, format=fmt, dpi=110, metadata=meta)
        written.append(path)
    plt.close(fig)
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="results JSON written by kcpbench run --sweep-P ... --json")
    ap.add_argument("--out", default=".", help="folder for the figures (created; default: .)")
    ap.add_argument("--row", action="append", default=[], help="only this row (repeatable)")
    ap.add_argument("--format", default="png,svg", help="comma list of png, svg (default: both)")
    args = ap.parse_args(argv)
    formats = [f for f in args.format.split(",") if f]
    for f in formats:
        if f not in ("png", "svg"):
            ap.error("--format: expected png and/or svg, got %r" % f)
    doc = load(args.results)
    gs = groups(doc, set(args.row))
    if not gs:
        die("no entries with a form in %s%s" % (args.results, " for rows " + ", ".join(args.row) if args.row else ""))
    sweeps = {k: g for k, g in gs.items() if any(is_sweep_entry(e) for e in g["forced"])}
    if not sweeps:
        die("%s is not a P sweep: no entry has \"sweep\": true and a forced P (form.P a number); "
            "make one with kcpbench run --sweep-P 1:64:pow2 --json FILE" % args.results)
    for key in gs:
        if key not in sweeps:
            sys.stderr.write("plot_p_sweep.py: %s %s/%s: not swept (no forced-P sweep entries), not plotted\n" % key)
    import_matplotlib()
    plt.rcParams["svg.hashsalt"] = "kcpbench"  # stable SVG ids
    gs = sweeps
    os.makedirs(args.out, exist_ok=True)
    for key, g in gs.items():
        for path in plot_group(key, g, doc.get("context") or {}, args.out, formats):
            print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

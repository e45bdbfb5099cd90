#!/usr/bin/env bash
# Nightly regression sweep: runs a row set, compares the results with the committed baseline,
# writes a markdown summary for a pull-request comment, and exits with compare's code.
#
#   scripts/nightly.sh                          # int3 on a GPU (--bench timings), int1 on the CPU twin
#   scripts/nightly.sh --set int1 -- --row 'A*'  # arguments after -- go to `kcpbench run`
#   scripts/nightly.sh --update-baseline        # adopt this run as the baseline (after a human look)
#
# Writes  results/<device>/<set>-<date>.json   the run (kcpbench.results/1)
#         results/<device>/<set>-<date>.md     compare's markdown summary
# Reads   results/<device>/baseline/<set>.json
# <device> is the GPU's class from nvidia-smi ("h200") when kcpbench was built with CUDA and sees
# a GPU, else "cpu".
#
# Exit codes: compare's (0 clean, 1 regression under --fail-on); 2 no baseline yet, bad
# arguments, or files from different devices; a run that ends with 2, 3 or 5 (bad row file,
# runtime error, deadline) exits with its own code and is not compared. Failing entries that also
# fail in the baseline are not regressions: only changes count.
# A subset run (arguments after --, e.g. --row A1 --package det) compares only what it selected:
# the baseline is cut to the entries of the (row, package, saved set) triples the run has, every
# schedule of them kept (so a schedule the run lost is still missing); the cut baseline is written
# next to the run as <set>-<date>.baseline.json. Without arguments after -- the whole baseline counts.
# --update-baseline with arguments after -- only adopts a first baseline (exit 2 when one exists).
#
# After a whole-set run (no arguments after --) that was compared, the mutation suite runs
# (scripts/mutants.py, docs/mutants.md: every mutant of tests/mutants/mutants.json built in its own
# CPU-only build under /tmp and judged by int1): results/<device>/mutants-<date>.json and .txt, its
# summary line and every mutant not caught at ratio >= 2 appended to the markdown summary. It sets
# the exit code only when FAIL_ON names "mutants" (and compare was clean); --no-mutants skips it.
#
# Options:  --set NAME (row set), --device NAME (results folder and planning class),
#           --results DIR (default: <repo>/results), --update-baseline, --no-mutants, -h/--help
# Environment: KCPBENCH (binary; default <repo>/build/app/kcpbench), LAUNCH (a launcher prefix,
#           e.g. "mpirun -np 8"; default: "mpirun -np 8" for int3 on a node with >= 8 GPUs and
#           mpirun, else ranks as threads of one process), FAIL_ON (default accuracy,time,missing;
#           "mutants" may be added), COMPARE_ARGS (more compare flags, e.g. "--time-threshold 0.05"),
#           MUTANTS_ARGS (more scripts/mutants.py flags, e.g. "--work DIR" or "--reuse-build build"),
#           DATE (default: UTC today).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
kcpbench="${KCPBENCH:-$root/build/app/kcpbench}"
results="$root/results"
set_name="" device="" update=0 mutants=1
run_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --set) set_name="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --results) results="$2"; shift 2 ;;
    --update-baseline) update=1; shift ;;
    --no-mutants) mutants=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; run_args=("$@"); break ;;
    *) echo "nightly: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$kcpbench" ] || { echo "nightly: no kcpbench at $kcpbench (build first: scripts/build.sh, or set KCPBENCH)" >&2; exit 2; }

# GPU or CPU: kcpbench must have CUDA and a GPU must be visible.
gpus=0
if "$kcpbench" --version | grep -q '^CUDA: [0-9]' && command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -c . || true)
fi
if [ -z "$device" ]; then
  if [ "$gpus" -gt 0 ]; then
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
    device=$(echo "$name" | tr '[:upper:]' '[:lower:]' | sed -E 's/^nvidia //; s/[^a-z0-9]+/-/g; s/^-|-$//g')
    device=${device%%-*}   # "h200-nvl" -> "h200"
  else
    device=cpu
  fi
fi
if [ -z "$set_name" ]; then
  if [ "$gpus" -gt 0 ]; then set_name=int3; else set_name=int1; fi
fi
extra=()
if [ "$gpus" -gt 0 ]; then
  extra+=(--backend cuda --bench)
  case "$device" in h100|h200|b200|gb300) extra+=(--device "$device") ;; esac
fi
launch=()
if [ -n "${LAUNCH+x}" ]; then
  read -r -a launch <<<"$LAUNCH"
elif [ "$set_name" = int3 ] && [ "$gpus" -ge 8 ] && command -v mpirun >/dev/null 2>&1; then
  launch=(mpirun -np 8)
fi

date_tag="${DATE:-$(date -u +%Y-%m-%d)}"
dir="$results/$device"
out="$dir/$set_name-$date_tag.json"
md="$dir/$set_name-$date_tag.md"
baseline="$dir/baseline/$set_name.json"
mkdir -p "$dir"
# --update-baseline after a subset run would replace the whole baseline by the subset.
if [ "$update" = 1 ] && [ ${#run_args[@]} -gt 0 ] && [ -f "$baseline" ]; then
  echo "nightly: --update-baseline with arguments after -- would replace $baseline by a subset run; update it from a run without them" >&2
  exit 2
fi

echo "nightly: $set_name on $device -> $out"
set +e
${launch[@]+"${launch[@]}"} "$kcpbench" -q run --rows "$set_name" --json "$out" ${extra[@]+"${extra[@]}"} ${run_args[@]+"${run_args[@]}"}
run_rc=$?
set -e
case $run_rc in
  0|1|4) ;;  # the JSON is complete (1: a budget breach, 4: a det contract broken); compare judges it
  *) echo "nightly: kcpbench run exited $run_rc (no complete results to compare)" >&2; exit "$run_rc" ;;
esac
[ -f "$out" ] || { echo "nightly: kcpbench run wrote no $out" >&2; exit 3; }

if [ ! -f "$baseline" ]; then
  if [ "$update" = 1 ]; then
    mkdir -p "$(dirname "$baseline")"
    cp "$out" "$baseline"
    echo "nightly: no baseline yet; adopted $out as $baseline (commit it)"
    exit 0
  fi
  echo "nightly: no baseline $baseline; look at $out, then adopt it with $0 --update-baseline (or cp it) and commit it" >&2
  exit 2
fi

compare_base="$baseline"
if [ ${#run_args[@]} -gt 0 ]; then
  compare_base="$dir/$set_name-$date_tag.baseline.json"
  python3 - "$baseline" "$out" "$compare_base" <<'PY' || { echo "nightly: cannot cut $baseline to the selected rows" >&2; exit 3; }
import json, sys
base, run = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
key = lambda e: (e.get("row"), (e.get("form") or {}).get("package"), (e.get("form") or {}).get("saved"))
selected = {key(e) for e in run["entries"]}
kept = [e for e in base["entries"] if key(e) in selected]
print("nightly: subset run: comparing %d of %d baseline entries (the rows, packages and saved sets it ran)"
      % (len(kept), len(base["entries"])))
base["entries"] = kept
json.dump(base, open(sys.argv[3], "w"), indent=1)
PY
fi

# FAIL_ON's "mutants" is ours; the rest goes to compare ("none" when nothing is left).
fail_on="${FAIL_ON:-accuracy,time,missing}" gate_mutants=0
case ",$fail_on," in *,mutants,*) gate_mutants=1 ;; esac
fail_on=$(echo ",$fail_on," | sed 's/,mutants,/,/g; s/^,//; s/,$//')
set +e
# shellcheck disable=SC2086  # COMPARE_ARGS is a list of flags
"$kcpbench" compare "$compare_base" "$out" --fail-on "${fail_on:-none}" --md "$md" ${COMPARE_ARGS:-}
rc=$?
set -e
echo "nightly: summary in $md; compare exited $rc"

# The mutation suite (whole-set runs only): does int1 still catch every single-line bug?
if [ "$mutants" = 1 ] && [ ${#run_args[@]} -eq 0 ]; then
  mjson="$dir/mutants-$date_tag.json" mtxt="$dir/mutants-$date_tag.txt"
  echo "nightly: mutation suite -> $mtxt"
  set +e
  # shellcheck disable=SC2086  # MUTANTS_ARGS is a list of flags
  python3 "$root/scripts/mutants.py" --json "$mjson" ${MUTANTS_ARGS:-} 2>&1 | tee "$mtxt"
  mrc=${PIPESTATUS[0]}
  set -e
  {
    echo
    echo "### Mutation suite (scripts/mutants.py, exit $mrc)"
    echo
    grep -E '^mutants: (caught|error)|^mutants: the unmutated' "$mtxt" || echo "no summary line: see $mtxt"
    if grep -qE ' (MISSED|BUILD-FAILED|CRASHED)|WEAK' "$mtxt"; then
      echo
      echo '```'
      grep -E ' (MISSED|BUILD-FAILED|CRASHED)|WEAK' "$mtxt"
      echo '```'
    fi
  } >>"$md"
  echo "nightly: mutation suite exited $mrc"
  if [ "$gate_mutants" = 1 ] && [ "$rc" = 0 ] && [ "$mrc" != 0 ]; then rc=$mrc; fi
fi
if [ "$update" = 1 ]; then
  cp "$out" "$baseline"
  echo "nightly: $baseline replaced by this run (commit it)"
  exit 0
fi
exit "$rc"

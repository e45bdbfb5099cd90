#!/usr/bin/env bash
# CTest driver for scripts/nightly.sh on the CPU twin (one int1 row, det/full): no baseline -> 2;
# --update-baseline adopts the run; the same run again compares clean (0) and writes the JSON and
# the markdown summary; a baseline entry the run lacks is a regression (1) unless --fail-on
# leaves "missing" out; a subset run compares only the baseline entries of what it selected.
# usage: nightly_test.sh NIGHTLY_SH KCPBENCH WORKDIR
set -uo pipefail
nightly="$1"; export KCPBENCH="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
export DATE=test LAUNCH=""
args=(--set int1 --device cpu --results "$work" -- --row A1 --package det --saved full --cache none)
fail() { echo "FAIL: $*"; exit 1; }

out=$(bash "$nightly" "${args[@]}" 2>&1); rc=$?
echo "$out"
[ $rc -eq 2 ] || fail "no baseline: expected exit 2, got $rc"
echo "$out" | grep -q "no baseline" || fail "no baseline: the message does not say so"

bash "$nightly" --update-baseline "${args[@]}" || fail "--update-baseline exited $?"
[ -f "$work/cpu/baseline/int1.json" ] || fail "no baseline written"

bash "$nightly" "${args[@]}"; rc=$?
[ $rc -eq 0 ] || fail "same run vs its baseline: expected 0, got $rc"
[ -f "$work/cpu/int1-test.json" ] || fail "no results/cpu/int1-test.json"
grep -q "no regressions" "$work/cpu/int1-test.md" || fail "markdown summary lacks 'no regressions'"

# A subset run compares only what it selected: baseline entries of another row (B1) and of a
# package the run left out (A1 nondet) are not missing (they used to be counted as regressions).
cp "$work/cpu/baseline/int1.json" "$work/baseline-A1-det-full.json"
python3 - "$work/cpu/baseline/int1.json" <<'PY'
import json, sys
p = sys.argv[1]
d = json.load(open(p))
e = d["entries"][0]
b1 = json.loads(json.dumps(e)); b1["id"] = b1["id"].replace("A1/", "B1/", 1); b1["row"] = "B1"
nd = json.loads(json.dumps(e)); nd["id"] = nd["id"].replace("/det/", "/nondet/"); nd["form"]["package"] = "nondet"
d["entries"] += [b1, nd]
json.dump(d, open(p, "w"))
PY
out=$(bash "$nightly" "${args[@]}" 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "subset run (A1 det/full) against a baseline with B1 and A1 nondet: expected 0, got $rc"
echo "$out" | grep -q "comparing 1 of 3 baseline entries" || fail "subset run: no line saying what is compared"
# The reported case: the committed int1 baseline (all its entries), --row A1 alone (its 4 forms).
cp "$(dirname "$nightly")/../results/cpu/baseline/int1.json" "$work/cpu/baseline/int1.json"
out=$(FAIL_ON=accuracy,missing bash "$nightly" --set int1 --device cpu --results "$work" -- --row A1 --cache none 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "--row A1 against the committed int1 baseline: expected 0, got $rc"
n_base=$(python3 -c "import json, sys; print(len(json.load(open(sys.argv[1]))['entries']))" "$work/cpu/baseline/int1.json")
echo "$out" | grep -q "comparing 4 of $n_base baseline entries" || fail "--row A1: not 4 of $n_base entries compared"
# --update-baseline after a subset run would replace the whole baseline by 4 entries: refused.
out=$(bash "$nightly" --update-baseline --set int1 --device cpu --results "$work" -- --row A1 2>&1); rc=$?
echo "$out"
[ $rc -eq 2 ] || fail "--update-baseline with a subset over an existing baseline: expected 2, got $rc"
echo "$out" | grep -q "would replace .*baseline/int1.json by a subset run" || fail "--update-baseline subset: message"
cmp -s "$work/cpu/baseline/int1.json" "$(dirname "$nightly")/../results/cpu/baseline/int1.json" \
  || fail "--update-baseline subset: the baseline was changed"
cp "$work/baseline-A1-det-full.json" "$work/cpu/baseline/int1.json"

# A baseline entry that the new run does not have: missing -> regression under the default policy.
python3 - "$work/cpu/baseline/int1.json" <<'PY'
import json, sys
p = sys.argv[1]
d = json.load(open(p))
e = json.loads(json.dumps(d["entries"][0]))
e["id"] = e["id"].replace("planned", "P=3"); e["form"]["P"] = 3
d["entries"].append(e)
json.dump(d, open(p, "w"))
PY
bash "$nightly" "${args[@]}"; rc=$?
[ $rc -eq 1 ] || fail "missing entry: expected 1, got $rc"
grep -q "A1/det/full/P=3" "$work/cpu/int1-test.md" || fail "markdown summary does not name the missing entry"
FAIL_ON=accuracy,time bash "$nightly" "${args[@]}"; rc=$?
[ $rc -eq 0 ] || fail "missing entry with --fail-on accuracy,time: expected 0, got $rc"
echo PASS

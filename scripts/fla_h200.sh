#!/usr/bin/env bash
# Judges FLA's GDN and KDA kernels on an H200 (issue 18 item 3; docs/external.md 9-10): installs the
# carried wheels (.whl/: fla-core, flash-linear-attention; torch and Triton are on the device), then
# runs the row sets through scripts/adapters/fla_adapter.py twice, with and without
# --bypass-hopper-check, and writes one results JSON and one log per (set, mode).
#
#   KCPBENCH=/tmp/b/app/kcpbench OUT=DIR bash scripts/fla_h200.sh [SET ...]
#
# MODES (default "bypass plain"): which of the two runs to make per set.
# SET: a row-set name or row file (default: int1 ext1 tests/gpu/bench_rows.json); OUT defaults
# to h200/external under the repository's results folder. Prints one summary line per run (exit
# code, passed / failed / skipped); exit code 0 unless the adapter could not be imported. Entries
# FLA cannot run fail naming the adapter's exit status and message.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
kcpbench="${KCPBENCH:-$root/build/app/kcpbench}"
out="${OUT:-$root/results/h200/external}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
    exit 2
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -c "import fla, torch, triton; print('fla', getattr(fla, '__version__', '?'), 'torch', torch.__version__, \
'triton', triton.__version__, torch.cuda.get_device_name())" || { echo "fla_h200: cannot import fla/torch/triton" >&2; exit 2; }
sets=("$@")
[ ${#sets[@]} -eq 0 ] && sets=(int1 ext1 tests/gpu/bench_rows.json)
for set in "${sets[@]}"; do
  name="$(basename "$set" .json)"
  for mode in ${MODES:-bypass plain}; do
    flag=""
    [ "$mode" = bypass ] && flag=" --bypass-hopper-check"
    t0=$(date +%s)
    "$kcpbench" -q --configs configs run --rows "$set" --backend "exec:python3 scripts/adapters/fla_adapter.py$flag" \
      --external-dir "/tmp/fla-$name-$mode" --json "$out/fla-$name-$mode.json" >"$out/fla-$name-$mode.log" 2>&1
    rc=$?
    echo "$name $mode: exit $rc, $(( $(date +%s) - t0 )) s: $(tail -1 "$out/fla-$name-$mode.log")"
  done
done

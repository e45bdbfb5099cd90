#!/usr/bin/env bash
# One device call for int3 (or int4: ROWSET=int4) rows on a GPU machine whose host does the
# calibration (issues 14, 16):
# builds kcpbench there (CUDA, no MPI / NCCL; reused when present), then per row: calibrate at
# seed 1 with --write (both twins, on the host's cores) and run it on the GPU at seeds 1:3.
#
#   OUT=DIR bash scripts/int3_device.sh ROW [ROW ...]
#
# Environment: OUT (logs, the updated row file int3.json and int3-ROW.json results; required),
# BUDGET (seconds; stops starting rows after it, default 540), NOCAL=1 (run only), NORUN=ROW (do not
# run that row after calibrating it), SEEDS (default 1:3), REBUILD=1, BUILD (default /tmp/b),
# KCPBENCH (a kcpbench built elsewhere, e.g. carried in .device/bin: no build), CACHE (the FP64
# reference cache folder, default none; a folder lets `run` reuse calibrate's seed-1 reference),
# ROWSET (default int3), RUNARGS (more flags for `run`, e.g. "--reference-spill never --package det"
# to split a long row's forms over calls; the run log keeps the per-form host-time lines and the
# JSON every finished form). Each step gets at most the budget's remaining seconds (`timeout`: rc 124
# when cut, its log kept). Copy $OUT/<ROWSET>.json back over configs/rows/ after the call: the
# machine's copy of the repository is gone with it.
set -uo pipefail
[ -n "${OUT:-}" ] || { echo "int3_device: set OUT" >&2; exit 2; }
[ $# -gt 0 ] || { echo "int3_device: name at least one row" >&2; exit 2; }
start=$(date +%s)
set_=${ROWSET:-int3}
budget=${BUDGET:-540}
left() { local l=$(( budget - $(date +%s) + start )); echo $(( l > 1 ? l : 1 )); }
build=${BUILD:-/tmp/b}
nproc
free -g | sed -n 2p
export CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
if [ -n "${KCPBENCH:-}" ]; then
  :
elif [ ! -x "$build/app/kcpbench" ] || [ -n "${REBUILD:-}" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKCP_ENABLE_NCCL=OFF -DKCP_ENABLE_MPI=OFF -DKCP_REFERENCE_ARCH=native \
    -DKCP_ENABLE_DEVICE_TESTS=OFF >"$OUT/cfg.log" 2>&1 || { tail -20 "$OUT/cfg.log"; exit 1; }
  cmake --build "$build" -j "$(nproc)" --target kcpbench >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
echo "built at +$(( $(date +%s) - start )) s"
k="${KCPBENCH:-$build/app/kcpbench}"
cache="${CACHE:-none}"
for r in "$@"; do
  t0=$(date +%s)
  if [ -z "${NOCAL:-}" ]; then
    timeout "$(left)" "$k" --configs configs calibrate --rows "$set_" --row "$r" --seeds 1 --write --cache "$cache" \
      >"$OUT/cal-$r.log" 2>&1
    rc=$?
    cp "configs/rows/$set_.json" "$OUT/$set_.json"
    echo "$r calibrate rc=$rc $(( $(date +%s) - t0 )) s"
    grep -E "^$r |refus|limit|error" "$OUT/cal-$r.log" | tail -4
  fi
  t1=$(date +%s)
  [ "${NORUN:-}" = "$r" ] && continue
  # shellcheck disable=SC2086  # RUNARGS is a list of flags
  timeout "$(left)" "$k" --configs configs run --rows "$set_" --row "$r" --backend cuda --seeds "${SEEDS:-1:3}" \
    --cache "$cache" --json "$OUT/$set_-$r.json" ${RUNARGS:-} >"$OUT/run-$r.log" 2>&1
  echo "$r run rc=$? $(( $(date +%s) - t1 )) s"
  tail -3 "$OUT/run-$r.log"
  [ $(( $(date +%s) - start )) -gt "$budget" ] && { echo "stopping: budget"; break; }
done
echo "total $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# One device call for int3 rows on a GPU machine whose host does the calibration (issues 14, 16):
# builds kcpbench there (CUDA, no MPI / NCCL; reused when present), then per row: calibrate at
# seed 1 with --write (both twins, on the host's cores) and run it on the GPU at seeds 1:3.
#
#   OUT=DIR bash scripts/int3_device.sh ROW [ROW ...]
#
# Environment: OUT (logs, the updated row file int3.json and int3-ROW.json results; required),
# BUDGET (seconds; stops starting rows after it, default 540), NOCAL=1 (run only), NORUN=ROW (do not
# run that row after calibrating it), SEEDS (default 1:3), REBUILD=1, BUILD (default /tmp/b),
# KCPBENCH (a kcpbench built elsewhere, e.g. carried in .device/bin: no build), CACHE (the FP64
# reference cache folder, default none; a folder lets `run` reuse calibrate's seed-1 reference).
# Copy $OUT/int3.json back over configs/rows/int3.json after the call: the machine's copy of the
# repository is gone with it.
set -uo pipefail
[ -n "${OUT:-}" ] || { echo "int3_device: set OUT" >&2; exit 2; }
[ $# -gt 0 ] || { echo "int3_device: name at least one int3 row" >&2; exit 2; }
start=$(date +%s)
budget=${BUDGET:-540}
build=${BUILD:-/tmp/b}
nproc
free -g | sed -n 2p
export CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
if [ -n "${KCPBENCH:-}" ]; then
  :
elif [ ! -x "$build/app/kcpbench" ] || [ -n "${REBUILD:-}" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKCP_ENABLE_NCCL=OFF -DKCP_ENABLE_MPI=OFF \
    -DKCP_ENABLE_DEVICE_TESTS=OFF >"$OUT/cfg.log" 2>&1 || { tail -20 "$OUT/cfg.log"; exit 1; }
  cmake --build "$build" -j "$(nproc)" --target kcpbench >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
echo "built at +$(( $(date +%s) - start )) s"
k="${KCPBENCH:-$build/app/kcpbench}"
cache="${CACHE:-none}"
for r in "$@"; do
  t0=$(date +%s)
  if [ -z "${NOCAL:-}" ]; then
    "$k" --configs configs calibrate --rows int3 --row "$r" --seeds 1 --write --cache "$cache" >"$OUT/cal-$r.log" 2>&1
    rc=$?
    cp configs/rows/int3.json "$OUT/int3.json"
    echo "$r calibrate rc=$rc $(( $(date +%s) - t0 )) s"
    grep -E "^$r |refus|limit|error" "$OUT/cal-$r.log" | tail -4
  fi
  t1=$(date +%s)
  [ "${NORUN:-}" = "$r" ] && continue
  "$k" -q --configs configs run --rows int3 --row "$r" --backend cuda --seeds "${SEEDS:-1:3}" --cache "$cache" \
    --json "$OUT/int3-$r.json" >"$OUT/run-$r.log" 2>&1
  echo "$r run rc=$? $(( $(date +%s) - t1 )) s"
  tail -3 "$OUT/run-$r.log"
  [ $(( $(date +%s) - start )) -gt "$budget" ] && { echo "stopping: budget"; break; }
done
echo "total $(( $(date +%s) - start )) s"

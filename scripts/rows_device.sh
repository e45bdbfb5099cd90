#!/usr/bin/env bash
# Long rows (int3 / int4) on the device host with a kcpbench built here and carried (see
# docs/perf-notes.md "Long rows"): one row after another, each with the time the call has left, so
# a row cut by the call's limit keeps its finished forms (the JSON is rewritten after every form).
#
#   ROWS="int4:KA9 int3:KE4 int3:A4" LIMIT=580 OUT=$OUT [BIN=.device/main] [SEEDS=1] [TESTS=1] \
#     [RUNARGS="--reference-group 16G"] bash scripts/rows_device.sh
#
# Lanes: a '|' in ROWS splits it into lanes that run side by side (each lane's rows one after
# another), e.g. ROWS="int3:KE4 int3:B4 | int3:A5 int3:KA4": the rows of a lane share the host's
# cores and memory and the one GPU with the other lanes (`kcpbench plan` gives each row's memory;
# the lanes' largest rows must fit together).
#
# BIN holds kcpbench (and kcp_gpu_test with TESTS=1), plain (preferred) or .xz. Each row runs as
#   kcpbench --configs configs run --rows SET --row ROW --backend cuda --seeds SEEDS --cache none
#            --reference-spill never RUNARGS --json $OUT/r/SET-ROW-seedSEEDS.json
# (--reference-spill never: the device host's disk is smaller than int4's slices; a kcpbench of
# 5da9073 or later chooses that by itself with auto)
# With TESTS=1, kcp_gpu_test and int1 at seed 7 run first. Writes $OUT/r/ (JSON, one log per row,
# host.txt, summary.txt) and $OUT/r.tgz (the device returns a few files only: fetch the tarball).
set -uo pipefail
start=$(date +%s)
left() { echo $((${LIMIT:-580} - ($(date +%s) - start))); }
R=$OUT/r k=/tmp/rows-device
mkdir -p "$R" "$k"
for b in kcpbench kcp_gpu_test; do
  src=${BIN:-.device/main}/$b
  rm -f "$k/$b"
  if [ -f "$src" ]; then cp "$src" "$k/$b"; elif [ -f "$src.xz" ]; then xz -dc "$src.xz" >"$k/$b"; else continue; fi
  chmod +x "$k/$b"
done
[ -x "$k/kcpbench" ] || { echo "rows_device: no kcpbench (or kcpbench.xz) in ${BIN:-.device/main}" >&2; exit 2; }
{
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  nproc
  free -g | head -2
  lscpu | grep -i "model name"
  "$k/kcpbench" --version
} >"$R/host.txt" 2>&1
cat "$R/host.txt"
if [ -n "${TESTS:-}" ]; then
  timeout 150 "$k/kcp_gpu_test" >"$R/gpu_test.txt" 2>&1
  echo "kcp_gpu_test rc $? at $(($(date +%s) - start)) s: $(tail -n 1 "$R/gpu_test.txt")" | tee -a "$R/summary.txt"
  timeout 120 "$k/kcpbench" -q --configs configs run --rows int1 --backend cuda --seed 7 --cache none \
    --json "$R/int1-cuda-seed7.json" >"$R/int1.txt" 2>&1
  echo "int1 seed 7 rc $? at $(($(date +%s) - start)) s: $(tail -n 1 "$R/int1.txt")" | tee -a "$R/summary.txt"
fi
run_row() {  # run_row SET:ROW: one row with the time the call has left
  local sr=$1 set_name=${1%%:*} row=${1#*:} name="${1/:/-}-seed${SEEDS:-1}" t0 rc
  if [ "$(left)" -lt 60 ]; then
    echo "$sr not started: $(left) s left" | tee -a "$R/summary.txt"
    return
  fi
  t0=$(date +%s)
  # shellcheck disable=SC2086  # RUNARGS is a list of flags
  timeout $(($(left) - 15)) "$k/kcpbench" --configs configs run --rows "$set_name" --row "$row" --backend cuda \
    --seeds "${SEEDS:-1}" --cache none --reference-spill never ${RUNARGS:-} --json "$R/$name.json" >"$R/$name.log" 2>&1
  rc=$?
  echo "$sr rc $rc in $(($(date +%s) - t0)) s (ended at $(($(date +%s) - start)) s): $(grep -E "passed, .* failed" "$R/$name.log" | tail -n 1)" |
    tee -a "$R/summary.txt"
  grep -E "reference (ready|split)|PASS|FAIL|CONTRACT|error" "$R/$name.log" | tail -n 12
}
IFS='|' read -r -a lanes <<<"${ROWS:?ROWS=\"set:row ...\"}"
for i in "${!lanes[@]}"; do
  # shellcheck disable=SC2086  # a lane is a list of rows
  ( for sr in ${lanes[$i]}; do run_row "$sr"; done ) >"$R/lane-$i.txt" 2>&1 &
done
wait
cat "$R"/lane-*.txt
tar czf "$OUT/r.tgz" -C "$OUT" r

#!/usr/bin/env bash
# int3 KDA rows on the device host: calibrate each row (seed 1, --write) in its own process with
# its own configs copy, in parallel; then run each on the H200 at seed 1 with its new budgets.
# ROWS="KA4 KC8 KD4 KE4" OUT=DIR bash scripts/int3_parallel_device.sh   (NORUN=1: calibrate only)
# Written in session 12, NOT yet run (the device refused every start). With forms by groups of heads
# each KDA row calibrates in ~14-15 GiB (plan --rows int3), so all four fit the device host at once.
# Merge the budgets back: each $OUT/int3-cal-ROW.json holds ROW's new budgets; copy that row's
# "budgets" object into configs/rows/int3.json.
set -uo pipefail
s=$(date +%s)
export CUDACXX=/usr/local/cuda/bin/nvcc
nproc; free -g | sed -n 2p
if [ ! -x /tmp/b/app/kcpbench ]; then
  cmake -S . -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DKCP_ENABLE_NCCL=OFF -DKCP_ENABLE_MPI=OFF -DKCP_ENABLE_DEVICE_TESTS=OFF -DKCP_REFERENCE_ARCH=native >$OUT/cfg.log 2>&1 || { tail $OUT/cfg.log; exit 1; }
  cmake --build /tmp/b -j16 --target kcpbench >$OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
fi
echo "built +$(( $(date +%s)-s )) s"
k=/tmp/b/app/kcpbench
( while sleep 10; do free -m | awk -v t=$(( $(date +%s)-s )) 'NR==2{print t, $3}' >>$OUT/mem.txt; done ) & mon=$!
for r in $ROWS; do
  rm -rf /tmp/cfg-$r; cp -r configs /tmp/cfg-$r
  ( t0=$(date +%s); /usr/bin/time -v $k --configs /tmp/cfg-$r calibrate --rows int3 --row $r --seeds 1 --write --cache none >$OUT/cal-$r.log 2>&1
    echo "$r calibrate rc=$? $(( $(date +%s)-t0 )) s" >>$OUT/summary.txt
    cp /tmp/cfg-$r/rows/int3.json $OUT/int3-cal-$r.json ) &
done
wait $(jobs -p | grep -v $mon) 2>/dev/null; while [ $(jobs -rp | wc -l) -gt 1 ]; do sleep 2; done
cat $OUT/summary.txt; echo "calibrated +$(( $(date +%s)-s )) s"
if [ -z "${NORUN:-}" ]; then
  for r in $ROWS; do
    ( t0=$(date +%s); $k -q --configs /tmp/cfg-$r run --rows int3 --row $r --backend cuda --seed 1 --cache none --json $OUT/int3-$r-seed1.json >$OUT/run-$r.log 2>&1
      echo "$r run rc=$? $(( $(date +%s)-t0 )) s: $(tail -1 $OUT/run-$r.log)" >>$OUT/summary2.txt ) &
  done
  while [ $(jobs -rp | wc -l) -gt 1 ]; do sleep 2; done
  cat $OUT/summary2.txt
fi
kill $mon; sort -k2 -n $OUT/mem.txt | tail -1 | awk '{print "host peak used MiB", $2}'
for r in $ROWS; do grep -E 'Maximum resident|Elapsed' $OUT/cal-$r.log | sed "s/^/$r /"; done
echo "total +$(( $(date +%s)-s )) s"

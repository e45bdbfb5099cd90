#!/usr/bin/env bash
# (kept in wip/ because .device/ may not survive into the next session: rebuild the pack first with
#  PACK=1 bash scripts/build_candidates.sh wip/gfq.patch wip/mc.patch wip/orel.patch both=wip/gfq.patch+wip/mc.patch+wip/orel.patch
#  then add base/ (main 486e418) to it; run with carry [".device/s30/pack.tar.xz"]: OUT=$OUT TOTAL=420 bash wip/call-s30.sh)
# session 30: base (main 486e418, the backward recomputes W, U) and main 2a2ca8d (the full saved set keeps them) vs gfq (wip/gfq.patch: B4 finalizes dq on chip), mc (wip/mc.patch:
# the walks' column-tile pairs as clusters with TMA multicast of W, k, q) orel (wip/orel.patch: the output warpgroup releases the stage before o) and both (gfq + mc + orel).
# Benches (GDN T = 8192, 32768; KDA T = 32768), then kcp_gpu_test and int1 (seed 14) of `both`, then
# int3's GDN rows at seed 1 in three lanes with the first build of "both gfq mc orel" whose OUTHASH lines equal
# main's and whose test passed (both's test runs first; a fallback's test runs when both fails), else main.
set -u
start=$(date +%s)
TOTAL=${TOTAL:-420}
D=/tmp/gc-pack R=$OUT/r
el() { echo $(( $(date +%s) - start )); }
mkdir -p $D $R && tar xJf ${PACK:-.device/s30/pack.tar.xz} -C $D && chmod +x $D/*/*
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
shape() { case "$1" in kda) echo "32 32 128 0 20 0 1 1" ;; *) echo "16 32 128 0 20 0 1 0" ;; esac; }
for ot in "gdn 8192" "gdn 32768" "kda 32768"; do set -- $ot; for b in base main gfq mc orel both; do
  echo "== $b $1 T=$2"; timeout 100 $D/$b/kcp_gpu_bench $2 $(shape $1) > $R/b.txt 2>&1 || echo "rc $?"
  cat $R/b.txt; grep OUTHASH $R/b.txt | sed "s/^/$1 /" >> $R/hash-$b.txt
done; done > $R/bench.txt 2>&1
echo "benches +$(el) s" | tee -a $R/status.txt
for P in 1 4 8; do echo "== main gdn T=32768 P=$P"; timeout 60 $D/main/kcp_gpu_bench 32768 16 32 128 $P 10 0 1 0 2>&1 | grep -v OUTHASH; done > $R/psweep.txt 2>&1
echo "P sweep +$(el) s" | tee -a $R/status.txt
if [ "${NCU:-0}" = 1 ]; then  # speed of light and stall reasons of the first 30 launches of mc's GDN bench
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout 120 $ncu --clock-control none --launch-count 30 --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section SpeedOfLight $D/mc/kcp_gpu_bench 32768 16 32 128 0 1 0 1 0 > $R/ncu.txt 2>&1
  echo "ncu rc $? +$(el) s" | tee -a $R/status.txt
fi
grep -E "^==|RESULT" $R/bench.txt
( timeout 200 $D/both/kcpbench -q --configs configs run --rows int1 --backend cuda --seed 14 --cache none \
    --json $R/int1-cuda-seed14-both.json > $R/int1-both.txt 2>&1; echo "int1 both rc $? +$(el) s" >> $R/status.txt ) &
use=main
for b in both gfq mc orel; do
  diff $R/hash-main.txt $R/hash-$b.txt > /dev/null || { echo "$b: OUTHASH differs from main" | tee -a $R/status.txt; continue; }
  timeout 150 $D/$b/kcp_gpu_test > $R/gpu_test-$b.txt 2>&1; rc=$?
  echo "kcp_gpu_test $b rc $rc +$(el) s: $(tail -n 1 $R/gpu_test-$b.txt)" | tee -a $R/status.txt
  [ $rc = 0 ] && { use=$b; break; }
done
echo "rows with $use +$(el) s" | tee -a $R/status.txt
left=$(( TOTAL - $(el) ))
ROWS="int3:A5 int3:D5 int3:F4 | int3:C8 int3:B4 | int3:A4 int3:D4 int3:E4" LIMIT=$left OUT=$OUT/rows BIN=$D/$use bash scripts/rows_device.sh > $R/rows.txt 2>&1
wait
cp $OUT/rows/r/*.json $OUT/rows/r/*.log $OUT/rows/r/summary.txt $OUT/rows/r/host.txt $R/ 2>/dev/null
tar czf $OUT/r.tgz -C $OUT r; rm -rf $OUT/rows
cat $R/status.txt $R/summary.txt; tail -n 1 $R/int1-both.txt
grep -E "^==|RESULT|OUTHASH|rc " $R/bench.txt | head -80
grep -E "^==|RESULT" $R/psweep.txt

#!/usr/bin/env bash
# Calibrates rows on the device host (16 cores, 128 GB) in the background, across device calls: a
# calibration that needs more than one call's 600 s (int4 KA9: ~94 GiB of host memory with its
# FP64 reference slices kept in memory, > 600 s) runs in its own process session, which lives on
# while the machine is held, i.e. while the next call starts within the machine's idle window.
# It runs the carried kcpbench (not a build on the device) on a copy of configs/, one row after
# another, pinned to CORES so that the GPU work of the same calls keeps the other cores.
#
#   start:   ROWSET=int4 ROWS="KA9" BIN=.device/main [CORES=2-15] [ARGS="--reference-spill never"] \
#              bash scripts/calibrate_device.sh start
#   collect: OUT=DIR [WAIT=540] bash scripts/calibrate_device.sh collect
#
# collect waits up to WAIT seconds for every row to finish, then copies the row file (with the
# new budgets where a row finished), each row's log (its `/usr/bin/time -v` lines give peak
# memory and time) and the memory trace into $OUT/cal.tgz; it prints each row's exit status or
# "running". Merge a finished row's "budgets" object into configs/rows/<ROWSET>.json here.
set -uo pipefail
dir=/var/tmp/kcpcal
case "${1:-}" in
  start)
    rm -rf "$dir" && mkdir -p "$dir" || exit 1
    cp -r configs "$dir/configs"
    echo "$ROWS" > "$dir/rows"
    if [ -f "$BIN/kcpbench.xz" ]; then xz -dc "$BIN/kcpbench.xz" > "$dir/kcpbench"; else cp "$BIN/kcpbench" "$dir/"; fi
    chmod +x "$dir/kcpbench"
    cat > "$dir/job.sh" <<EOF
cd "$dir"
( while sleep 10; do free -m | awk -v t=\$(date +%s) 'NR==2{print t, \$3, \$7}' >> mem.txt; done ) &
mon=\$!
tm="/usr/bin/time -v"; [ -x /usr/bin/time ] || tm=""
for r in $ROWS; do
  t0=\$(date +%s)
  nice taskset -c ${CORES:-2-15} \$tm ./kcpbench --configs configs calibrate --rows $ROWSET --row \$r \\
    --seeds 1 --write --cache none ${ARGS:-} > cal-\$r.log 2>&1
  echo "\$r rc \$? \$(( \$(date +%s) - t0 )) s" > done-\$r
done
kill \$mon
EOF
    setsid nohup bash "$dir/job.sh" > "$dir/job.log" 2>&1 < /dev/null &
    echo "calibrate_device: started $ROWSET rows $ROWS in $dir"
    ;;
  collect)
    rows=$(cat "$dir/rows") || exit 1
    end=$(( $(date +%s) + ${WAIT:-540} ))
    while [ "$(date +%s)" -lt "$end" ]; do
      left=0
      for r in $rows; do [ -f "$dir/done-$r" ] || left=1; done
      [ $left = 0 ] && break
      sleep 5
    done
    for r in $rows; do
      if [ -f "$dir/done-$r" ]; then cat "$dir/done-$r"; else echo "$r running: $(tail -c 300 "$dir/cal-$r.log" | tr '\r' '\n' | tail -n 2)"; fi
      grep -E 'Maximum resident|Elapsed' "$dir/cal-$r.log" | sed "s/^/$r /"
    done
    sort -k2 -n "$dir/mem.txt" 2>/dev/null | tail -n 1 | awk '{print "host used peak MiB", $2, "available then", $3}'
    tar czf "$OUT/cal.tgz" -C "$dir" configs/rows $(cd "$dir" && ls ./*.log mem.txt done-* 2>/dev/null)
    ;;
  *) echo "usage: calibrate_device.sh start|collect (see its header)" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# One device call that decides a kernel candidate (docs/perf-notes.md, how each session measures):
# kcp_gpu_bench of every build in BUILDS side by side on a quiet GPU (KDA and GDN at the issue 16 /
# 17 shapes; the OUTHASH lines of two builds that must give the same bits must match), optionally
# an ncu per-kernel split, then the GPU tests and int1 on CUDA of the builds in TEST (default: the
# last build; their int1 runs at once, their kcp_gpu_test one after another), then FLA's
# scripts/fla_bench.py on the same shapes (wheels in .whl/) with the time left. Writes everything
# under $OUT/r and packs it as $OUT/r.tgz (the device tool returns few files).
#
#   OUT=DIR BUILDS="main=DIR1 cand=DIR2" [TS="8192 32768"] [OPS="kda gdn" (also kda64, gdn64: K = V = 64)]
#     [NCU=cand] [SEED=5] [TEST="cand"] (FLA times the K = V = 128 ops only)
#     [FLA=1] [LIMIT=560] [PACK=.device/pack.tar.xz] bash scripts/gpu_compare.sh
#
# A build DIR holds kcp_gpu_bench (and, for a build in TEST, kcp_gpu_test and kcpbench), plain or .xz-compressed (built
# elsewhere with static cudart: strip -o, xz). NCU names a build to profile (one iteration). LIMIT:
# seconds after which the tests and FLA are cut (rc 124) and the results are packed (a device call
# allows 600). PACK: a solid tarball of build folders (build_candidates.sh PACK=1), unpacked into
# /tmp/gc-pack first; its BUILDS line names the folders there.
set -u
start=$(date +%s)
R=$OUT/r
mkdir -p "$R"
left() { echo $(( ${LIMIT:-560} - $(date +%s) + start )); }
log() { echo "$* +$(( $(date +%s) - start )) s" | tee -a "$R/status.txt"; }
if [ -n "${PACK:-}" ]; then
  mkdir -p /tmp/gc-pack && tar xJf "$PACK" -C /tmp/gc-pack || { echo "gpu_compare: cannot unpack $PACK" >&2; exit 2; }
fi
declare -A bin
for e in $BUILDS; do
  name=${e%%=*} dir=${e#*=}
  mkdir -p "/tmp/gc-$name"
  for f in "$dir"/*; do
    b=$(basename "$f" .xz)
    if [ "$f" != "${f%.xz}" ]; then xz -dc "$f" > "/tmp/gc-$name/$b"; else cp "$f" "/tmp/gc-$name/$b"; fi
    chmod +x "/tmp/gc-$name/$b"
  done
  bin[$name]=/tmp/gc-$name
  last=$name
done
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$R/gpu.txt"
# kcp_gpu_bench's arguments after T: the issues' shapes (kda, gdn: K = V = 128); kda64, gdn64 the
# same at K = V = 64.
shape() {
  case "$1" in
    kda) echo "32 32 128 0 20 0 1 1" ;;
    kda64) echo "32 32 64 0 20 0 1 1" ;;
    gdn64) echo "16 32 64 0 20 0 1 0" ;;
    *) echo "16 32 128 0 20 0 1 0" ;;
  esac
}
for op in ${OPS:-kda gdn}; do for T in ${TS:-8192 32768}; do for e in $BUILDS; do
  name=${e%%=*}
  echo "== $name $op T=$T"
  # A candidate that hangs (a barrier's phase wrong) must not take the call's time.
  timeout 120 "${bin[$name]}/kcp_gpu_bench" "$T" $(shape "$op") || echo "kcp_gpu_bench rc $? ($name $op T=$T)"
done; done; done > "$R/bench.txt" 2>&1
log benches
if [ -n "${NCU:-}" ]; then
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for op in ${OPS:-kda gdn}; do
    a=$(shape "$op" | sed 's/ 20 / 1 /')
    "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv "${bin[$NCU]}/kcp_gpu_bench" 32768 $a \
      > "$R/ncu-$op.csv" 2> "$R/ncu-$op.err"
    python3 scripts/ncu_sum.py "$R/ncu-$op.csv" 4 > "$R/ncu-$op.txt" 2>&1
    gzip -f "$R/ncu-$op.csv"
  done
  log ncu
fi
tests=${TEST:-$last}
( for t in $tests; do
    timeout "$(left)" "${bin[$t]}/kcp_gpu_test" > "$R/gpu_test-$t.txt" 2>&1; log "kcp_gpu_test ($t) rc $?"
  done ) &
for t in $tests; do
  ( timeout "$(left)" "${bin[$t]}/kcpbench" -q --configs configs run --rows int1 --backend cuda --seed "${SEED:-5}" --cache none \
      --json "$R/int1-cuda-seed${SEED:-5}-$t.json" > "$R/int1-$t.txt" 2>&1; log "int1 seed ${SEED:-5} ($t) rc $?" ) &
done
wait
if [ "${FLA:-1}" = 1 ] && [ "$(left)" -gt 60 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    PYTHONPATH=/tmp/site timeout "$(left)" python3 scripts/fla_bench.py --out "$R/fla-bench.json" --T ${TS:-8192 32768} \
      --ops $(for op in ${OPS:-kda gdn}; do case $op in kda | gdn) echo "$op" ;; esac; done) > "$R/fla-bench.txt" 2>&1
  log "fla_bench rc $?"
fi
tar czf "$OUT/r.tgz" -C "$OUT" r
for t in $tests; do tail -n 1 "$R/gpu_test-$t.txt" "$R/int1-$t.txt"; done
grep -E "^==|RESULT|OUTHASH" "$R/bench.txt"
tail -n 6 "$R/fla-bench.txt" 2>/dev/null

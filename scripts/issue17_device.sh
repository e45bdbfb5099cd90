#!/usr/bin/env bash
# Issue 17's timing acceptance in one device call (run it on the H200 the issue names; the GPU's
# name is the first line of every file): with one carried build,
#   1. kcp_gpu_bench, GDN at the issue's shape (B = 1, H = 16, HV = 32, K = V = 128, bf16, L2 norm,
#      W = 1, planned P), T = 8192 and 32768: per phase, RESULT and OUTHASH lines;
#   2. `kcpbench run --rows tests/gpu/bench_rows.json` (T1 = 8192, T2 = 32768 tokens) in all four
#      forms, det / nondet x full / light, with --bench (3 warm-ups, median of 20, phase times):
#      the issue's "det within 10% of nondet, light within 10% of full", every form judged against
#      FP64 and det's bitwise checks run;
#   3. FLA 0.6.0's GDN on the same shapes in the same call (scripts/fla_bench.py; wheels in .whl/).
# Then prints the acceptance table (bench_table below). Writes $OUT/r/ and $OUT/r.tgz.
#
#   OUT=DIR BIN=DIR [LIMIT=560] bash scripts/issue17_device.sh
#
# BIN holds kcp_gpu_bench and kcpbench (plain or .xz; a PACK folder of build_candidates.sh PACK=1
# after unpacking, e.g. /tmp/gc-pack/main). kcpbench should be built with
# -DKCP_REFERENCE_ARCH=x86-64-v3 (the FP64 reference of T2 on AVX2, docs/perf-notes.md).
set -u
start=$(date +%s)
left() { echo $((${LIMIT:-560} - $(date +%s) + start)); }
R=$OUT/r k=/tmp/issue17-bin
mkdir -p "$R" "$k"
for b in kcp_gpu_bench kcpbench; do
  src=${BIN:?BIN=folder of kcp_gpu_bench and kcpbench}/$b
  if [ -f "$src" ]; then cp "$src" "$k/$b"; elif [ -f "$src.xz" ]; then xz -dc "$src.xz" >"$k/$b"; else
    echo "issue17_device: no $b in $BIN" >&2
    exit 2
  fi
  chmod +x "$k/$b"
done
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$R/gpu.txt"
"$k/kcpbench" --version | head -n 1 | tee -a "$R/gpu.txt"
for T in 8192 32768; do
  echo "== gdn T=$T"
  timeout 120 "$k/kcp_gpu_bench" "$T" 16 32 128 0 20 0 1 0 || echo "kcp_gpu_bench rc $?"
done >"$R/kcp_gpu_bench.txt" 2>&1
echo "kcp_gpu_bench +$(($(date +%s) - start)) s"
timeout "$(($(left) - 120))" "$k/kcpbench" --configs configs run --rows tests/gpu/bench_rows.json --backend cuda \
  --package det,nondet --saved full,light --bench --cache none --json "$R/bench-forms.json" >"$R/bench-forms.txt" 2>&1
echo "kcpbench bench forms rc $? +$(($(date +%s) - start)) s: $(grep -E "passed, .* failed" "$R/bench-forms.txt" | tail -n 1)"
if [ "$(left)" -gt 60 ] && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    PYTHONPATH=/tmp/site timeout "$(left)" python3 scripts/fla_bench.py --out "$R/fla-bench.json" --T 8192 32768 \
      --ops gdn >"$R/fla-bench.txt" 2>&1
  echo "fla_bench rc $? +$(($(date +%s) - start)) s"
fi
tar czf "$OUT/r.tgz" -C "$OUT" r
grep -E "^==|RESULT" "$R/kcp_gpu_bench.txt"
python3 - "$R/bench-forms.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:  # the run was cut before it wrote its JSON
    sys.exit(f"no bench JSON: {e}")
print(f"{'row':4} {'form':14} {'fwd+bwd ms (median)':>20} {'status':>8}")
for e in d["entries"]:
    t = e.get("timings_ms", {})
    ms = t.get("forward", {}).get("median", float("nan")) + t.get("backward", {}).get("median", float("nan"))
    f = e.get("form", {})
    form = f"{f.get('package', '?')}/{f.get('saved', '?')}"
    print(f"{e.get('row', '?'):4} {form:14} {ms:20.3f} {e.get('status', '?'):>8}")
PY
tail -n 4 "$R/fla-bench.txt" 2>/dev/null

#!/usr/bin/env bash
# One device call (issue 18 item 3): FLA judged on int1 and ext1 (docs/external.md 10, on one machine): build kcpbench,
# write every entry's folder (exec:true), run fla_adapter.py on all folders in parallel (with and
# without --bypass-hopper-check), then judge through copy_outputs.py. JSON + logs to $OUT.
# Usage (repository root on the GPU machine, wheels in .whl/): OUT=DIR [SETS="int1 ext1 int1:K*"] [MODES="bypass plain"]
#   [SEEDS=1:8] [PAR=14] [ALIM=300] [KCPBENCH=a kcpbench built elsewhere: no build] bash scripts/fla_judge_parallel.sh
# MODES: bypass (--bypass-hopper-check), plain (no flag: FLA's Hopper refusal stands), safe
# (--bypass-hopper-check --safe-gate: KDA lower_bound rows with safe_gate=True). SEEDS: kcpbench's
# --seeds for every set (default: each row's own seed).
set -uo pipefail
start=$(date +%s)
export CUDACXX=/usr/local/cuda/bin/nvcc TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site
mkdir -p $OUT/logs
if [ -z "${KCPBENCH:-}" ]; then
  cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DKCP_ENABLE_NCCL=OFF -DKCP_ENABLE_MPI=OFF -DKCP_REFERENCE_ARCH=native \
    -DKCP_ENABLE_DEVICE_TESTS=OFF >$OUT/logs/cfg.log 2>&1 || { tail -20 $OUT/logs/cfg.log; exit 1; }
  cmake --build build-dev -j16 --target kcpbench >$OUT/logs/build.log 2>&1 || { tail -30 $OUT/logs/build.log; exit 1; }
fi
echo "built at +$(( $(date +%s) - start )) s"
k=${KCPBENCH:-build-dev/app/kcpbench}
# A SETS entry is a set name or row file, optionally with rows: SET:ROW,ROW (names or globs, e.g.
# int1:K* for int1's KDA rows). entry sets s (the set), rows (--row arguments) and t (a file tag).
entry() {
  s=${1%%:*}; rows=""; t=$(basename "$s" .json)
  [ "$s" = "$1" ] && return
  for r in $(echo "${1#*:}" | tr , ' '); do rows="$rows --row $r"; done
  t="$t-$(echo "${1#*:}" | tr -c 'A-Za-z0-9\n' _)"
}
seeds=""; [ -n "${SEEDS:-}" ] && seeds="--seeds $SEEDS"
mode_flags() { case $1 in bypass) echo --bypass-hopper-check ;; safe) echo --bypass-hopper-check --safe-gate ;; plain) ;;
  *) echo "fla_judge_parallel: unknown mode '$1' (bypass, plain, safe)" >&2; exit 2 ;; esac; }
for mode in ${MODES:-bypass plain}; do mode_flags $mode >/dev/null || exit 2; done
set -f   # row globs ('K*') reach kcpbench unexpanded (set +f again for the folder globs)
for e in ${SETS:-int1 ext1}; do
  entry "$e"
  $k -q --configs configs run --rows $s $rows $seeds --backend exec:true --external-dir /tmp/src-$t-gen --cache none >$OUT/logs/gen-$t.log 2>&1
  for mode in ${MODES:-bypass plain}; do cp -r /tmp/src-$t-gen /tmp/src-$t-$mode; done
done
set +f
echo "folders at +$(( $(date +%s) - start )) s"
for mode in ${MODES:-bypass plain}; do
  flag=$(mode_flags $mode)
  # one worker per compile group (group_folders.py): a group's folders run one after another, so
  # only its first adapter compiles and autotunes FLA's kernels (the Triton cache is shared)
  python3 scripts/adapters/group_folders.py /tmp/src-*-$mode/*/ | xargs -P ${PAR:-14} -L 1 sh -c \
    "for d; do echo \"python3 scripts/adapters/fla_adapter.py $flag \$d\" >\${d}adapter.cmd; timeout ${ALIM:-300} python3 scripts/adapters/fla_adapter.py $flag \$d >\${d}adapter.log 2>&1; echo \$? >\${d}adapter.status; echo \"\$(cat \${d}adapter.status) \$d\"; done" _ >$OUT/logs/adapter-$mode.txt
  echo "$mode adapters at +$(( $(date +%s) - start )) s: $(awk '$1!=0' $OUT/logs/adapter-$mode.txt | wc -l) nonzero of $(wc -l <$OUT/logs/adapter-$mode.txt)"
done
set -f
for e in ${SETS:-int1 ext1}; do for mode in ${MODES:-bypass plain}; do  # the judges run at once
  entry "$e"
  ( $k -q --configs configs run --rows $s $rows $seeds --backend "exec:python3 scripts/adapters/copy_outputs.py /tmp/src-$t-$mode" --cache none \
      --external-dir /tmp/judge-$t-$mode --json $OUT/fla-$t-$mode.json >$OUT/logs/judge-$t-$mode.log 2>&1
    echo "$t $mode: exit $? $(tail -1 $OUT/logs/judge-$t-$mode.log)" ) &
done; done
set +f
wait
for m in ${MODES:-bypass plain}; do for d in /tmp/src-*-$m/*/; do n=$(basename $(dirname $d))/$(basename $d); mkdir -p $OUT/logs/al/$n; cp $d/adapter.log $OUT/logs/al/$n/ 2>/dev/null; done; done
echo "total $(( $(date +%s) - start )) s"
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs

#!/usr/bin/env bash
# Builds one set of device binaries per candidate patch (wip/*.patch or any patch against HEAD),
# for scripts/gpu_compare.sh: main's own build first, then for each patch: apply it to the work
# tree, rebuild incrementally in the same build folder, keep stripped and xz-compressed copies of
# kcp_gpu_bench, kcp_gpu_test and kcpbench, and take the patch back out. The work tree must be
# clean (tracked files); the build folder must be configured (scripts/build.sh).
#
#   [BUILD_DIR=build] [DEST=.device] [BENCH_ONLY="binter kintra"] bash scripts/build_candidates.sh \
#     wip/<a>.patch wip/<b>.patch all=wip/<a>.patch+wip/<b>.patch
#
# An argument NAME=P1+P2+... builds the patches applied together (in that order) as NAME. A name
# in BENCH_ONLY keeps only kcp_gpu_bench (the carry to the device is 64 MiB; a candidate whose
# tests run in a combined build needs only its bench). Gives DEST/main/ and DEST/<name>/; prints
# the BUILDS line for gpu_compare.sh. A patch that does not apply or build stops the script with
# its name (the tree is left with the patches out).
#
# PACK=1: the binaries stay plain in DEST/<name>/ and all of them go into DEST/pack.tar.xz, one
# solid xz stream: the builds share most of their code, so three builds' nine binaries take ~6 MB
# there against ~38 MB as one .xz each (session 28), well under the device's 64 MiB carry. Carry
# DEST/pack.tar.xz only; gpu_compare.sh PACK=DEST/pack.tar.xz unpacks it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}" dest="${DEST:-.device}"
bins=(tests/gpu/kcp_gpu_bench tests/gpu/kcp_gpu_test app/kcpbench)
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "build_candidates: the work tree has changes" >&2; exit 2; }
keep() {  # keep NAME: the build folder's binaries, stripped and compressed, in DEST/NAME
  rm -rf "${dest:?}/$1" && mkdir -p "$dest/$1"
  local list=("${bins[@]}")
  [[ " ${BENCH_ONLY:-} " == *" $1 "* ]] && list=(tests/gpu/kcp_gpu_bench)
  for b in "${list[@]}"; do strip -o "$dest/$1/$(basename "$b")" "$build/$b"; done
  [ "${PACK:-0}" = 1 ] || xz -f -T2 "$dest/$1"/*
}
make_all() { nice cmake --build "$build" -j "$(nproc)" --target kcp_gpu_bench kcp_gpu_test kcpbench >"$dest/build-$1.log" 2>&1 ||
  { echo "build_candidates: $1 does not build (see $dest/build-$1.log)" >&2; return 1; }; }
mkdir -p "$dest"
make_all main
keep main
line="main=$dest/main"
for arg in "$@"; do
  if [[ "$arg" == *=* ]]; then name=${arg%%=*} patches=${arg#*=}; else name=$(basename "$arg" .patch) patches=$arg; fi
  IFS=+ read -r -a list <<<"$patches"
  applied=()
  for p in "${list[@]}"; do
    git apply "$p" || { echo "build_candidates: $p does not apply to HEAD${applied:+ + ${applied[*]}}" >&2; break; }
    applied+=("$p")
  done
  ok=0
  [ ${#applied[@]} = ${#list[@]} ] && ok=1
  [ $ok = 1 ] && { make_all "$name" || ok=0; }
  [ $ok = 1 ] && keep "$name"
  for ((i = ${#applied[@]} - 1; i >= 0; i--)); do git apply -R "${applied[$i]}"; done
  [ $ok = 1 ] || exit 1
  line="$line $name=$dest/$name"
  echo "build_candidates: $name built"
done
make_all main  # the build folder back to HEAD
if [ "${PACK:-0}" = 1 ]; then
  names=()
  for e in $line; do names+=("$(basename "${e#*=}")"); done
  tar cf - -C "$dest" "${names[@]}" | xz -9e -T2 --lzma2=dict=256MiB >"$dest/pack.tar.xz"
  echo "build_candidates: $dest/pack.tar.xz ($(du -h "$dest/pack.tar.xz" | cut -f1)); carry it, and pass PACK=$dest/pack.tar.xz"
  line=$(for e in $line; do printf '%s=/tmp/gc-pack/%s ' "${e%%=*}" "$(basename "${e#*=}")"; done)
  line=${line% }
fi
echo "BUILDS=\"$line\""

#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, run the int1 row set (on the
# GPU when there is one, else on the CPU twin: --backend auto), and write
# results/local/int1-<date>-<time>.json (extra arguments go to `kcpbench run`).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
kcp="$root/build/app/kcpbench"
exec "$kcp" run --rows int1 --json "$root/results/local/int1-$(date +%Y%m%d-%H%M%S).json" "$@"

#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, run the int1 row set
# (on the GPU when there is one, else on the CPU twin), and write results/int1-<date>.json.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
if "$root/build/app/kcpbench" run --help >/dev/null 2>&1; then
  exec "$root/build/app/kcpbench" run --rows int1 --json "$root/results/int1-$(date +%Y%m%d).json"
fi
# Until the engine lands, the main job shows how int1 is planned.
exec "$root/build/app/kcpbench" plan --rows int1

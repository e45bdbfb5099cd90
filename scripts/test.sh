#!/usr/bin/env bash
# Builds kcpbench with every test and runs them all (GPU tests skip without a device).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh" -DBUILD_TESTING=ON
cd "${BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "$(nproc)" --timeout 900

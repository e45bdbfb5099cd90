#!/usr/bin/env bash
# Installs the Debian packages kcpbench builds with, only those that are missing (needs root or sudo).
# CUDA and NCCL are not Debian packages: they come from /usr/local/cuda when present.
set -euo pipefail
pkgs=(cmake g++ make git python3 libeigen3-dev libfmt-dev nlohmann-json3-dev libcli11-dev libopenmpi-dev openmpi-bin libgtest-dev
      python3-matplotlib python3-jsonschema python3-numpy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# Installs the Debian packages pagedattn's build needs; does nothing when they are all present.
set -euo pipefail

pkgs=(cmake g++ make pkg-config libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
      nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev libssl-dev python3 python3-pip curl
      clang libclang-rt-14-dev)  # clang + libFuzzer: the fuzz targets of tests/fuzz

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exec bash "$(dirname "$0")/setup-python.sh"

echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
bash "$(dirname "$0")/setup-python.sh"

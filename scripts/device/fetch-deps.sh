#!/usr/bin/env bash
# Fills build-cuda-deps/ (git-ignored) with the .deb files that scripts/device/build.sh unpacks on
# a GPU machine without network access: the development packages pagedattn's CMake files need
# (cpp-httplib through pkg-config with its openssl, zlib and brotli requirements, nlohmann-json,
# CLI11, GoogleTest/GoogleMock, OpenBLAS) and the runtime libraries of those that are compiled,
# plus pkgconf. Run it on a Debian or Ubuntu machine with apt (of the GPU machine's release or an
# older one: the libraries only need a glibc at least as old as theirs); no root needed.
#   scripts/device/fetch-deps.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-build-cuda-deps}
mkdir -p "$DIR"

dev=(libcpp-httplib-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libssl-dev
     zlib1g-dev libbrotli-dev libopenblas-pthread-dev pkgconf-bin)
# Runtime libraries, by the names this release gives them (libcpp-httplib0.11, libbrotli1, ...).
runtime_of() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances "$1" 2>/dev/null | awk -v re="$2" '$1 == "Depends:" && $2 ~ re { print $2 }' |
    tr -d '<>' | head -1
}
runtime=(
  "$(runtime_of libcpp-httplib-dev '^libcpp-httplib[0-9]')"
  "$(runtime_of libbrotli-dev '^libbrotli[0-9]')"
  "$(runtime_of libopenblas-pthread-dev '^libopenblas0-pthread')"
  "$(runtime_of pkgconf-bin '^libpkgconf[0-9]')"
)
pkgs=("${dev[@]}")
for r in "${runtime[@]}"; do
  if [[ -n "$r" ]]; then pkgs+=("$r"); fi
done

echo "fetch-deps: ${pkgs[*]}" >&2
(cd "$DIR" && apt-get download "${pkgs[@]}")
ls -l "$DIR"

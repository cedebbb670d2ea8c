#!/usr/bin/env bash
# Builds pagedattn with CUDA (sm_90a) on a GPU machine that may lack Debian development packages
# and cannot download them. Every package the build needs is looked for on the system first
# (its header, pkg-config module, CMake package or shared library); only the missing ones are
# unpacked from the .deb files in $DEPS_DIR (filled by scripts/device/fetch-deps.sh on a machine
# with apt) into a private prefix, whose .pc files and dangling library links are rewritten to
# point into that prefix (or at the system's own runtime libraries).
#
#   scripts/device/build.sh                       # pagedattn, test_gpu and the kernel lab
#   scripts/device/build.sh pagedattn test_gpu    # just these targets
#   PREPARE_ONLY=1 scripts/device/build.sh        # unpack and write the environment file only
#
# Environment: BUILD_DIR (build-gpu), DEPS_DIR (build-cuda-deps), DEPS_PREFIX
# (/tmp/pagedattn-deps), CUDA_ARCH (90a), JOBS (nproc), CMAKE_FLAGS (extra configure flags),
# PRETEND_MISSING (package names to unpack even where the system has them: tests this script on
# a machine that has everything).
# Writes $BUILD_DIR/deps-env.sh, which sets PATH, CPATH, LIBRARY_PATH, LD_LIBRARY_PATH,
# PKG_CONFIG_PATH and CMAKE_PREFIX_PATH for the prefix: source it before running what was built
# from another shell (the binaries also carry the prefix in their RPATH).
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD_DIR=${BUILD_DIR:-build-gpu}
DEPS_DIR=${DEPS_DIR:-build-cuda-deps}
DEPS_PREFIX=${DEPS_PREFIX:-/tmp/pagedattn-deps}
CUDA_ARCH=${CUDA_ARCH:-90a}
JOBS=${JOBS:-$(nproc)}
ARCH_TRIPLET=$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
SYS_LIB_DIRS="/usr/lib/$ARCH_TRIPLET /lib/$ARCH_TRIPLET /usr/lib /lib"
log() { echo "build.sh: $*" >&2; }

# ---- What the build needs, and how to tell that the system has it ----
# package (a glob: runtime packages carry their soname)  check
#   header:H   the C++ compiler finds #include <H> (CPATH included)
#   pc:M       pkg-config knows module M
#   cmake:P    a CMake package configuration P (PConfig.cmake or p-config.cmake)
#   tool:T     T is on PATH
#   with:D     a runtime library package: needed when its development package D was unpacked
# (the dependencies' own runtime libraries that every Ubuntu or Debian system has, libssl3 and
# zlib1g, are used from the system).
PACKAGES=(
  "pkgconf-bin tool:pkg-config"
  "libpkgconf[0-9]* with:pkgconf-bin"
  "libssl-dev pc:openssl"
  "zlib1g-dev pc:zlib"
  "libbrotli-dev pc:libbrotlicommon"
  "libbrotli[0-9]* with:libbrotli-dev"
  "libcpp-httplib-dev pc:cpp-httplib"
  "libcpp-httplib[0-9]* with:libcpp-httplib-dev"
  "nlohmann-json3-dev cmake:nlohmann_json"
  "libcli11-dev header:CLI/CLI.hpp"
  "libgtest-dev cmake:GTest"
  "libgmock-dev header:gmock/gmock.h"
  "libopenblas-pthread-dev header:cblas.h"
  "libopenblas0-pthread with:libopenblas-pthread-dev"
)

have_header() {
  printf '#include <%s>\n' "$1" | ${CXX:-c++} -x c++ -std=c++20 -E - >/dev/null 2>&1
}
have_pc() { command -v pkg-config >/dev/null && pkg-config --exists "$1" 2>/dev/null; }
have_cmake_pkg() {
  local lower d sub f prefixes=${CMAKE_PREFIX_PATH:-}
  lower=$(echo "$1" | tr '[:upper:]' '[:lower:]')
  for d in ${prefixes//:/ } /usr /usr/local; do
    for sub in "lib/$ARCH_TRIPLET/cmake" lib/cmake lib64/cmake share/cmake; do
      for f in "$d/$sub/$1"*/"$1"Config.cmake "$d/$sub/$lower"*/"$lower"-config.cmake; do
        [[ -e "$f" ]] && return 0
      done
    done
  done
  return 1
}
have() {
  local kind=${1%%:*} what=${1#*:}
  case $kind in
    header) have_header "$what" ;;
    pc) have_pc "$what" ;;
    cmake) have_cmake_pkg "$what" ;;
    tool) command -v "$what" >/dev/null ;;
    with) [[ " ${unpacked[*]} " != *" $what "* ]] ;;
    *) log "unknown check '$1'"; return 1 ;;
  esac
}

# The .deb in $DEPS_DIR whose Package field matches the glob $1 (empty when none).
deb_of() {
  local f name
  for f in "$DEPS_DIR"/*.deb; do
    [[ -e "$f" ]] || continue
    name=$(dpkg-deb -f "$f" Package 2>/dev/null || true)
    # shellcheck disable=SC2053
    if [[ -n "$name" && $name == $1 ]]; then
      echo "$f"
      return
    fi
  done
}

P="$DEPS_PREFIX"
LIBDIR="$P/usr/lib/$ARCH_TRIPLET"
prefix_env() {
  export CMAKE_PREFIX_PATH="$P/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$LIBDIR/pkgconfig:$LIBDIR/openblas-pthread/pkgconfig:$P/usr/share/pkgconfig:$P/usr/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export CPATH="$P/usr/include:$P/usr/include/$ARCH_TRIPLET:$P/usr/include/$ARCH_TRIPLET/openblas-pthread${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$LIBDIR:$LIBDIR/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$LIBDIR:$LIBDIR/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CMAKE_LIBRARY_PATH="$LIBDIR/openblas-pthread${CMAKE_LIBRARY_PATH:+:$CMAKE_LIBRARY_PATH}"
  export PATH="$P/usr/bin:$PATH"
}

# Points the unpacked files at the prefix: .pc variables and -I/-L flags that name /usr, and
# library links whose target is not in the prefix (a runtime library the system has, e.g.
# libcrypto.so -> libcrypto.so.3, or an absolute /lib/... link of another distribution's version).
fix_prefix() {
  local pc link target name stem found d
  while IFS= read -r -d '' pc; do
    sed -E -i "s#^([A-Za-z_]+)=/usr#\\1=$P/usr#; s#([ =])-([IL])/usr/#\\1-\\2$P/usr/#g" "$pc"
  done < <(find "$P" -name '*.pc' -print0)
  while IFS= read -r -d '' link; do
    [[ -e "$link" ]] && continue  # resolves
    target=$(readlink "$link")
    name=$(basename "$target")
    stem=${name%%.so*}.so  # libz.so.1.2.13 -> libz.so
    found=""
    for d in $SYS_LIB_DIRS; do
      [[ -e "$d/$name" ]] && { found="$d/$name"; break; }
    done
    if [[ -z "$found" ]]; then  # another version: the system's libX.so.N
      for d in $SYS_LIB_DIRS; do
        found=$(ls "$d/$stem".[0-9]* 2>/dev/null | sort -V | head -1 || true)
        [[ -n "$found" ]] && break
      done
    fi
    if [[ -n "$found" ]]; then
      ln -sfn "$found" "$link"
    else
      log "warning: $link -> $target resolves nowhere (its runtime package is missing)"
    fi
  done < <(find "$P/usr/lib" -type l -print0 2>/dev/null)
  # Debian's alternatives (made by maintainer scripts, which dpkg -x does not run): BLAS.
  if [[ -e "$LIBDIR/openblas-pthread/libopenblas.so" ]]; then
    mkdir -p "$P/usr/include/$ARCH_TRIPLET"
    ln -sfn "openblas-pthread/cblas.h" "$P/usr/include/$ARCH_TRIPLET/cblas.h"
    ln -sfn "openblas-pthread/libblas.so.3" "$LIBDIR/libblas.so.3"
    ln -sfn "openblas-pthread/libblas.so.3" "$LIBDIR/libblas.so"
  fi
}

# ---- Unpack what is missing ----
unpacked=() shown=()
if ls "$DEPS_DIR"/*.deb >/dev/null 2>&1; then
  rm -rf "$P"
  mkdir -p "$P"
  for entry in "${PACKAGES[@]}"; do
    pkg=${entry%% *}
    check=${entry#* }
    if [[ " ${PRETEND_MISSING:-} " != *" $pkg "* ]] && have "$check"; then continue; fi
    deb=$(deb_of "$pkg")
    if [[ -z "$deb" ]]; then
      log "missing $pkg ($check) and no .deb of it in $DEPS_DIR"
      continue
    fi
    dpkg -x "$deb" "$P"
    # NOTE: later checks (pkg-config modules that require others) must see what was unpacked.
    [[ ${#unpacked[@]} -eq 0 ]] && prefix_env
    unpacked+=("$pkg")
    shown+=("$(dpkg-deb -f "$deb" Package)")
    if [[ -x "$P/usr/bin/pkgconf" && ! -e "$P/usr/bin/pkg-config" ]]; then
      ln -s pkgconf "$P/usr/bin/pkg-config"
    fi
  done
  fix_prefix
else
  log "no .deb files in $DEPS_DIR: using the system's packages only"
fi
if [[ ${#unpacked[@]} -gt 0 ]]; then
  log "unpacked into $P: ${shown[*]}"
else
  log "every dependency was found on the system"
fi

mkdir -p "$BUILD_DIR"
{
  echo "# Written by scripts/device/build.sh: the environment of the unpacked dependencies."
  if [[ ${#unpacked[@]} -gt 0 ]]; then
    for v in PATH CPATH LIBRARY_PATH LD_LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH \
      CMAKE_LIBRARY_PATH; do
      printf 'export %s=%q\n' "$v" "${!v}"
    done
  fi
} >"$BUILD_DIR/deps-env.sh"
[[ -n "${PREPARE_ONLY:-}" ]] && exit 0

# ---- Configure and build ----
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
gen=()
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]] && command -v ninja >/dev/null; then gen=(-G Ninja); fi
prefix_flags=()
if [[ ${#unpacked[@]} -gt 0 ]]; then
  # NOTE: pkg-config drops -I and -L flags for directories in CPATH and LIBRARY_PATH, and cblas.h
  # comes with no CMake target: the prefix's include directories go into the cache, so a rebuild
  # from a shell without this environment still finds the headers.
  incs="$P/usr/include;$P/usr/include/$ARCH_TRIPLET;$P/usr/include/$ARCH_TRIPLET/openblas-pthread"
  # LIBRARY_PATH also makes CMake take the prefix's library directories for the compiler's own
  # and leave them out of the RPATH: name them explicitly so the binaries run without it.
  prefix_flags+=(-DCMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES="$incs"
    -DCMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES="$incs" -DCMAKE_PREFIX_PATH="$P/usr"
    -DCMAKE_BUILD_RPATH="$LIBDIR;$LIBDIR/openblas-pthread")
fi
if [[ -x "$P/usr/bin/pkgconf" ]]; then prefix_flags+=(-DPKG_CONFIG_EXECUTABLE="$P/usr/bin/pkgconf"); fi
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DPAGEDATTN_CUDA=ON "${prefix_flags[@]}" ${CMAKE_FLAGS:-}

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  # NOTE: Ninja's help leaves out executables whose output sits in the build root (pagedattn):
  # its target list has them.
  available=$(cmake --build "$BUILD_DIR" --target help 2>/dev/null || true
              ninja -C "$BUILD_DIR" -t targets all 2>/dev/null || true)
  for t in pagedattn test_gpu attention_decode_lab attention_prefill_lab skinny_gemm_lab \
             skinny_gemm_check bench_attention_cuda_main; do
    if grep -qE "(^|[ .:])$t(:|$| )" <<<"$available"; then targets+=("$t"); fi
  done
fi
log "building ${targets[*]}"
cmake --build "$BUILD_DIR" --target "${targets[@]}" -j"$JOBS"

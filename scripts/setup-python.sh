#!/usr/bin/env bash
# Installs the PyPI packages the Python package's build and tests need (nanobind, scikit-build-core,
# numpy, pytest) into python3's environment; does nothing when they are all importable. Never
# fails the setup: without them CMake leaves the Python package out and its test says why.
set -uo pipefail

command -v python3 >/dev/null || { echo "setup-python: no python3" >&2; exit 0; }
python3 -c "import nanobind, scikit_build_core, numpy, pytest" 2>/dev/null && exit 0

pkgs=("nanobind>=2.0" "scikit-build-core>=0.10" numpy pytest)
echo "setup-python: installing ${pkgs[*]}" >&2
pip=(python3 -m pip install --quiet --disable-pip-version-check)
# NOTE: Debian's own python3 refuses plain pip installs (PEP 668); the packages then go beside it.
"${pip[@]}" "${pkgs[@]}" 2>/dev/null || "${pip[@]}" --break-system-packages "${pkgs[@]}" ||
  echo "setup-python: could not install ${pkgs[*]}: the Python package will not be built" >&2
exit 0

"""PyPI packages for the Python oracles of the model tests, installed into a folder of the build tree.

Debian's system Python refuses `pip install` outside a virtual environment (PEP 668,
EXTERNALLY-MANAGED), so a missing package goes into DEPS with `pip install --target DEPS`, and DEPS
goes on sys.path (the tests also put it on PYTHONPATH). Packages the interpreter already has are
used as they are. When a package cannot be installed (offline, no pip) the script exits with
status 77 after printing why, which the tests report as a skip with that message.
"""
import fcntl
import importlib
import importlib.util
import os
import subprocess
import sys

SKIP = 77


def _missing(packages):
    importlib.invalidate_caches()
    return [pkg for module, pkg in packages.items() if importlib.util.find_spec(module) is None]


def ensure(deps, packages):
    """Makes every module of packages ({module: pip requirement}) importable, installing into deps."""
    os.makedirs(deps, exist_ok=True)
    deps = os.path.abspath(deps)
    if deps not in sys.path:
        sys.path.insert(0, deps)
    # NOTE: a folder that did not exist when Python started is cached as "no finder" for good.
    sys.path_importer_cache.pop(deps, None)
    if not _missing(packages):
        return
    # Tests run in parallel processes: one installs, the others wait and then find the packages.
    with open(os.path.join(deps, ".install-lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = _missing(packages)
        if missing:
            cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                   "--target", deps] + missing
            try:
                r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   timeout=600)
                out, rc = r.stdout.decode(errors="replace").strip(), r.returncode
            except (OSError, subprocess.TimeoutExpired) as e:
                out, rc = str(e), -1
            if rc != 0:
                last = out.splitlines()[-1] if out else "no output"
                print(f"cannot pip-install {' '.join(missing)} into {deps} (offline?): {last}",
                      file=sys.stderr)
                sys.exit(SKIP)
    still = _missing(packages)
    if still:
        print(f"pip installed {' '.join(still)} into {deps} but it cannot be imported",
              file=sys.stderr)
        sys.exit(1)

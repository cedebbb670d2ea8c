"""The package itself: its type stubs, its exports, the extension module's symbol table."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pagedattn


def test_type_stubs_ship_with_the_package():
    here = Path(pagedattn.__file__).parent
    assert (here / "py.typed").is_file()
    stub = (here / "_C.pyi").read_text()
    for name in ("def paged_attention(", "def write_kv(", "class AttentionPlan", "class KvCache",
                 "class Engine"):
        assert name in stub, name


def test_public_names():
    for name in pagedattn.__all__:
        assert hasattr(pagedattn, name), name
    assert isinstance(pagedattn.built_with_cuda, bool)
    assert pagedattn.cuda_device_count() >= 0


def exported_symbols(path: str):
    """(nm type letter, name) of every symbol the shared object defines and exports."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed: the module's symbol table cannot be read")
    out = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    return [tuple(line.split()[-2:]) for line in out.splitlines() if len(line.split()) >= 2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads an ELF symbol table")
def test_extension_keeps_its_static_libraries_private():
    """The module exports its init function and weak template copies only: nothing it takes from
    static archives (the pagedattn libraries, nanobind, a statically linked libstdc++). An
    exported libstdc++ copy is bound by the dynamic loader to the one numpy or torch loaded, and
    the first error message built with std::ostringstream then crashed the interpreter."""
    symbols = exported_symbols(pagedattn._C.__file__)
    assert ("T", "PyInit__C") in symbols
    strong = [name for kind, name in symbols if kind in "TDBRGSi" and name != "PyInit__C"]
    assert not strong, f"the extension exports {len(strong)} strong symbols, e.g. {strong[:4]}"
    ours = [name for _, name in symbols if "9pagedattn" in name]
    assert not ours, f"the extension exports {len(ours)} pagedattn symbols, e.g. {ours[:4]}"


def test_default_model_is_the_scripts_default():
    # The package's own copy of the default model's file name (it ships without scripts/) is the
    # one scripts/default-model.sh fetches.
    from conftest import MODEL
    from pagedattn.llm import DEFAULT_MODEL_FILE

    assert DEFAULT_MODEL_FILE == MODEL.name

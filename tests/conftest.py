import os
from pathlib import Path

import pytest

# Tests never reach the hub and never talk to W&B servers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(os.environ.get("UTURN_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data sets in ../shared/data (see its README); tests that need them skip without them."""
    if not (SHARED_DATA / "README.md").exists():
        pytest.skip(f"real data not found at {SHARED_DATA} (set UTURN_SHARED_DATA to the shared/data folder)")
    return SHARED_DATA

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


# Tiny offline checkpoints (tests/helpers/tiny.py), built once per session; `tiny` is imported lazily so that tests
# which do not need a model do not pay for importing transformers.
@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory) -> Path:
    """Tiny `Qwen3_5ForCausalLM` + BPE tokenizer with the real Qwen3.5 (no-think) chat template."""
    from helpers import tiny

    tokenizer = tiny.qwen_tokenizer()
    return tiny.save(tiny.tiny_causal_lm(tokenizer), tokenizer, tmp_path_factory.mktemp("tiny-qwen3.5"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """Tiny `Qwen3_5ForCausalLM` with a Llama-3-style tokenizer and template (no pad token, eos `<|eot_id|>`)."""
    from helpers import tiny

    tokenizer = tiny.llama_tokenizer()
    return tiny.save(tiny.tiny_causal_lm(tokenizer), tokenizer, tmp_path_factory.mktemp("tiny-llama3"))


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory) -> Path:
    """Tiny `Qwen3_5ForConditionalGeneration` (the hub layout, 1-block vision tower) with the Qwen3.5 tokenizer."""
    from helpers import tiny

    tokenizer = tiny.qwen_tokenizer()
    return tiny.save(tiny.tiny_vl_model(tokenizer), tokenizer, tmp_path_factory.mktemp("tiny-qwen3.5-vl"))


@pytest.fixture(scope="session")
def real_testbed(tmp_path_factory) -> Path:
    """The real testbed (the shipped seed-0 build, installed once per session: seconds), as `UTURN_HOME/testbed` of a
    fresh `UTURN_HOME` (its parent). Read-only: a test that changes it copies it first."""
    from uturn_train.testbed import install_testbed

    return install_testbed(tmp_path_factory.mktemp("uturn_home") / "testbed")

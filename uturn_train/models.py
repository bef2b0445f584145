"""Load a chat model and its tokenizer by hub name or local path, always as the text-only causal LM."""

import logging
import os

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def resolve_model_name(name: str) -> str:
    """`testbed` names the project's own tiny Qwen3.5 (built on first use); anything else is passed through."""
    if name == "testbed":
        from .testbed import ensure_testbed

        return str(ensure_testbed())
    return name


def load_tokenizer(name: str):
    """`AutoTokenizer` (never a processor: TRL treats a Qwen3.5 processor as a vision model) with a chat template."""
    from transformers import AutoTokenizer

    # transformers 5 builds an empty tokenizer from a config alone for some model types (qwen3_5 among them),
    # so a weights-only folder must be caught here rather than by AutoTokenizer.
    if os.path.isdir(name) and not any(os.path.exists(os.path.join(name, f)) for f in TOKENIZER_FILES):
        raise ValueError(
            f"model directory {name!r} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save one there with "
            f"tokenizer.save_pretrained('{name}')"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"could not load a tokenizer from {name!r}: check the hub name or path (the hub is unreachable when "
            f"HF_HUB_OFFLINE=1). ({e})"
        ) from e
    if not tokenizer.chat_template:
        raise ValueError(
            f"the tokenizer of {name!r} has no chat template: the probe renders the user turn with the model's own "
            "template. Use a chat (instruct) checkpoint or set tokenizer.chat_template and save it."
        )
    return tokenizer


def load_model(name: str, dtype: str = "auto", device: str | None = None):
    """`AutoModelForCausalLM`: a Qwen3.5 vision-language checkpoint loads as `Qwen3_5ForCausalLM` (same text weights).

    Args:
        dtype (`str`, *optional*, defaults to `"auto"`): `auto` = bfloat16 on GPU, float32 on CPU.
        device (`str`, *optional*): defaults to `cuda` when available.
    """
    import torch
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    else:
        torch_dtype = getattr(torch, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype)
    except (OSError, ValueError) as e:
        raise ValueError(f"could not load a causal LM from {name!r}: {e}") from e
    return model.to(device).eval()


def load_model_and_tokenizer(name: str, dtype: str = "auto", device: str | None = None):
    name = resolve_model_name(name)
    tokenizer = load_tokenizer(name)  # first: it fails fast and cheaply on a bad path
    return load_model(name, dtype=dtype, device=device), tokenizer

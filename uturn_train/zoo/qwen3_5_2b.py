"""Qwen3.5-2B's exact shape with random weights, built offline: `qwen3.5-2b-random`, a stand-in for `Qwen/Qwen3.5-2B`.

The hub is not reachable here, so the 2B recipes are run on a model of the same shape: the checkpoint's config (below,
each number with the public source it was read from), `Qwen3_5ForConditionalGeneration` with random weights (vision
tower included, bf16 on disk like the hub's files) and the real Qwen3.5 chat template from TRL, saved as a hub-format
folder. Every entry point loads it through the code that loads the hub checkpoint (`models.load_model`:
`AutoModelForCausalLM` turns the vision-language checkpoint into `Qwen3_5ForCausalLM` with the same text weights).

What it is not: a language model. Its tokenizer is the testbed's byte-level BPE (1,024 tokens; Qwen3.5's own has
248,320 and is not on PyPI), so token counts per word differ, and almost every sampled id lies beyond that tokenizer and
decodes to nothing: generation always runs to `max_new_tokens` (the worst case for memory and time), and the probe
reads empty turns. The hub checkpoint's multi-token-prediction weights (`mtp.*`, which transformers does not load) are
not built.

```bash
uturn plan --config recipes/qwen3.5-2b/collab_dpo.yaml      # reads this config for Qwen/Qwen3.5-2B
accelerate launch --config_file accelerate_configs/cpu.yaml recipes/collab_sft.py \\
    --config recipes/qwen3.5-2b/collab_sft.yaml --model_name_or_path qwen3.5-2b-random ...
```
"""

import logging
import random
import time
from pathlib import Path

from ..io import atomic_dir, write_json
from ..testbed import testbed_dir

logger = logging.getLogger(__name__)

NAME = "qwen3.5-2b-random"
HUB_ID = "Qwen/Qwen3.5-2B"

# Sources (GitHub; the hub itself is not reachable here). [A] SiliconBadgers/planning, sources/qwen35-2b-config.json: a
# copy of https://huggingface.co/Qwen/Qwen3.5-2B/blob/15852e8c16360a2fea060d615a32b45270f8a8fc/config.json (so says its
# sources/README.md); every value below is in it. [B] scripts/models/qwen3.5-2B.sh of slime forks (K1XE/BPM,
# williammtan/miles): Megatron flags for the 2B. [C] p-doom/omegalax, omegalax/models/qwen3_5/config.py, entry
# "qwen3.5-2b". [D] transformers 5.24 `Qwen3_5TextConfig` (its defaults and the full_attention_interval rule).
# Check: the text model built from these numbers has 1,881,825,088 parameters, and with the vision tower and the one
# multi-token-prediction layer it matches the hub's 2,274,069,824 (sources/qwen35-2b-model.json of [A], the hub API).
TEXT_CONFIG = {
    "vocab_size": 248320,  # [A][B]
    "hidden_size": 2048,  # [A][B][C]
    "intermediate_size": 6144,  # [A][B]
    "num_hidden_layers": 24,  # [A][B][C]
    "num_attention_heads": 8,  # [A][B][C]
    "num_key_value_heads": 2,  # [A][B]
    "head_dim": 256,  # [A][B] (kv-channels)
    "linear_num_key_heads": 16,  # [A]
    "linear_num_value_heads": 16,  # [A][C]
    "linear_key_head_dim": 128,  # [A]
    "linear_value_head_dim": 128,  # [A]
    "linear_conv_kernel_dim": 4,  # [A]
    "full_attention_interval": 4,  # [A]: layers 4, 8, ..., 24 full attention, the rest Gated DeltaNet [D]
    "rms_norm_eps": 1e-6,  # [A][B]
    "max_position_embeddings": 262144,  # [A]
    "tie_word_embeddings": True,  # [A][C]; [B] has no untie flag
    "hidden_act": "silu",  # [A][D]
    "attention_bias": False,  # [A]
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,  # [A][B]
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},  # [A]
    "eos_token_id": 248044,  # [A]
}
# The vision tower rides along in the checkpoint (AutoModelForCausalLM drops it): [A][C]. Its shape only matters for the
# size of the files and for the loading code, which must skip it.
VISION_CONFIG = {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16,
                 "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                 "num_position_embeddings": 2304}


def text_config(**overrides):
    """`Qwen3_5TextConfig` of Qwen3.5-2B; `overrides` shrink it for tests (same code, smaller numbers)."""
    from transformers import Qwen3_5TextConfig

    values = {**TEXT_CONFIG, **overrides}
    interval = values.pop("full_attention_interval")
    values["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                             for i in range(values["num_hidden_layers"])]
    return Qwen3_5TextConfig(**values)


def config(text_overrides: dict | None = None, vision_overrides: dict | None = None):
    """The whole checkpoint's `Qwen3_5Config` (vision-language), as on the hub."""
    from transformers import Qwen3_5Config

    text = text_config(**(text_overrides or {}))
    vision = {**VISION_CONFIG, "out_hidden_size": text.hidden_size, **(vision_overrides or {})}
    return Qwen3_5Config(text_config=text.to_dict(), vision_config=vision,
                         tie_word_embeddings=text.tie_word_embeddings)


def stand_in_dir() -> Path:
    """`$UTURN_HOME/qwen3.5-2b-random`, beside the testbed."""
    return testbed_dir().parent / NAME


def build(out: str | Path, *, seed: int = 0, text_overrides: dict | None = None,
          vision_overrides: dict | None = None) -> Path:
    """Write a random-weight Qwen3.5-2B (or a shrunk one, for tests) as a hub-format folder, atomically.

    4.4 GB on disk (bf16, like the hub's files); building took 123 s and 5.0 GiB of memory on 2 cores (AVX2).
    """
    import torch
    from transformers import Qwen3_5ForConditionalGeneration, set_seed

    from ..testbed.build import make_conversations, render, train_tokenizer

    start = time.perf_counter()
    set_seed(seed)
    rng = random.Random(seed)
    tokenizer = train_tokenizer([render(r["messages"]) for r in make_conversations(
        rng, 500, {"followup": 0.5, "new_problem": 0.5}, 0.15, set())], 1024)
    cfg = config(text_overrides, vision_overrides)
    cfg.text_config.pad_token_id = tokenizer.pad_token_id
    # bf16 from the start: a 2B model in fp32 would need twice the memory only to be cast before saving.
    model = Qwen3_5ForConditionalGeneration._from_config(cfg, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    text = model.model.language_model
    card = {
        "name": NAME, "stands_in_for": HUB_ID, "seed": seed, "class": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()),
        "text_params": sum(p.numel() for p in text.parameters()),
        "text_config": {**TEXT_CONFIG, **(text_overrides or {})}, "vision_config": cfg.vision_config.to_dict(),
        "tokenizer": f"the testbed's byte-level BPE ({len(tokenizer)} tokens) with TRL's qwen3_5_nothink template",
        "dtype": "bfloat16",
    }
    with atomic_dir(Path(out)) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        card["seconds"] = round(time.perf_counter() - start, 1)
        write_json(tmp / "card.json", card)
    logger.info("built %s (%.2fB parameters, %.2fB in the text model) in %.0f s -> %s", NAME, card["params"] / 1e9,
                card["text_params"] / 1e9, card["seconds"], out)
    return Path(out)


def ensure_stand_in() -> Path:
    """`$UTURN_HOME/qwen3.5-2b-random`, built the first time it is named."""
    path = stand_in_dir()
    if not (path / "card.json").is_file():
        print(f"building {NAME} (Qwen3.5-2B's shape, random weights) into {path}: a few minutes, once")
        build(path)
    return path


"""Load a chat model and its tokenizer by hub name or local path, always as the text-only causal LM; LoRA targets, and
the adapters merged for generation."""

import logging
import os
from contextlib import contextmanager
from dataclasses import replace

from .distributed import register_conv_weights

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")

# Qwen3.5's full attention (`self_attn`), Gated DeltaNet (`linear_attn`) and MLP projections of the decoder layers.
# Anchored on `layers.N.` so the vision tower (`model.visual.blocks.N...`) of a hub (vision-language) checkpoint is
# never wrapped, unlike "all-linear". Gated DeltaNet's `in_proj_a`/`in_proj_b` are left out: their outputs are one
# number per value head, narrower than the LoRA rank. PEFT has no default targets for qwen3_5.
QWEN3_5_LORA_TARGETS = (
    r".*layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)"
    r"|mlp\.(gate_proj|up_proj|down_proj))"
)
# Llama-family decoders (Llama, SmolLM2, Mistral, Qwen2/3): attention and MLP projections, anchored the same way.
LLAMA_LORA_TARGETS = r".*layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))"
LORA_TARGETS = {"qwen3_5": QWEN3_5_LORA_TARGETS, "qwen3_5_text": QWEN3_5_LORA_TARGETS, "llama": LLAMA_LORA_TARGETS,
                "mistral": LLAMA_LORA_TARGETS, "qwen2": LLAMA_LORA_TARGETS, "qwen3": LLAMA_LORA_TARGETS}


def load_tokenizer(name: str, revision: str | None = None):
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
        tokenizer = AutoTokenizer.from_pretrained(name, revision=revision)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"could not load a tokenizer from {name!r}: check the hub name or path (the hub is unreachable when "
            f"HF_HUB_OFFLINE=1; `testbed`, `smollm2-135m-instruct` and .gguf files are only resolved by the uturn "
            f"commands and recipes). ({e})"
        ) from e
    if not tokenizer.chat_template:
        raise ValueError(
            f"the tokenizer of {name!r} has no chat template: the probe renders the user turn with the model's own "
            "template. Use a chat (instruct) checkpoint or set tokenizer.chat_template and save it."
        )
    return tokenizer


def load_model(name: str, dtype: str = "auto", device: str | None = None, *, revision: str | None = None,
               attn_implementation: str | None = None):
    """`AutoModelForCausalLM`: a Qwen3.5 vision-language checkpoint loads as `Qwen3_5ForCausalLM` (same text weights).

    Args:
        dtype (`str`, *optional*, defaults to `"auto"`): `auto` = bfloat16 on GPU, float32 on CPU (CPUs without native
            bf16 emulate it, an order of magnitude slower).
        device (`str`, *optional*): where to put it; None leaves it on the CPU for a trainer to place.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if dtype == "auto":
        on_gpu = device.startswith("cuda") if device else torch.cuda.is_available()
        torch_dtype = torch.bfloat16 if on_gpu else torch.float32
    else:
        torch_dtype = getattr(torch, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype, revision=revision,
                                                     attn_implementation=attn_implementation)
    except (OSError, ValueError) as e:
        raise ValueError(f"could not load a causal LM from {name!r}: {e}") from e
    register_conv_weights(model)  # ZeRO-3 only: Gated DeltaNet reads its convolution's weight directly
    model.get_output_embeddings().register_forward_pre_hook(_standard_strides_on_cpu)
    return model.to(device).eval() if device else model


def _standard_strides_on_cpu(module, args):
    """A generation's prefill feeds the LM head the last position, `hidden[:, -1:]`: a strided view that PyTorch's CPU
    half-precision matmul cannot fold for a frozen head (LoRA), so its `bmm` copies the [hidden, vocab] weight once per
    row (pytorch/pytorch#151934, fix pending in #197851). Qwen3.5-2B's head in bf16: 0.95 GiB and ~7 s per row, against
    nothing and 0.07-0.09 s with the rows copied to standard strides first, as here (bench_lm_head_strides.py)."""
    import torch

    x = args[0]
    if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16) and x.dim() == 3 and (
            x.stride() != (x.size(1) * x.size(2), x.size(2), 1)):
        return (x.clone(memory_format=torch.contiguous_format), *args[1:])
    return None


def lora_config(model_args):
    """TRL's `get_peft_config`; without `lora_target_modules`, the targets of the model's `model_type`
    ([`LORA_TARGETS`]), read from its config."""
    from transformers import AutoConfig
    from trl import get_peft_config

    config = get_peft_config(model_args)
    if config is None or config.target_modules is not None:
        return config
    name = model_args.model_name_or_path
    model_type = AutoConfig.from_pretrained(name, revision=model_args.model_revision).model_type
    return replace(config, target_modules=default_lora_targets(model_type, name))


def default_lora_targets(model_type: str, name: str) -> str:
    """[`LORA_TARGETS`] of `model_type`; a clear error naming `--lora_target_modules` when there are none."""
    if model_type not in LORA_TARGETS:
        raise ValueError(f"no default LoRA targets for model_type {model_type!r} (--model_name_or_path {name}; known: "
                         f"{', '.join(LORA_TARGETS)}): pass --lora_target_modules, e.g. q_proj v_proj")
    return LORA_TARGETS[model_type]


def mergeable(module) -> bool:
    """Whether `module` is a layer [`merged_lora`] merges: PEFT's LoRA `Linear` and `Embedding`, plain LoRA. Left on
    the adapter path: DoRA and the other variants, and the layers whose merge replaces the parameter itself
    (MultiheadAttention, bitsandbytes) or shares a base layer with another wrapper (`target_parameters`)."""
    from peft.tuners.lora import Embedding, Linear

    return isinstance(module, (Linear, Embedding)) and not module.lora_variant


@contextmanager
def merged_lora(model):
    """The model's active LoRA adapters merged into their float32 base weights while the block runs (generation), the
    base weights put back exactly after it, on error too.

    Decoding runs one token per row and forward, where the adapters' two small matmuls beside every adapted linear
    weigh: the testbed's collaboration rollouts took 1.24-1.25x as long unmerged, its whole steps 1.14x
    (tests/benchmarks/bench_merged_rollouts.py, fp32 on a CPU). PEFT's `unmerge_adapter` subtracts the delta again,
    which rounds the base weights at every step (in bf16 the drift compounds, huggingface/trl#6688), so here PEFT
    merges into copies of the base weights and the originals are kept: one copy of the adapted weights
    while the block runs (`uturn plan` counts it). Half-precision weights stay unmerged: a delta under half a bf16 step
    of its weight (0.2-0.4% of it) would round away, and how much of an adapter that is is unmeasured.
    """
    import torch

    layers = [m for m in model.modules() if mergeable(m) and not m.merged and not m.disable_adapters
              and m.get_base_layer().weight.dtype == torch.float32]
    kept = []
    try:
        with torch.no_grad():
            for layer in layers:
                params = [(p, p.data) for p in layer.get_base_layer().parameters(recurse=False)]
                kept.append((layer, params))
                for p, data in params:  # a copy for PEFT to merge into, in place: the kept ones stay exact (its
                    p.data = data.clone()  # `safe_merge` also writes in place since peft 0.22, `.data.copy_`)
                layer.merge()
        yield model
    finally:
        for layer, params in kept:
            for p, data in params:
                p.data = data
            layer.merged_adapters.clear()

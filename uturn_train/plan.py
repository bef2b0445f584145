"""`uturn plan`: memory per device of a recipe YAML before it runs, on a given number and size of GPUs.

    uturn plan --config recipes/qwen3.5-2b/collab_dpo.yaml --gpus 1 8 --gpu_gb 24 80
    uturn plan --config recipes/qwen3.5-2b/collab_grpo.yaml --max_completion_length 256 --per_device_train_batch_size 8

The model's shape comes from its config (the hub id `Qwen/Qwen3.5-2B` reads the in-repo copy, `qwen3_5_2b.py`, so the
plan needs no network), the rest from the YAML and `--key value` overrides, as a recipe would read them. What is
counted, per device (bytes):

- **weights**: parameters x the `dtype`'s width (divided by the processes under ZeRO-3);
- **LoRA**: adapter parameters (fp32: PEFT upcasts adapters of a bf16 model), their gradients and AdamW's two moments,
  16 bytes each (gradients and moments divided under ZeRO-2/3);
- **activations**: with gradient checkpointing, every layer's input (tokens x hidden) plus one layer recomputed with
  its gradients; without, every layer's saved tensors (counted per token from the layer's widths: projections, norms,
  MLP, the delta rule's chunk states) plus one layer's gradients;
- **logits**: TRL's fused LM head computes the loss's log-probabilities in tiles (4,096 tokens x 32,768 vocabulary
  entries), so a 248,320-token vocabulary costs one tile and the hidden states' gradient, not batch x length x vocab;
- **generation** (the probe's, mining's and GRPO's): under ZeRO-3 the whole model gathered on every device (or its
  largest module, when generating layer by layer: `probe_ds3_gather` / `ds3_gather_for_generation` false), the cache
  (full-attention keys and values, Gated DeltaNet's recurrent and convolution states) and the prefill's MLP.

The peak is weights + LoRA + the larger of the training step and generation. Not counted: the CUDA context and the
allocator's fragmentation (budget ~1-2 GB on a GPU), the Python process (~1 GB of host memory), the data. Checked
against measured runs in recipes/README.md ("Qwen3.5-2B on a CPU").
"""

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

GB = 1e9
WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Shape:
    """What memory depends on in the model: counted on the meta device from its config, no weights loaded."""

    params: int
    largest_module: int  # parameters of the biggest module, what ZeRO-3 gathers at once layer by layer
    lora_params: int
    hidden: int
    intermediate: int
    layers: int
    layer_kinds: list[str]
    vocab: int
    kv_width: int  # key + value elements per token in one full-attention layer
    state_elems: int  # recurrent + convolution state elements per sequence in one Gated DeltaNet layer
    layer_act: dict  # saved activation elements per token, per layer kind, without checkpointing


def model_config(name: str):
    """The text config of `name`: the in-repo copy for Qwen/Qwen3.5-2B and the stand-in, else `AutoConfig`."""
    from transformers import AutoConfig

    from . import qwen3_5_2b

    if name in (qwen3_5_2b.HUB_ID, qwen3_5_2b.NAME) or qwen3_5_2b.is_stand_in(name):
        return qwen3_5_2b.text_config()
    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise ValueError(f"model_name_or_path {name!r}: could not read its config ({e}); pass --model_name_or_path "
                         "with a local folder") from e
    return config.get_text_config()


def shape(config, lora_r: int, lora_targets: str | list | None) -> Shape:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    lora = 0
    if lora_r:
        targets = lora_targets or _default_targets(config)
        match = (lambda n: re.fullmatch(targets, n)) if isinstance(targets, str) else (
            lambda n: n.split(".")[-1] in targets)
        lora = sum(lora_r * (m.in_features + m.out_features) for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and match(n))
    h, i = config.hidden_size, config.intermediate_size
    kinds = list(getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    mlp = 4 * i + 4 * h  # gate, up, activation, product; two norms' inputs and outputs
    # q (with Qwen3.5's output gate: 2x), k, v, their norms and rotary outputs, attention output, gate, o_proj input
    attn = 2 * heads * head_dim + 2 * kv_heads * head_dim + 3 * (heads + kv_heads) * head_dim + 3 * heads * head_dim
    act = {"full_attention": mlp + attn}
    state = 0
    if "linear_attention" in kinds:
        nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
        dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
        conv = 2 * nk * dk + nv * dv
        state = nv * dk * dv + conv * config.linear_conv_kernel_dim
        # projections, convolution and its activation, q/k l2-norms, the delta rule's per-token tensors, gated norm;
        # and the recurrent state the chunked delta rule keeps at every 64-token chunk (fla's kernels and the torch
        # fallback alike) for the backward
        act["linear_attention"] = mlp + 3 * conv + 4 * nk * dk + 8 * nv * dv + nv * dk * dv // 64
    return Shape(params, largest, lora, h, i, len(kinds), kinds, config.vocab_size, 2 * kv_heads * head_dim, state, act)


def _default_targets(config):
    from .models import LORA_TARGETS

    if config.model_type not in LORA_TARGETS and config.model_type.removesuffix("_text") not in LORA_TARGETS:
        raise ValueError(f"no default LoRA targets for model_type {config.model_type!r}: set lora_target_modules")
    return LORA_TARGETS.get(config.model_type) or LORA_TARGETS[config.model_type.removesuffix("_text")]


def recipe_of(config_path: str, values: dict) -> str:
    if "num_generations" in values:
        return "grpo"
    if "mine_source" in values or "beta" in values:
        return "dpo"
    if "loss_scope" in values or "collab_source" in values:
        return "sft"
    raise ValueError(f"{config_path}: cannot tell which recipe it is for (no num_generations, beta or loss_scope)")


def plan(values: dict, gpus: int, strategy: str, model: Shape) -> dict:
    """Bytes per device by component for one recipe's `values` (YAML + overrides) on `gpus` devices."""
    recipe = values["recipe"]
    dtype = str(values.get("dtype") or "auto").removeprefix("torch.")
    if dtype not in (*WIDTH, "auto"):
        raise ValueError(f"dtype {dtype!r}: plan for one of {', '.join(WIDTH)} (or auto: bfloat16 on a GPU)")
    w = WIDTH.get(dtype, 2)
    shard = gpus if strategy == "zero3" else 1
    states = gpus if strategy in ("zero2", "zero3") else 1
    batch = values.get("per_device_train_batch_size", 8)
    ckpt = values.get("gradient_checkpointing", False)
    prompt = values.get("prompt_tokens", 256)
    if recipe == "grpo":
        seq = prompt + values.get("prompt_answer_max_new_tokens", 512) + values.get("max_completion_length", 256)
        rows, loss_tokens = batch, batch * values.get("max_completion_length", 256)
    else:
        seq = values.get("max_length", 1024)
        rows = 2 * batch if recipe == "dpo" else batch  # DPO: chosen and rejected in one forward
        loss_tokens = rows * seq
    tokens = rows * seq
    act_per_layer = {k: tokens * v * w for k, v in model.layer_act.items()}
    # The backward of a layer holds its activations and, beside them, their gradients: one layer's worth on top of
    # what is saved (with checkpointing, that layer is the one recomputed).
    if ckpt:
        activations = model.layers * tokens * model.hidden * w + 2 * max(act_per_layer.values())
    else:
        activations = sum(act_per_layer[k] for k in model.layer_kinds) + max(act_per_layer.values())
    # TRL 1.16's fused LM head (trl/kernels/chunked_logprob.py) never holds the [tokens, vocab] logits: one tile of at
    # most 4,096 tokens x 32,768 vocabulary entries, recomputed in the backward, and the hidden states' fp32 gradient.
    logits = min(loss_tokens, 4096) * min(model.vocab, 32768) * w + loss_tokens * model.hidden * 4
    gen_batch = batch if recipe == "grpo" else values.get("probe_batch_size", 64)
    gen_len = (seq if recipe == "grpo" else prompt + values.get("probe_answer_max_new_tokens", 512)
               + values.get("probe_max_new_tokens", 256))
    n_full = model.layer_kinds.count("full_attention")
    n_linear = model.layers - n_full
    cache = gen_batch * (n_full * model.kv_width * gen_len * w + n_linear * model.state_elems * 4)
    prefill = gen_batch * prompt * 3 * model.intermediate * w
    # Under ZeRO-3, generation gathers the whole model on every device unless told to go layer by layer (the probe's
    # `probe_ds3_gather`, GRPO's `ds3_gather_for_generation`).
    whole = values.get("ds3_gather_for_generation" if recipe == "grpo" else "probe_ds3_gather", True)
    gathered = 0
    if strategy == "zero3":
        gathered = model.params * w * (gpus - 1) / gpus if whole else model.largest_module * w
    parts = {
        "weights": model.params * w / shard,
        "lora": model.lora_params * (4 / shard + 12 / states),
        "activations": activations,
        "logits": logits,
        "generation": gathered + cache + prefill,
    }
    parts["peak"] = parts["weights"] + parts["lora"] + max(activations + logits, parts["generation"])
    return parts


def _parse(argv):
    parser = argparse.ArgumentParser(prog="uturn plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="A recipe YAML, e.g. recipes/qwen3.5-2b/collab_dpo.yaml.")
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 8], help="Device counts to plan for.")
    parser.add_argument("--gpu_gb", type=float, nargs="+", default=[24, 80], help="Device sizes (GB) to check.")
    parser.add_argument("--prompt_tokens", type=int, default=256,
                        help="Tokens of a prompt before any answer (a GSM8K problem in its template: ~150-250).")
    args, rest = parser.parse_known_args(argv)
    overrides = {}
    while rest:
        key = rest.pop(0)
        if not key.startswith("--") or not rest:
            raise ValueError(f"uturn plan: overrides come as '--key value' (as for the recipe); got {key!r}")
        import yaml

        overrides[key[2:]] = yaml.safe_load(rest.pop(0))
    return args, overrides


def run_plan(argv: list[str]) -> list[dict]:
    import yaml

    args, overrides = _parse(argv)
    path = Path(args.config)
    if not path.is_file():
        raise ValueError(f"--config {args.config}: no such file")
    values = {**(yaml.safe_load(path.read_text()) or {}), "prompt_tokens": args.prompt_tokens, **overrides}
    values["recipe"] = recipe_of(args.config, values)
    if "model_name_or_path" not in values:
        raise ValueError(f"{args.config} names no model_name_or_path; pass --model_name_or_path")
    r = values.get("lora_r", 16) if values.get("use_peft") else 0
    model = shape(model_config(values["model_name_or_path"]), r, values.get("lora_target_modules"))
    rows = []
    for gpus in args.gpus:
        for strategy in ["single"] if gpus == 1 else ["ddp", "zero2", "zero3"]:
            parts = plan(values, gpus, strategy, model)
            rows.append({"gpus": gpus, "strategy": strategy, **parts,
                         "fits": {gb: parts["peak"] / GB + 1.5 <= gb for gb in args.gpu_gb}})
    _print(args, values, model, rows)
    return rows


def _print(args, values, model: Shape, rows) -> None:
    print(f"{values['model_name_or_path']}: {model.params / 1e9:.2f}B parameters, LoRA {model.lora_params / 1e6:.1f}M "
          f"trainable; {values['recipe']} ({args.config}), dtype {values.get('dtype', 'bfloat16')}, "
          f"gradient checkpointing {'on' if values.get('gradient_checkpointing') else 'off'}")
    cols = ["weights", "lora", "activations", "logits", "generation", "peak"]
    heads = ("weights", "LoRA", "activ.", "logits", "generate", "peak")
    print("GB per device; 'fits' adds 1.5 GB for the CUDA context and fragmentation")
    print(f"{'GPUs':>4} {'':<6}" + "".join(f"{c:>9}" for c in heads) + "  fits")
    for row in rows:
        fits = " ".join(f"{gb:g}:{'yes' if ok else 'no'}" for gb, ok in row["fits"].items())
        print(f"{row['gpus']:>4} {row['strategy']:<6}" + "".join(f"{row[c] / GB:>9.2f}" for c in cols) + f"  {fits}")

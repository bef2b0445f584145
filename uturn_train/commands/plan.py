"""`uturn plan`: memory per device of a recipe YAML before it runs, on a given number and size of GPUs.

    uturn plan --config recipes/qwen3.5-2b/collab_dpo.yaml --gpus 1 8 --gpu_gb 24 80
    uturn plan --config recipes/qwen3.5-2b/collab_grpo.yaml --max_completion_length 256 --per_device_train_batch_size 8

The model's shape comes from its config (the hub id `Qwen/Qwen3.5-2B` reads the in-repo copy, `qwen3_5_2b.py`, so the
plan needs no network), the rest from the recipe's defaults, the YAML and `--key value` overrides, as the recipe would
read them. LoRA runs only. What is counted, per device (GiB):

- **weights**: parameters x the `dtype`'s width (divided by the processes under ZeRO-3, which gathers a module at a
  time on top);
- **LoRA**: adapter parameters (fp32: PEFT upcasts adapters of a bf16 model), their gradients and AdamW's two moments,
  16 bytes each (gradients and moments divided under ZeRO-2/3);
- **activations**: with gradient checkpointing, every layer's input (tokens x hidden) plus one layer recomputed with
  its gradients; without, every layer's saved tensors (counted per token from the layer's widths: projections, norms,
  MLP, the delta rule's chunk states) plus one layer's gradients;
- **logits**: TRL's fused LM head computes the loss's log-probabilities in tiles (4,096 tokens x 32,768 vocabulary
  entries), so a 248,320-token vocabulary costs one tile and the hidden states' gradient, not batch x length x vocab;
- **generation**: the largest `generate` call: the probe's (`probe_batch_size` prompts x `probe_samples` sampled
  turns, after an answer), mining's (DPO without pairs) or GRPO's rollouts (with `objective: collab`, the last turn
  of a conversation of `collab_max_turns` policy turns and the partner's between them); its cache (full-attention keys
  and values, each prompt's once and every sampled row's own tokens, as the engine shares a prompt among its rows;
  Gated DeltaNet's recurrent and convolution states per row), the prefill's MLP over every prompt token at once,
  the collaboration rollouts' copy of the adapted weights with the adapters merged (fp32: `models.merged_lora`),
  and under ZeRO-3 the whole model gathered on every device (or its largest module, when generating layer by layer:
  `probe_ds3_gather` / `ds3_gather_for_generation` false, the latter also for the answers GRPO writes before
  training; mining always gathers).

The peak is weights + LoRA + the larger of the training step and generation. Not counted: the CUDA context and the
allocator's fragmentation (budget ~1-2 GB on a GPU), the Python process (~1 GB of host memory), the data. Checked
against measured runs in recipes/README.md ("Qwen3.5-2B on a CPU").
"""

import argparse
from dataclasses import dataclass
from pathlib import Path

from . import dashed_aliases

GIB = 2**30
CUDA_GIB = 1.5  # the CUDA context and the allocator's fragmentation, beside what is planned
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
    adapted: int  # weights of the layers LoRA wraps: fp32 collaboration rollouts merge them into a copy


def model_config(name: str):
    """The text config of `name`: the in-repo copy for Qwen/Qwen3.5-2B and the stand-in's name, else `AutoConfig` (a
    folder's own config: a shrunk build of the stand-in is planned as what it is)."""
    from transformers import AutoConfig

    from ..zoo import qwen3_5_2b

    if name in (qwen3_5_2b.HUB_ID, qwen3_5_2b.NAME):
        return qwen3_5_2b.text_config()
    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise ValueError(f"model_name_or_path {name!r}: could not read its config ({e}); pass --model_name_or_path "
                         "with a local folder") from e
    return config.get_text_config()


def shape(config, lora_r: int, lora_targets: str | list | None, name: str = "") -> Shape:
    import torch
    from transformers import AutoModelForCausalLM

    from ..models import default_lora_targets

    missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                           "num_key_value_heads", "vocab_size") if getattr(config, k, None) is None]
    if missing:
        raise ValueError(f"model_type {config.model_type!r}: its config lacks {', '.join(missing)}; the plan counts "
                         "decoder-only transformers (Llama, Qwen2/3, Qwen3.5 and their kind)")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    lora = adapted = 0
    if lora_r:
        from peft import LoraConfig, get_peft_model

        from ..models import mergeable

        targets = lora_targets or default_lora_targets(config.model_type, name)
        if isinstance(targets, list) and len(targets) == 1:  # TRL passes a one-item list on as the string
            targets = targets[0]
        # PEFT itself picks the modules, on the meta device: the count is what training will create.
        try:
            peft_model = get_peft_model(model, LoraConfig(r=lora_r, target_modules=targets))
        except ValueError as e:  # PEFT's NoMatchingPeftModuleError
            raise ValueError(f"lora_target_modules {targets!r} matches no module of {config.model_type!r} ({e}): name "
                             "modules as PEFT does (e.g. q_proj v_proj, or all-linear)") from e
        lora = sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n)
        adapted = sum(m.get_base_layer().weight.numel() for m in peft_model.modules() if mergeable(m))
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
    return Shape(params, largest, lora, h, i, len(kinds), kinds, config.vocab_size, 2 * kv_heads * head_dim, state, act,
                 adapted)


def recipe_of(config_path: str, values: dict) -> str:
    if values.get("recipe"):
        return values["recipe"]
    if "num_generations" in values:
        return "grpo"
    if "mine_source" in values or "beta" in values:
        return "dpo"
    if "loss_scope" in values or "collab_source" in values:
        return "sft"
    raise ValueError(f"{config_path}: cannot tell which recipe it is for (no num_generations, beta or loss_scope): "
                     "pass --recipe sft, dpo or grpo (an ablation file: plan one of its runs' YAMLs)")


def defaults(recipe: str) -> dict:
    """The values a recipe uses when the YAML is silent: its dataclasses' defaults (TRL's and this project's)."""
    import dataclasses

    from trl import DPOConfig, GRPOConfig, ModelConfig, ScriptArguments, SFTConfig

    from ..training.callback import ProbeArguments
    from ..training.data import CollabDataArguments
    from ..training.mining import MiningArguments
    from ..training.rl_data import RLArguments

    # As each recipe's make_parser() lists them
    classes = {"sft": [ScriptArguments, SFTConfig, CollabDataArguments], "dpo": [ScriptArguments, DPOConfig,
               MiningArguments], "grpo": [GRPOConfig, RLArguments]}[recipe]
    out = {}
    for cls in [ModelConfig, ProbeArguments, *classes]:
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
    return out


def _generation(model: Shape, w: int, prompts: int, k: int, prompt: int, new: int, gathered: float) -> float:
    """One `generate` call of `k` rows for each of `prompts` prompts: the gathered weights, the cache (a prompt's keys
    and values once, in a buffer as wide as prompt and turn; with k > 1 each row's own tokens apart,
    `uturn_train.shared_prefix`, or, for a model with other layer kinds (sliding windows), the prompt copied per row as
    the engine then does; recurrent states per row), the prefill's MLP (every prompt token at once: gate, up,
    activation) and every row's last-token logits (in the model's dtype, in fp32, and sampling's softmax)."""
    n_full, rows = model.layer_kinds.count("full_attention"), prompts * k
    shared = set(model.layer_kinds) <= {"full_attention", "linear_attention"}
    tokens = prompts * (prompt + new) + rows * new if k > 1 and shared else rows * (prompt + new)
    cache = n_full * model.kv_width * tokens * w + rows * (model.layers - n_full) * model.state_elems * 4
    logits = rows * model.vocab * (w + 4 + (4 if k > 1 else 0))
    return gathered + cache + prompts * prompt * 3 * model.intermediate * w + logits


def plan(values: dict, gpus: int, strategy: str, model: Shape) -> dict:
    """Bytes per device by component for one recipe's `values` (its defaults, the YAML, overrides) on `gpus`
    devices."""
    recipe = values["recipe"]
    dtype = str(values["dtype"]).removeprefix("torch.")
    if dtype not in (*WIDTH, "auto"):
        raise ValueError(f"dtype {dtype!r}: plan for one of {', '.join(WIDTH)} (or auto: bfloat16 on a GPU)")
    w = WIDTH.get(dtype, 2)
    shard = gpus if strategy == "zero3" else 1
    states = gpus if strategy in ("zero2", "zero3") else 1
    batch = values["per_device_train_batch_size"]
    prompt = values["prompt_tokens"]
    if recipe == "grpo":
        answered = prompt + values["prompt_answer_max_new_tokens"]  # the user turn follows the policy's answer
        completion = values["max_completion_length"]
        if values.get("objective") == "collab":
            # A whole conversation is the completion: the policy's turns, and between them the partner's (the oracle's
            # longest line is a worked solution, counted as long as an answer).
            turns = values["collab_max_turns"]
            completion = turns * completion + (turns - 1) * values["prompt_answer_max_new_tokens"]
        seq = answered + completion
        rows, loss_tokens = batch, batch * completion
    else:
        seq = values["max_length"]
        rows = 2 * batch if recipe == "dpo" else batch  # DPO: chosen and rejected in one forward
        loss_tokens = rows * seq
    tokens = rows * seq
    act_per_layer = {k: tokens * v * w for k, v in model.layer_act.items()}
    # The backward of a layer holds its activations and, beside them, their gradients: one layer's worth on top of
    # what is saved (with checkpointing, that layer is the one recomputed). ZeRO-3 gathers a module at a time.
    if values["gradient_checkpointing"]:
        activations = model.layers * tokens * model.hidden * w + 2 * max(act_per_layer.values())
    else:
        activations = sum(act_per_layer[k] for k in model.layer_kinds) + max(act_per_layer.values())
    if strategy == "zero3":
        activations += model.largest_module * w
    # TRL 1.16's fused LM head (trl/kernels/chunked_logprob.py) never holds the [tokens, vocab] logits: one tile of at
    # most 4,096 tokens x 32,768 vocabulary entries, recomputed in the backward, and the hidden states' fp32 gradient.
    logits = min(loss_tokens, 4096) * min(model.vocab, 32768) * w + loss_tokens * model.hidden * 4

    def gathered(whole: bool) -> float:  # under ZeRO-3: the whole model on every device, or its largest module
        if strategy != "zero3":
            return 0
        # Full size beside the shard: DeepSpeed gathers into a new buffer of the whole tensor and keeps the partition
        # (`_allgather_params_coalesced`); measured, the 2B GRPO smoke's step-0 probe under two processes.
        return model.params * w if whole else model.largest_module * w

    def sampled(samples: int, temperatures) -> int:  # rows per prompt: num_return_sequences when sampling
        return max(1, samples) if any(t > 0 for t in temperatures or [0.0]) else 1

    phases = {"probe": _generation(model, w, values["probe_batch_size"],
                                   sampled(values["probe_samples"], values["probe_temperatures"]),
                                   prompt + values["probe_answer_max_new_tokens"], values["probe_max_new_tokens"],
                                   gathered(values["probe_ds3_gather"]))}
    if recipe == "dpo" and not values.get("dataset_name"):  # mining gathers the whole model under ZeRO-3
        phases["mining"] = _generation(model, w, values["mine_batch_size"],
                                       sampled(values["mine_samples"], values["mine_temperatures"]),
                                       prompt + values["mine_answer_max_new_tokens"], values["mine_max_new_tokens"],
                                       gathered(True))
    if recipe == "grpo":
        per_step = values["steps_per_generation"] or values["gradient_accumulation_steps"]
        # The last turn of a conversation is generated after all the others: the longest cache.
        phases["rollouts"] = _generation(model, w, batch * per_step, 1, seq - values["max_completion_length"],
                                         values["max_completion_length"], gathered(values["ds3_gather_for_generation"]))
        if values.get("objective") == "collab" and w == 4:  # its fp32 rollouts generate with the adapters merged
            phases["rollouts"] += model.adapted * w  # into a copy (`models.merged_lora`)
    parts = {
        "weights": model.params * w / shard,
        "lora": model.lora_params * (4 / shard + 12 / states),
        "activations": activations,
        "logits": logits,
        "generation": max(phases.values()),
        "generation_phase": max(phases, key=phases.get),
    }
    parts["peak"] = parts["weights"] + parts["lora"] + max(activations + logits, parts["generation"])
    return parts


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="uturn plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="A recipe YAML, e.g. recipes/qwen3.5-2b/collab_dpo.yaml.")
    parser.add_argument("--recipe", choices=["sft", "dpo", "grpo"], help="Which recipe (default: from the YAML).")
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 8], help="Device counts to plan for.")
    parser.add_argument("--gpu_gb", type=float, nargs="+", default=[24, 80], help="Device sizes (GiB) to check.")
    parser.add_argument("--prompt_tokens", type=int, default=256,
                        help="Tokens of a prompt before any answer (a GSM8K problem in its template: ~150-250).")
    return dashed_aliases(parser)


def _parse(argv):
    import yaml

    args, rest = make_parser().parse_known_args(argv)
    overrides, key = {}, None
    for item in rest:  # as the recipe reads them: `--key value`, `--key v1 v2` (a list), `--flag` (true)
        if item.startswith("--"):
            key = item[2:]
            overrides[key] = True
        elif key is None:
            raise ValueError(f"uturn plan: overrides come as '--key value' (as for the recipe); got {item!r}")
        else:
            value = yaml.safe_load(item)
            previous = overrides[key]
            overrides[key] = value if previous is True else [*previous, value] if isinstance(previous, list) else [
                previous, value]
    return args, overrides


def run_plan(argv: list[str]) -> list[dict]:
    import yaml

    args, overrides = _parse(argv)
    path = Path(args.config)
    if not path.is_file():
        raise ValueError(f"--config {args.config}: no such file")
    given = {**(yaml.safe_load(path.read_text()) or {}), "recipe": args.recipe, **overrides}
    recipe = recipe_of(args.config, given)
    known = defaults(recipe)
    unknown = [key for key in given if key not in known and key not in ("recipe", "env")]
    if unknown:  # a misspelt option would otherwise plan the default silently
        import difflib

        hints = [f"--{k}" + (f" (did you mean --{m[0]}?)" if (m := difflib.get_close_matches(k, known, 1)) else "")
                 for k in unknown]
        raise ValueError(f"{', '.join(hints)}: not an option of the {recipe} recipe "
                         f"({'the command line' if set(unknown) & set(overrides) else args.config})")
    values = {**known, **given, "recipe": recipe, "prompt_tokens": args.prompt_tokens}
    if "model_name_or_path" not in given:
        raise ValueError(f"{args.config} names no model_name_or_path; pass --model_name_or_path")
    if not values["use_peft"]:
        raise ValueError(f"{args.config}: use_peft is off (full fine-tuning); the plan covers LoRA runs: "
                         "pass --use_peft true")
    model = shape(model_config(values["model_name_or_path"]), values["lora_r"], values.get("lora_target_modules"),
                  values["model_name_or_path"])
    rows = []
    for gpus in args.gpus:
        for strategy in ["single"] if gpus == 1 else ["ddp", "zero2", "zero3"]:
            parts = plan(values, gpus, strategy, model)
            rows.append({"gpus": gpus, "strategy": strategy, **parts,
                         "fits": {gb: parts["peak"] / GIB + CUDA_GIB <= gb for gb in args.gpu_gb}})
    _print(args, values, model, rows)
    return rows


def _print(args, values, model: Shape, rows) -> None:
    print(f"{values['model_name_or_path']}: {model.params / 1e9:.2f}B parameters, LoRA {model.lora_params / 1e6:.1f}M "
          f"trainable; {values['recipe']} ({args.config}), dtype {values['dtype']}, "
          f"gradient checkpointing {'on' if values['gradient_checkpointing'] else 'off'}")
    cols = ["weights", "lora", "activations", "logits", "generation", "peak"]
    heads = ("weights", "LoRA", "activ.", "logits", "generate", "peak")
    print(f"GiB per device; fits: peak + {CUDA_GIB:g} (CUDA); generate: the {rows[0]['generation_phase']} call")
    print(f"{'GPUs':>4} {'':<6}" + "".join(f"{c:>9}" for c in heads) + "  fits")
    for row in rows:
        fits = " ".join(f"{gb:g}:{'yes' if ok else 'no'}" for gb, ok in row["fits"].items())
        print(f"{row['gpus']:>4} {row['strategy']:<6}" + "".join(f"{row[c] / GIB:>9.2f}" for c in cols) + f"  {fits}")


def main(argv: list[str]) -> None:
    run_plan(argv)

"""What the collaboration recipes share: model and tokenizer, Qwen3.5 LoRA targets, W&B mode, the closing report."""

import json
import logging
import netrc
import os
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

# Qwen3.5's full attention (`self_attn`), Gated DeltaNet (`linear_attn`) and MLP projections of the decoder layers.
# Anchored on `layers.N.` so the vision tower (`model.visual.blocks.N...`) of a hub (vision-language) checkpoint is
# never wrapped, unlike "all-linear". Gated DeltaNet's `in_proj_a`/`in_proj_b` are left out: their outputs are one
# number per value head, narrower than the LoRA rank. PEFT has no default targets for qwen3_5.
QWEN3_5_LORA_TARGETS = (
    r".*layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)"
    r"|mlp\.(gate_proj|up_proj|down_proj))"
)


def load_model_and_tokenizer(model_args, training_args):
    """`AutoModelForCausalLM` (the text-only `Qwen3_5ForCausalLM` even from a vision-language checkpoint) and an
    explicit `AutoTokenizer`: given a name or a processor, TRL treats Qwen3.5 as a vision model and refuses
    `assistant_only_loss`. `testbed` is built first if missing, by one process while the others wait."""
    from transformers import AutoModelForCausalLM

    from .models import load_tokenizer, resolve_model_name

    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is not set: pass a hub id, a local path or `testbed`")
    with training_args.main_process_first(desc="resolving the model"):
        path = resolve_model_name(model_args.model_name_or_path)
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(
        path, revision=model_args.model_revision, dtype=model_args.dtype,
        attn_implementation=model_args.attn_implementation,
    )
    return model, tokenizer


def lora_config(model_args):
    """TRL's `get_peft_config`, with [`QWEN3_5_LORA_TARGETS`] when no `lora_target_modules` are given."""
    from trl import get_peft_config

    config = get_peft_config(model_args)
    if config is not None and config.target_modules is None:
        config = replace(config, target_modules=QWEN3_5_LORA_TARGETS)
    return config


def wandb_offline_unless_logged_in(report_to) -> None:
    """Offline W&B when the user is not logged in: online mode without a reachable server hangs (stack-facts §7)."""
    if "wandb" not in (report_to or []) or os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        logged_in = netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        logged_in = False
    if not logged_in:
        os.environ["WANDB_MODE"] = "offline"
        logger.warning("W&B: not logged in (no WANDB_API_KEY, no %s in ~/.netrc), so logging offline; upload the "
                       "run later with `wandb sync`", host)


def read_probe_history(output_dir: str | Path) -> list[dict]:
    path = Path(output_dir) / "probe_history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def report_probe_history(output_dir: str | Path, title: str = "") -> list[dict]:
    """Print the probe history as a table and plot it to `output_dir/probe_history.png`; returns the records."""
    from rich.console import Console
    from rich.table import Table

    from .probe.plot import plot_probe_history

    records = read_probe_history(output_dir)
    if not records:
        logger.warning("no probe history in %s (probe off?)", output_dir)
        return records
    temperatures = [s["temperature"] for s in records[0]["settings"]]
    table = Table(title=f"User-turn probe per checkpoint{' · ' + title if title else ''}")
    for col in ["step", "accuracy", *[f"follow-up T={t:g} [95% CI]" for t in temperatures], "seconds", "error"]:
        table.add_column(col, justify="right")
    for r in records:
        by_t = {s["temperature"]: s for s in r["settings"]}
        rates = [f"{by_t[t]['followup_rate']:.3f} [{by_t[t]['ci95'][0]:.2f}, {by_t[t]['ci95'][1]:.2f}]"
                 if t in by_t else "-" for t in temperatures]
        table.add_row(str(r["step"]), "-" if r["accuracy"] is None else f"{r['accuracy']:.3f}", *rates,
                      f"{r['seconds']:.0f}", r["error"] or "")
    Console().print(table)
    plot_probe_history(records, Path(output_dir) / "probe_history.png", title=title)
    return records

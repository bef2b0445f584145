"""The testbed: a tiny Qwen3.5 that the project pre-trains from scratch, offline, in minutes on a CPU.

It lives in a world of GSM8K-style arithmetic word problems (`world.py`) and of the user turns that follow an answer
in real chat logs (`turns.py`): grounded follow-ups, thanks, and new unrelated problems. The model answers decently,
its greedy user turns are almost never follow-ups, and its samples at temperature 1.0 sometimes are: a miniature of
the situation the user-turn probe measures. The testbed is a user of the core, beside the recipes: the core takes
paths, and the entry points (`uturn`, the recipes, the eval scripts) call [`resolve`] to turn the name `testbed` in
their options into the built testbed's paths.

The first time it is named, the seed-0 build that ships with the toolkit is installed (its data drawn again, its
weights copied and checked: seconds), so every user starts from the same step 0; `uturn testbed build` pre-trains it
from scratch on the machine at hand (minutes; another CPU's kernels give another model, as another seed would).

```bash
uturn testbed build                  # into $UTURN_HOME/testbed (default ~/.cache/uturn/testbed), from scratch
uturn probe --model testbed --task testbed --limit 200 --temperatures 0 1.0 --samples 4
```
"""

import json
import logging
import os
from pathlib import Path

from ..io import atomic_dir

logger = logging.getLogger(__name__)

__all__ = ["build_testbed", "ensure_testbed", "install_testbed", "resolve", "testbed_dir"]


def testbed_dir() -> Path:
    """Where the default build lives: `$UTURN_HOME/testbed`, `UTURN_HOME` defaulting to `~/.cache/uturn`."""
    return Path(os.environ.get("UTURN_HOME", "~/.cache/uturn")).expanduser() / "testbed"


def build_testbed(out: str | Path | None = None, *, force: bool = False, seed: int = 0, smoke: bool = False) -> Path:
    """Pre-train the testbed from scratch and write it, with its data and card, to `out`.

    The build goes to a temporary folder beside `out` that replaces it only when complete, so an interrupted build
    never leaves a half-written testbed.

    Args:
        out (`str` or `Path`, *optional*): target folder; defaults to [`testbed_dir`].
        force (`bool`, *optional*, defaults to `False`): replace an existing build.
        seed (`int`, *optional*, defaults to `0`): seeds the data, the initialization and the data order; the same
            seed gives the same weights.
        smoke (`bool`, *optional*, defaults to `False`): a few steps and a few probed problems (seconds), for
            plumbing tests; the model is not trained enough to answer.

    Returns:
        `Path`: the build folder.
    """
    from .build import BuildConfig, build

    config = BuildConfig.smoke() if smoke else BuildConfig()
    return _write(out, force, "(`uturn testbed build --force`) to rebuild it",
                  lambda tmp: {**build(tmp, seed=seed, config=config), "smoke": smoke})


def _write(out: str | Path | None, force: bool, how: str, make) -> Path:
    """`make(tmp)` fills a temporary folder beside `out` and returns the card; the folder, with the card, replaces
    `out` only when complete."""
    out = Path(out).expanduser() if out is not None else testbed_dir()
    if out.exists() and not force:
        raise ValueError(f"{out} already exists; pass force=True {how}")
    with atomic_dir(out, replace=True) as tmp:
        card = make(tmp)
        (tmp / "card.json").write_text(json.dumps(card, indent=2) + "\n")
        (tmp / "CARD.md").write_text(_card_markdown(card))
    return out


def install_testbed(out: str | Path | None = None, *, force: bool = False) -> Path:
    """Write the shipped seed-0 testbed to `out` (default [`testbed_dir`]): its data drawn as a build draws it, its
    tokenizer and weights copied from the package and checked against their sha256 (seconds). Atomic, as a build."""
    from .build import SHIPPED, BuildConfig, build

    return _write(out, force, "to replace it", lambda tmp: build(tmp, seed=0, config=BuildConfig(), shipped=SHIPPED))


def ensure_testbed() -> Path:
    """The default testbed, installed first from the shipped weights (seconds) if it is missing, or again if it was
    installed from another version's shipped build (a build of one's own, `uturn testbed build`, is kept)."""
    from .build import SHIPPED_SHA256

    path = testbed_dir()
    if not (path / "card.json").exists():
        logger.warning("The testbed is not installed yet: writing the shipped seed-0 build into %s", path)
        install_testbed(path, force=path.exists())
    elif json.loads((path / "card.json").read_text()).get("installed", {}).get("sha256", SHIPPED_SHA256) \
            != SHIPPED_SHA256:
        # Otherwise an upgrade would go on with the old weights, and no figure of this version's docs would hold.
        logger.warning("%s holds the testbed another version of uturn-train shipped: writing this version's", path)
        install_testbed(path, force=True)
    return path


# The options that may name the testbed, and what they then get: the field holding the data, and the file.
_DATA_OF = {"task": ("data", "heldout.jsonl"), "probe_task": ("probe_data", "heldout.jsonl"),
            "mine_source": ("mine_data", "conversations.jsonl"),
            "prompt_source": ("prompt_data", "conversations.jsonl"),
            "collab_source": ("collab_data", "conversations.jsonl")}


def resolve(*configs) -> None:
    """Replace the name `testbed` in `configs` (parsed dataclasses) by the built testbed, building it if missing.

    `model` / `model_name_or_path` `testbed` become its folder; `task` / `probe_task` `testbed` without data get its
    held-out problems, `mine_source` / `prompt_source` / `collab_source` `testbed` without data its training
    conversations, `uturn collab`'s `task` and the callback's `probe_collab` `testbed` its collaboration tasks
    (`collab.jsonl`, written from its held-out problems if missing or stale). Under several
    processes, call it on every one inside `main_process_first`, so that one builds while the others wait.
    """
    from .collab import ensure_collab_tasks

    for config in configs:
        for name in ("model", "model_name_or_path", "partner"):
            if getattr(config, name, None) == "testbed":
                setattr(config, name, str(ensure_testbed()))
        # Collaboration tasks: `uturn collab --task testbed` and the callback's `probe_collab testbed`.
        # `uturn collab`'s arguments are the only ones with a `partner` (not imported: torch would load with it).
        if hasattr(config, "partner") and config.task == "testbed" and config.data is None:
            config.data = str(ensure_collab_tasks(ensure_testbed()))
        for name, (data, file) in _DATA_OF.items():
            if getattr(config, name, None) == "testbed" and getattr(config, data) is None:
                setattr(config, data, str(ensure_testbed() / file))
        if getattr(config, "probe_collab", None) == "testbed":
            config.probe_collab = str(ensure_collab_tasks(ensure_testbed()))


def _card_markdown(card: dict) -> str:
    c, m, d, probe = card["config"], card["model"], card["data"], card.get("probe")
    lines = [
        "# uturn testbed",
        "",
        f"A `{m['class']}` with {m['params']:,} parameters ({m['layer_types'].count('linear_attention')} Gated "
        f"DeltaNet + {m['layer_types'].count('full_attention')} full-attention layers, hidden {c['hidden_size']}, "
        f"MLP {c['intermediate_size']}) and a byte-level BPE of {m['vocab_size']} tokens with the Qwen3.5 chat "
        f"template, pre-trained from scratch by `uturn testbed build --seed {card['seed']}`"
        f"{' (smoke build: barely trained)' if card.get('smoke') else ''}.",
        "",
        f"- Training: {c['steps']} steps x {c['tokens_per_step']} tokens (one conversation per row), lr {c['lr']} "
        f"(cosine), {d['train_conversations']:,} conversations ({d['train_tokens']:,} tokens), final loss "
        f"{card['final_loss']:.3f}.",
        "- World: arithmetic word problems (change, reading, walks, ages); second user turns in the mixture: "
        + ", ".join(f"{k} {v:,}" for k, v in d["train_kinds"].items()) + ".",
        f"- Built in {card['time_s']['build']:.0f} s in {card['dtype']} ({card['torch_threads']} threads, CPU "
        f"capability {card['cpu_capability']}), peak RSS {card['peak_rss_gb']:.2f} GB; weights sha256 "
        f"`{card['sha256']}`" + (f", installed from the shipped build in {card['installed']['time_s']:.0f} s"
                                  if card.get("installed") else "") + ".",
        f"- Files: `train.jsonl` (the mixture), `heldout.jsonl` ({d['heldout']} problems never trained on), "
        f"`heldout_triples.jsonl` (query, answer, real follow-up), `conversations.jsonl` ({d['conversations']} "
        "conversations with grounded follow-ups, for collaboration SFT).",
    ]
    if probe:
        lines += [
            "",
            f"## Probe (self setting, {probe['n_prompts']} held-out problems, greedy and T=1.0 x {probe['samples']})",
            "",
            "| accuracy | greedy follow-up rate | greedy grounded | T=1.0 follow-up rate | T=1.0 grounded |",
            "|---|---|---|---|---|",
            f"| {probe['accuracy']:.3f} | {probe['followup_rate_T0']:.3f} | {probe['grounded_followup_rate_T0']:.3f} "
            f"| {probe['followup_rate_T1']:.3f} | {probe['grounded_followup_rate_T1']:.3f} |",
        ]
    return "\n".join(lines) + "\n"

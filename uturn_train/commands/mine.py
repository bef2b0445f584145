"""`uturn mine`: on-policy preference pairs for the user turn, mined once to train several runs on
([`~uturn_train.training.mining`]).

    uturn mine --model testbed --mine_source testbed --mine_limit 256 --out pairs
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..io import ensure_writable_dir
from ..training.mining import MiningArguments
from . import MODEL_ALIASES, OUTPUT_ALIASES

logger = logging.getLogger(__name__)


@dataclass
class MineScriptArguments:
    """Arguments of `uturn mine` besides [`MiningArguments`].

    Args:
        model (`str`, *optional*, defaults to `"testbed"`): hub id or local path; `testbed` = the built-in model.
        out (`str`, *optional*, defaults to `"pairs"`): output folder (`save_to_disk` + `mining_card.json`).
    """

    model: str = field(default="testbed", metadata={
        "aliases": MODEL_ALIASES, "help": "Hub id or local path; `testbed` = the tiny model."})
    out: str = field(default="pairs", metadata={
        "aliases": OUTPUT_ALIASES, "help": "Output folder."})
    dtype: str = field(default="auto", metadata={"help": "auto (bf16 on GPU, fp32 on CPU), bfloat16, float32..."})


def run_mine_job(script_args: MineScriptArguments, args: MiningArguments) -> Path:
    import torch

    from ..models import load_model, load_tokenizer
    from ..training.mining import mine_pairs, mining_examples, save_pairs

    ensure_writable_dir(Path(script_args.out).expanduser().parent, "--out")
    examples = mining_examples(args)  # bad data fails before the model loads
    tokenizer = load_tokenizer(script_args.model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(script_args.model, dtype=script_args.dtype, device=device)
    pairs, card = mine_pairs(model, tokenizer, examples, args)
    out = save_pairs(pairs, {"model": script_args.model, **card}, script_args.out)
    logger.info("%d pairs (%s) from %d prompts in %.0f s -> %s", card["n_pairs"], card["kind"], card["n_prompts"],
                card["seconds"], out)
    return out


def make_parser():
    from trl import TrlParser

    return TrlParser((MineScriptArguments, MiningArguments), prog="uturn mine")


def main(argv: list[str]) -> None:
    from ..zoo import resolve

    script_args, mining_args = make_parser().parse_args_and_config(argv)
    resolve(script_args, mining_args)
    print(run_mine_job(script_args, mining_args))

"""`uturn`: the command line. Each command is a module of `uturn_train/commands/` with `make_parser()` and `main(argv)`;
this file only dispatches.

    uturn probe --model testbed --task testbed --limit 200 --temperatures 0 1.0 --samples 4 --out probe_out
    uturn classify --input turns.jsonl --output labelled.jsonl [--scorer smollm2-135m-instruct]
    uturn testbed build [--out DIR] [--force] [--seed N]
    uturn mine --model testbed --mine_source testbed --mine_limit 256 --out pairs
    uturn agreement --input labelled.jsonl [--judge_base_url URL --judge_model M] [--out DIR]
    uturn ablate --config recipes/testbed/ablation.yaml [--out DIR] [--dry_run] [--slurm]
    uturn report DIR [DIR...] [--out OUT] [--wandb]
    uturn validate --model testbed --task testbed [--limit N] [--samples K] [--out DIR]
    uturn collab --model testbed --task testbed [--partner oracle|self|MODEL] [--limit N] [--out DIR]
    uturn plan --config recipes/qwen3.5-2b/collab_dpo.yaml [--gpus 1 8] [--gpu_gb 24 80] [--max_length 512 ...]
"""

import importlib
import logging
import sys

from .commands import COMMANDS


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip())
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # it logs every server and judge request at INFO
    command = importlib.import_module(f"uturn_train.commands.{argv[0]}")  # only the command's own imports
    try:
        command.main(argv[1:])
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"uturn {argv[0]}: error: {e}", file=sys.stderr)
        sys.exit(2)

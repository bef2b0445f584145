"""`uturn`: the command line.

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

import argparse
import logging
import sys
from collections import Counter


def _probe(argv: list[str]) -> None:
    from trl import TrlParser

    from .probe.job import ProbeScriptArguments, run_probe_job
    from .probe.settings import ProbeSettings
    from .zoo import resolve

    parser = TrlParser((ProbeScriptArguments, ProbeSettings), prog="uturn probe")
    args, settings = parser.parse_args_and_config(argv)
    resolve(args, settings)
    run_probe_job(args, settings)


def classify_file(input_path: str, output_path: str, seed: int = 0, scorer: str | None = None) -> list[dict]:
    """Label every row (`query`, `answer`, `user_turn`, optional `finish_reason`) of a jsonl file; atomic output.

    Each row gains `label` and `reason`, and `grounded` and `mismatch_label` (see `probe/grounding.py`), the mismatched
    contexts drawn from the file's other rows with `seed`; both are null when the file holds one context only, where
    grounded is undefined. `scorer`, a model folder, must confirm each grounded turn (`probe/scorer.py`). Returns the
    labelled rows.
    """
    from pathlib import Path

    from .io import ensure_writable_dir, read_jsonl, write_jsonl
    from .probe.classify import Verdict, classify_turn
    from .probe.grounding import ground_rows
    from .probe.scorer import load_scorer

    if not Path(input_path).is_file():
        raise ValueError(f"--input {input_path} is not a file: pass a jsonl of rows with query, answer and user_turn")
    ensure_writable_dir(Path(output_path).parent, "--output's folder")
    scorer = load_scorer(scorer) if scorer else None  # outside the try below: its errors must not read as "undefined"
    rows = []
    for row in read_jsonl(input_path, ("query", "answer", "user_turn")):
        verdict = classify_turn(row["query"], row["answer"], row["user_turn"], row.get("finish_reason"))
        rows.append({**row, "label": verdict.label, "reason": verdict.reason})
    if not rows:
        raise ValueError(f"{input_path} holds no rows")
    try:
        groundings = ground_rows(rows, seed, verdicts=[Verdict(r["label"], r["reason"]) for r in rows], scorer=scorer)
    except ValueError as e:  # one context: nothing to mismatch it with, and grounded is undefined
        logging.getLogger(__name__).warning("%s: grounded is undefined (%s)", input_path, e)
        groundings = [None] * len(rows)
    for row, g in zip(rows, groundings):
        row["grounded"], row["mismatch_label"] = (g.grounded, g.mismatch_label) if g else (None, None)
    write_jsonl(output_path, rows)
    return rows


def _classify(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="uturn classify", description="Label user turns generated elsewhere.")
    parser.add_argument("--input", required=True, help="jsonl with query, answer, user_turn (finish_reason optional)")
    parser.add_argument("--output", required=True,
                        help="jsonl: the input rows plus label, reason, grounded and mismatch_label")
    parser.add_argument("--seed", type=int, default=0, help="seed pairing each context with another row's (grounded)")
    parser.add_argument("--scorer", help="a model that must confirm each grounded turn (smollm2-135m-instruct or a "
                        "folder; README: A real model)")
    args = parser.parse_args(argv)
    from .zoo import resolve

    resolve(args)
    rows = classify_file(args.input, args.output, seed=args.seed, scorer=args.scorer)
    n = len(rows)
    print(f"{n} turns -> {args.output}")
    for label, c in Counter(r["label"] for r in rows).most_common():
        print(f"  {label:<16} {c:>6}  {c / n:.3f}")
    if rows[0]["grounded"] is not None:
        grounded = sum(r["grounded"] for r in rows)
        print(f"  {'grounded':<16} {grounded:>6}  {grounded / n:.3f}  (grounded follow-ups, --seed {args.seed})")


def _testbed(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="uturn testbed", description="The tiny Qwen3.5 world, built offline.")
    sub = parser.add_subparsers(dest="action", required=True)
    build = sub.add_parser("build", help="pre-train the testbed model from scratch (minutes on a CPU)")
    build.add_argument("--out", default=None, help="target directory (default: $UTURN_HOME/testbed)")
    build.add_argument("--force", action="store_true", help="replace an existing build")
    build.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from .testbed import build_testbed

    print(build_testbed(args.out, force=args.force, seed=args.seed))


def _mine(argv: list[str]) -> None:
    from trl import TrlParser

    from .mining import MineScriptArguments, MiningArguments, run_mine_job
    from .zoo import resolve

    parser = TrlParser((MineScriptArguments, MiningArguments), prog="uturn mine")
    script_args, mining_args = parser.parse_args_and_config(argv)
    resolve(script_args, mining_args)
    print(run_mine_job(script_args, mining_args))


def _validate(argv: list[str]) -> None:
    from trl import TrlParser

    from .probe.validate import ValidateScriptArguments, ValidateSettings, run_validate_job
    from .zoo import resolve

    parser = TrlParser((ValidateScriptArguments, ValidateSettings), prog="uturn validate")
    args, settings = parser.parse_args_and_config(argv)
    resolve(args)
    if run_validate_job(args, settings.settings())["failed"]:
        sys.exit(1)


def _collab(argv: list[str]) -> None:
    from trl import TrlParser

    from .collab.dialogue import CollabSettings
    from .collab.job import CollabScriptArguments, run_collab_job
    from .zoo import resolve

    parser = TrlParser((CollabScriptArguments, CollabSettings), prog="uturn collab")
    args, settings = parser.parse_args_and_config(argv)
    resolve(args)
    run_collab_job(args, settings)


def _ablate(argv: list[str]) -> None:
    from .ablate import main

    main(argv)


def _report(argv: list[str]) -> None:
    from .report import main

    main(argv)


def _plan(argv: list[str]) -> None:
    from .plan import run_plan

    run_plan(argv)


def _agreement(argv: list[str]) -> None:
    from .probe.agreement import main as agreement_main

    agreement_main(argv)


COMMANDS = {"probe": _probe, "classify": _classify, "testbed": _testbed, "mine": _mine, "agreement": _agreement,
            "ablate": _ablate, "report": _report, "validate": _validate, "plan": _plan, "collab": _collab}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip())
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # it logs every server and judge request at INFO
    try:
        COMMANDS[argv[0]](argv[1:])
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"uturn {argv[0]}: error: {e}", file=sys.stderr)
        sys.exit(2)

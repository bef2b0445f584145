"""`uturn agreement`: the rules (and an LLM judge) against reference labels from people or another judge.

    uturn agreement --input labelled.jsonl [--judge_base_url URL --judge_model M] [--out DIR]

Per labeler: per-label precision, recall and F1, the confusion matrix, accuracy and Cohen's kappa
([`~uturn_train.probe.validity.agreement`]).
"""

import argparse
from pathlib import Path

from ..probe.validity.agreement import markdown, run_agreement
from . import OUTPUT_ALIASES, dashed_aliases, parse_args


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="uturn agreement", description="How well the rules (and an LLM judge) agree "
                                     "with reference labels.")
    parser.add_argument("--input", required=True, help="jsonl with query, answer, user_turn and a reference label")
    parser.add_argument("--out", OUTPUT_ALIASES[0], dest="out",
                        default="uturn_agreement", help="output directory")
    parser.add_argument("--judge_base_url", default=None, help="OpenAI-compatible API root of an LLM judge")
    parser.add_argument("--judge_model", default=None, help="the judge model's name")
    parser.add_argument("--judge_api_key_env", default="OPENAI_API_KEY", help="env variable holding the judge's key")
    parser.add_argument("--judge_cache_dir", default=None, help="judge verdict cache (default $UTURN_HOME/judge_cache)")
    parser.add_argument("--judge_concurrency", "--concurrency", dest="judge_concurrency", type=int, default=4,
                        help="judge requests in flight (as in `uturn probe`; --concurrency: its old name)")
    return dashed_aliases(parser)


def main(argv: list[str]) -> None:
    args = parse_args(make_parser(), argv)
    judge = None
    if (args.judge_base_url is None) != (args.judge_model is None):
        raise ValueError("pass both --judge_base_url and --judge_model, or neither")
    if args.judge_base_url is not None:
        from ..probe.labelers.llm_judge import Judge

        judge = Judge(args.judge_base_url, args.judge_model, api_key_env=args.judge_api_key_env,
                      cache_dir=args.judge_cache_dir, concurrency=args.judge_concurrency)
    report = run_agreement(args.input, args.out, judge=judge)
    print(markdown(report))
    print(f"wrote {Path(args.out) / 'agreement.json'} and {Path(args.out) / 'disagreements.jsonl'}")

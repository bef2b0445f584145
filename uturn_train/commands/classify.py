"""`uturn classify`: label user turns generated elsewhere (vLLM, an API), with the grounded decision.

    uturn classify --input turns.jsonl --output labelled.jsonl --seed 0   # rows with query, answer, user_turn
    uturn classify --input turns.jsonl --output labelled.jsonl --labeler trained   # the trained judge decides
"""

import argparse
import logging
from collections import Counter
from pathlib import Path

from . import dashed_aliases, parse_args


def classify_file(input_path: str, output_path: str, seed: int = 0, scorer: str | None = None,
                  judge=None) -> list[dict]:
    """Label every row (`query`, `answer`, `user_turn`, optional `finish_reason`) of a jsonl file; atomic output.

    Each row gains `label` and `reason`, and `grounded` and `mismatch_label` (see `probe/rules/grounding.py`), the
    mismatched contexts drawn from the file's other rows with `seed`; both are null when the file holds one context
    only, where grounded is undefined. `scorer`, a model folder, must confirm each grounded turn
    (`probe/labelers/scorer.py`). With `judge`, a trained [`~uturn_train.probe.labelers.judge.Judge`], `label` and
    `grounded` are the judge's (read against the same mismatched contexts) and the rules' stay as `rules_label` and
    `rules_grounded`. Returns the labelled rows.
    """
    from ..io import ensure_writable_dir, read_jsonl, write_jsonl
    from ..probe.labelers.scorer import load_scorer
    from ..probe.rules.classify import Verdict, classify_turn
    from ..probe.rules.grounding import ground_rows

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
    if judge is not None:
        _judge_rows(rows, judge, seed, defined=groundings[0] is not None)
    write_jsonl(output_path, rows)
    return rows


def _judge_rows(rows: list[dict], judge, seed: int, defined: bool) -> None:
    """The trained judge's verdicts, each context mismatched with the one `ground_rows` pairs it with."""
    from tqdm.auto import tqdm

    from ..probe.rules.grounding import derangement

    contexts = list(dict.fromkeys((r["query"], r["answer"]) for r in rows))
    # One context only: the judge reads its own as the mismatched one, and grounded stays undefined.
    pairs = zip(contexts, (contexts[j] for j in derangement(len(contexts), seed)) if defined else contexts)
    other = dict(pairs)
    items = []
    for r in rows:
        other_query, other_answer = other[r["query"], r["answer"]]
        items.append({**r, "other_query": other_query, "other_answer": other_answer})
    with tqdm(total=4 * len(items), desc="trained judge", unit="turn-context") as progress:
        verdicts = judge.label(items, progress)
    for row, v in zip(rows, verdicts):
        row.update(rules_label=row["label"], rules_grounded=row["grounded"], label=v.label,
                   reason=v.reason,
                   grounded=v.grounded if defined else None)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="uturn classify", description="Label user turns generated elsewhere.")
    parser.add_argument("--input", required=True, help="jsonl with query, answer, user_turn (finish_reason optional)")
    parser.add_argument("--output", required=True,
                        help="jsonl: the input rows plus label, reason, grounded and mismatch_label")
    parser.add_argument("--seed", type=int, default=0, help="seed pairing each context with another row's (grounded)")
    parser.add_argument("--labeler", choices=["rules", "trained"], default="rules",
                        help="who decides: the rules, or the trained judge (uturn-judge-v5; the rules ride along)")
    parser.add_argument("--scorer", help="a model that must confirm each grounded turn (smollm2-135m-instruct or a "
                        "folder; docs/probe.md: A real model)")
    return dashed_aliases(parser)


def main(argv: list[str]) -> None:
    from ..zoo import resolve

    args = parse_args(make_parser(), argv)
    resolve(args)
    judge = None
    if args.labeler == "trained":
        from ..probe.labelers.judge import load_judge

        judge = load_judge()
    rows = classify_file(args.input, args.output, seed=args.seed, scorer=args.scorer, judge=judge)
    n = len(rows)
    print(f"{n} turns -> {args.output}")
    for label, c in Counter(r["label"] for r in rows).most_common():
        print(f"  {label:<16} {c:>6}  {c / n:.3f}")
    if rows[0]["grounded"] is not None:
        grounded = sum(r["grounded"] for r in rows)
        print(f"  {'grounded':<16} {grounded:>6}  {grounded / n:.3f}  (grounded follow-ups, --seed {args.seed})")

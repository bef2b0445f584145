"""How well `classify_turn` labels real users' next turns, per source: precision, recall and F1 of every label.

```bash
python eval/classifier_validity.py                      # the per-source table
python eval/classifier_validity.py --errors dev         # also list the dev half's mistakes (never the test half's)
```

Sources, all read from `../shared/data` (its README), never copied:
- **OASST dev / OASST test**: every real next user turn after a real assistant answer of the OASST trees, with the
  label a person gave it by reading it (`tests/data/oasst_next_turn_labels.jsonl`, rubric in `tests/data/README.md`).
  The trees are split in halves by a hash of their id: rules were changed looking at the dev half only.
- **MT-Bench**: the 80 expert-written second turns, follow-ups by construction, after turn 1 with no answer. Test only.
- **constructed dev / test**: negatives built by code from the same half's conversations: a sibling answer of the
  same query pasted as the user turn (identity_drift), the query or the answer repeated, verbatim or with small slips
  (repetition), another tree's opening query or the next GSM8K problem (new_topic), whitespace and special tokens
  (empty), loops, token salad, keyboard mash, symbol and number streams (degenerate).

*test* pools OASST test, MT-Bench and constructed test: the set the acceptance test (`tests/probe/test_classify.py`)
holds to F1 >= 0.90 on follow-ups and >= 0.85 on every other label with at least 20 gold turns.

A second table gives grounded follow-up rates (`uturn_train/probe/rules/grounding.py`): real users' follow-ups in
their own conversations, `GENERIC_QUESTIONS` after real conversations, and on arithmetic (GSM8K problems and their
worked solutions) questions that name the answer's own number or change the query's own quantity, next to generic ones.

The code lives in `uturn_train/probe/validity/human_turns.py`; this script prints its tables.
"""

import argparse
from pathlib import Path

from uturn_train.probe.validity.human_turns import (
    SHARED_DATA,
    classify_turn,
    grounded_rates,
    scorer_rates,
    scores,
    sources,
    table,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared_data", type=Path, default=SHARED_DATA)
    parser.add_argument("--errors", choices=["dev"], help="print the mistakes on the dev half (OASST + constructed)")
    parser.add_argument("--scorer", help="also the OASST rates with this scorer confirming grounded turns "
                        "(smollm2-135m-instruct or a folder)")
    args = parser.parse_args()
    if not (args.shared_data / "README.md").exists():
        raise SystemExit(f"real data not found at {args.shared_data}: pass --shared_data (see its README)")
    by_source = sources(args.shared_data)
    print(table(by_source))
    print("\n| grounded follow-up rate of | rate |\n|---|---|")
    rates = grounded_rates(args.shared_data)
    if args.scorer:
        from uturn_train.probe.labelers.scorer import load_scorer
        from uturn_train.zoo import resolve

        resolve(args)
        rates |= scorer_rates(load_scorer(args.scorer), args.shared_data)
    for name, rate in rates.items():
        print(f"| {name} | {rate:.3f} |")
    if args.errors:
        for item, predicted in scores(by_source["OASST dev"] + by_source["constructed dev"])["errors"]:
            reason = classify_turn(item.query, item.answer, item.turn).reason
            print(f"\n[{item.gold} -> {predicted}] {item.id}: {reason}\nQ: {item.query[:200]!r}\n"
                  f"A: ...{item.answer[-300:]!r}\nU: {item.turn[:400]!r}")


if __name__ == "__main__":
    main()

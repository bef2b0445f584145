"""How well the probe labels a real chat model's user turns, against labels given by reading them.

```bash
python eval/real_model_validity.py                         # the trained judge on the test split (`uturn judge eval`)
python eval/real_model_validity.py --rules                 # the rules on SmolLM2's turns: per-source table, rates
python eval/real_model_validity.py --rules --errors dev    # also list the dev split's mistakes (never the test's)
```

By default it prints the trained judge's table over every turn labelled by reading, test split, per source and task x
temperature, beside the rules and two smaller fits, the second reader's agreement and the learning curve (the probe's
default decision on real models; `uturn_train/probe/labelers/judge_v5.md`). With `--rules`: the turns are
SmolLM2-135M-Instruct's (`tests/data/smollm2_turns.jsonl`, rubric and split in `tests/data/README.md`):
GSM8K, MT-Bench and IFEval in the self setting, OASST in the heldout setting, greedy and T=1.0. Queries (and OASST's
real answers) are joined by id from `../shared/data`, never stored. The grounded decision runs as the probe runs it:
per task and temperature, each prompt's mismatched context another prompt's, paired with seed 0.

The code lives in `uturn_train/probe/validity/model_turns.py`; this script prints its tables.
"""

import argparse
import time
from pathlib import Path

from uturn_train.probe.validity.model_turns import LABELS_FILE, SHARED_DATA, load, predict, rates, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared_data", type=Path, default=SHARED_DATA)
    parser.add_argument("--labels", type=Path, default=LABELS_FILE)
    parser.add_argument("--rules", action="store_true", help="the rules' table on SmolLM2's turns instead")
    parser.add_argument("--out", default="outputs/judge", help="where the judge's table is written too")
    parser.add_argument("--errors", choices=["dev"], help="with --rules: print the dev split's mistakes")
    parser.add_argument("--scorer", help="confirm grounded turns with this scorer model (smollm2-135m-instruct or a "
                        "folder), as `uturn probe --scorer` does")
    args = parser.parse_args()
    if not (args.shared_data / "README.md").exists():
        raise SystemExit(f"real data not found at {args.shared_data}: pass --shared_data (see its README)")
    if not args.rules:
        from uturn_train.commands.judge import main as judge

        judge(["eval", "--shared_data", str(args.shared_data), "--out", args.out])
        return
    rows = load(args.shared_data, args.labels)
    scorer = None
    if args.scorer:
        import torch

        from uturn_train.probe.labelers.scorer import load_scorer
        from uturn_train.zoo import resolve

        resolve(args)
        scorer = load_scorer(args.scorer)
        print(f"scorer {args.scorer}: min_gain {scorer.min_gain}, max_nll {scorer.max_nll}, "
              f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    start = time.perf_counter()
    predict(rows, scorer=scorer)
    seconds = time.perf_counter() - start
    print(table(rows))
    print("\n| turns | n | follow-up read | probe | grounded read | probe |\n|---|---|---|---|---|---|")
    for name, r in (rates(rows) | rates(rows, "test")).items():
        print(f"| {name} | {r['n']} | {r['followup (read)']:.3f} | {r['followup (probe)']:.3f} | "
              f"{r['grounded (read)']:.3f} | {r['grounded (probe)']:.3f} |")
    if args.errors:
        for r in rows:
            wrong = r["label"] != r["predicted"] or bool(r["grounded"]) != bool(r["predicted_grounded"])
            if r["split"] == "dev" and wrong:
                print(f"\n[{r['label']}{'+g' if r['grounded'] else ''} -> {r['predicted']}"
                      f"{'+g' if r['predicted_grounded'] else ''}] {r['row']}: {r['reason']} / {r['grounded_reason']}"
                      f"\nQ: {r['query'][-300:]!r}\nA: {r['answer'][:300]!r}...\nU: {r['user_turn'][:300]!r}"
                      + (f"\nnote: {r['note']}" if r.get("note") else ""))
    print(f"\n{len(rows)} turns labelled in {seconds:.1f} s ({1000 * seconds / len(rows):.0f} s per 1,000)"
          + (f"; the scorer read {scorer.scored} rule-grounded turns" if scorer else ""))


if __name__ == "__main__":
    main()

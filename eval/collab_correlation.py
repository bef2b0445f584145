"""Does the probe predict collaboration? Rank correlation between collaboration success and the probe's rates.

Reads an ablation trained with `--probe_collab` (every checkpoint probed *and* holding collaboration conversations,
`recipes/testbed/ablation.yaml`) and relates, over all checkpoints of all runs and seeds, each family's success rate
to (a) the greedy grounded follow-up rate, (b) the T=1.0 grounded rate and (c) accuracy: Spearman's rho with a
bootstrap 95% interval that resamples whole runs (a run's checkpoints are not independent), and rho within each seed.

```bash
uturn ablate --config recipes/testbed/ablation.yaml --out outputs/ablations/testbed-collab
python eval/collab_correlation.py outputs/ablations/testbed-collab --out outputs/collab_correlation
python eval/collab_correlation.py outputs/ablations/testbed-collab --relabel --out outputs/collab_correlation-relabel
```

`--relabel` labels the stored user turns (`probe/step_<N>.jsonl`) again with this version's rules and reads the
grounded rates from those labels: after a fix of the classifier, the same checkpoints and conversations, measured
again, without training anything again.

Writes `correlation.json`, `correlation.md` (the table) and `correlation.png` (the scatter plots).

The code lives in `uturn_train/experiments/correlation.py`; this script writes its outputs.
"""

import argparse

from uturn_train.experiments.correlation import markdown, write_correlation


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", help="ablation folders (or run folders) trained with --probe_collab")
    parser.add_argument("--out", default="outputs/collab_correlation", help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--relabel", action="store_true",
                        help="grounded rates from the stored user turns labelled again with this version's rules")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = make_parser().parse_args(argv)
    rows = write_correlation(args.dirs, args.out, relabel=args.relabel, seed=args.seed)
    print(markdown(rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""`uturn report`: training runs side by side ([`~uturn_train.experiments.report`] says what it reads and writes).

    uturn report outputs/ablations/testbed                      # an ablation folder (`uturn ablate --out`)
    uturn report outputs/sft-user outputs/dpo --out outputs/cmp  # run folders (a recipe's --output_dir)
"""

import argparse
from pathlib import Path

from ..experiments.report import write_report
from . import OUTPUT_ALIASES, dashed_aliases, parse_args


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="uturn report", description="Training runs side by side: follow-up and "
                                     "grounded follow-up rates against accuracy.")
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run folders or ablation folders")
    parser.add_argument("--out", OUTPUT_ALIASES[0], dest="out",
                        default=None, help="output folder (default: DIR, when one is given)")
    parser.add_argument("--wandb", action="store_true", help="log the tables and the plot to W&B (offline unless "
                        "logged in); done anyway when a W&B run is active")
    parser.add_argument("--max_accuracy_drop", type=float, default=0.05,
                        help="the best checkpoint loses at most this much accuracy against step 0")
    return dashed_aliases(parser)


def main(argv: list[str]) -> None:
    args = parse_args(make_parser(), argv)
    if args.out is None and len(args.dirs) > 1:
        raise ValueError("several DIRs given: pass --out for the report")
    out = Path(args.out or args.dirs[0])
    report = write_report(args.dirs, out, max_accuracy_drop=args.max_accuracy_drop, wandb=args.wandb)
    print((out / "report.md").read_text(encoding="utf-8"))
    print(f"{len(report['runs'])} runs -> {out / 'report.md'}, {out / 'report.json'}"
          + (f", {out / 'pareto.png'}" if report["pareto_front"] is not None else ""))

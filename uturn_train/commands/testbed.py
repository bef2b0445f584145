"""`uturn testbed build`: pre-train the project's tiny Qwen3.5 world from scratch (minutes on a CPU).

    uturn testbed build [--out DIR] [--force] [--seed N]

Not needed to use the testbed: the first command that names it installs the shipped seed-0 build (seconds). A build
says whether its weights are the shipped file: on the CPU that built them, seed 0 gives the same bytes; another CPU's
kernels give another model, as another seed would.
"""

import argparse

from . import OUTPUT_ALIASES, dashed_aliases, parse_args


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="uturn testbed", description="The tiny Qwen3.5 world, built offline.")
    sub = parser.add_subparsers(dest="action", required=True)
    build = sub.add_parser("build", help="pre-train the testbed model from scratch (minutes on a CPU)")
    build.add_argument("--out", OUTPUT_ALIASES[0], dest="out",
                        default=None, help="target directory (default: $UTURN_HOME/testbed)")
    build.add_argument("--force", action="store_true", help="replace an existing build")
    build.add_argument("--seed", type=int, default=0)
    return dashed_aliases(parser)


def main(argv: list[str]) -> None:
    import json

    from ..testbed import build_testbed
    from ..testbed.build import SHIPPED_SHA256

    args = parse_args(make_parser(), argv)
    out = build_testbed(args.out, force=args.force, seed=args.seed)
    card = json.loads((out / "card.json").read_text())
    same = "the same file as" if card["sha256"] == SHIPPED_SHA256 else "not"
    print(f"{out}: weights sha256 {card['sha256']}, {same} the shipped seed-0 build's (CPU {card['cpu_capability']})")

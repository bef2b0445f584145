"""`uturn testbed build`: pre-train the project's tiny Qwen3.5 world from scratch (minutes on a CPU).

    uturn testbed build [--out DIR] [--force] [--seed N]
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
    from ..testbed import build_testbed

    args = parse_args(make_parser(), argv)
    print(build_testbed(args.out, force=args.force, seed=args.seed))

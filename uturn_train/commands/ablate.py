"""`uturn ablate`: post-training objectives side by side, each on several seeds, one run after another (or several at
once, or a SLURM array), then the report ([`~uturn_train.experiments.ablate`] describes the ablation file and what it
writes).

    uturn ablate --config recipes/testbed/ablation.yaml                 # runs here, then `uturn report` on --out
    uturn ablate --config recipes/testbed/ablation.yaml --jobs 2        # 2 runs at once, each with half the cores
    uturn ablate --config recipes/testbed/ablation.yaml --dry_run       # prints the commands, runs nothing
    uturn ablate --config recipes/qwen3.5-2b/ablation.yaml --slurm      # writes an sbatch array script
"""

import argparse
import sys

from ..experiments.ablate import count_runs, finished_runs, load_ablation, run_ablation, shell_command, write_sbatch
from . import OUTPUT_ALIASES, dashed_aliases


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="uturn ablate", description="Post-training objectives side by side, each on "
                                     "several seeds, then the report.")
    parser.add_argument("--config", required=True, help="the ablation file (e.g. recipes/testbed/ablation.yaml)")
    parser.add_argument("--out", OUTPUT_ALIASES[0], dest="out",
                        default=None, help="output folder (default: outputs/ablations/<name>)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    mode.add_argument("--slurm", action="store_true", help="write an sbatch array script (one task per run)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="runs at once (default 1), each with its "
                        "share of the machine: cores / N threads on a CPU, its own GPUs otherwise (the accelerate "
                        "config's num_processes each); the file's `start_first` runs start first")
    parser.add_argument("--only", default=None, metavar="NAME", help="run only this (run, seed) (what each array "
                        "task does), or every seed of this run")
    return dashed_aliases(parser)


def main(argv: list[str]) -> None:
    args = make_parser().parse_args(argv)
    spec, runs, out = load_ablation(args.config, args.out)
    if args.only is not None and args.only not in {n for r in runs for n in (r.name, r.variant)}:
        raise ValueError(f"--only {args.only}: no such run in {args.config}; runs: {[r.name for r in runs]}")
    if args.dry_run:
        print(f"# {spec['name']}: {count_runs(runs)} -> {out} (W&B group {spec['name']})")
        finished = finished_runs(runs, out)
        for k, run in enumerate(runs, 1):
            seed = "" if run.seed is None else f" (run {run.variant}, seed {run.seed})"
            done = " (finished before: would be skipped)" if run.name in finished else ""
            print(f"# [{k}/{len(runs)}] {run.name}{seed}{done}\n{shell_command(run)}")
        return
    if args.slurm and args.jobs != 1:
        raise ValueError("--jobs runs several runs at once here; a SLURM array (--slurm) runs each as its own task")
    if args.slurm:
        script = write_sbatch(spec, runs, out, args.config)
        print(f"{script}: {len(runs)} array tasks, one per (run, seed). Submit from this directory, the report "
              "after the last task:\n"
              f"  jid=$(sbatch --parsable {script}) && sbatch --dependency=afterany:$jid --wrap 'uturn report {out}'")
        return
    try:
        statuses = run_ablation(spec, runs, out, only=args.only, jobs=args.jobs)
    except KeyboardInterrupt:
        sys.exit(130)
    failed = {n: s for n, s in statuses.items() if s.startswith("failed")}
    print(f"{spec['name']}: " + ", ".join(f"{n} {s}" for n, s in statuses.items()))
    if args.only is None:
        from ..experiments.report import write_report

        try:
            write_report([out], out)
            print(f"report: {out / 'report.md'}")
        except ValueError as e:  # e.g. every run failed before its first probe
            print(f"no report: {e}")
    if failed:
        sys.exit(1)

"""Throughput of `uturn ablate --jobs` on a CPU, measured side by side (not part of the tests).

    python tests/benchmarks/bench_ablate_jobs.py [--max_steps 40] [--jobs 2]

Two short runs of the testbed's collaboration objective (recipes/testbed/collab_objective.yaml, `--max_steps` steps,
no probe at step 0, a small one at the end), three ways: one after the other with every core (what `--jobs 1` does),
`--jobs` at once with an equal share of the cores each (`OMP_NUM_THREADS`, what `--jobs N` does), and at once with
every core each (oversubscribed, what running two ablations side by side does). Prints each way's wall seconds and its
throughput against the first (`speedup=X`), with torch's CPU capability. The runs of one seed train alike whatever the
thread count on one machine (checked here: their logged losses are compared).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start(out: Path, threads: int, max_steps: int) -> subprocess.Popen:
    cmd = [sys.executable, "recipes/collab_grpo.py", "--config", "recipes/testbed/collab_objective.yaml",
           "--output_dir", str(out), "--max_steps", str(max_steps), "--save_steps", "100000", "--probe_at_start",
           "false", "--report_to", "none", "--probe_limit", "20", "--probe_collab_limit", "5"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    with open(f"{out}.log", "w") as log:  # the child writes to its own copy of the file
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def timed(runs: list[tuple[Path, int]], max_steps: int, at_once: bool) -> float:
    began = time.perf_counter()
    if at_once:
        procs = [start(out, threads, max_steps) for out, threads in runs]
    else:
        procs = []
        for out, threads in runs:
            procs.append(start(out, threads, max_steps))
            procs[-1].wait()  # one after the other
    for (out, _), proc in zip(runs, procs):
        if proc.wait() != 0:
            raise SystemExit(f"{out} failed; see {out}.log")
    return time.perf_counter() - began


def losses(out: Path) -> list[str]:
    return re.findall(r"'loss': '?([-0-9.e]+)", Path(f"{out}.log").read_text().replace("\r", "\n"))


def main():
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_steps", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores, CPU capability {torch.backends.cpu.get_cpu_capability()}, {args.jobs} runs of "
          f"{args.max_steps} steps each way", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        ways = {"one after the other, every core each": ([cores] * args.jobs, False),
                f"{args.jobs} at once, {cores // args.jobs} core(s) each (--jobs {args.jobs})":
                    ([max(cores // args.jobs, 1)] * args.jobs, True),
                f"{args.jobs} at once, every core each (oversubscribed)": ([cores] * args.jobs, True)}
        seconds, outs = {}, {}
        for k, (way, (threads, at_once)) in enumerate(ways.items()):
            outs[way] = [Path(tmp) / f"way{k}-run{i}" for i in range(args.jobs)]
            seconds[way] = timed(list(zip(outs[way], threads)), args.max_steps, at_once)
            print(f"{way}: {seconds[way]:.1f} s", flush=True)
        first = next(iter(seconds))
        for way, s in seconds.items():
            print(f"{way}: speedup={seconds[first] / s:.2f}")
        if not losses(outs[first][0]):
            raise SystemExit(f"no logged loss in {outs[first][0]}.log: raise --max_steps above logging_steps (5)")
        same = {way: losses(o[0]) == losses(outs[first][0]) for way, o in outs.items()}
        print(f"same logged losses as with every core: {same}")


if __name__ == "__main__":
    main()

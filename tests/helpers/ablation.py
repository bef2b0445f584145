"""Pieces the tests of `uturn ablate` share (tests/experiments/test_ablate*.py): an ablation file, a recipe that sleeps
with a grandchild, and waiting for, checking and cleaning up the processes an ablation started."""

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import yaml

from . import ROOT

SFT = str(ROOT / "recipes" / "testbed" / "collab_sft.yaml")


def write_ablation(tmp_path: Path, runs: list[dict], common: dict | None = None, **fields) -> Path:
    spec = {"name": "tiny-ablation", "accelerate_config": str(ROOT / "accelerate_configs" / "cpu.yaml"),
            "tags": ["test"], "overrides": common or {}, "runs": runs, **fields}
    path = tmp_path / "ablation.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen, log: Path):
    deadline = time.time() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"ablate exited ({proc.returncode}) before {what}:\n{log.read_text()}")
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()}")
        time.sleep(0.5)


def kill_leftovers(proc: subprocess.Popen, log: Path) -> None:
    """After a failed check: ablate and every run it started, so that a failing test leaves nothing running."""
    for pgid in [proc.pid, *map(int, re.findall(r"running \(pid (\d+)\)", log.read_text()))]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def group_alive(pgid: int, grace: float = 30.0) -> bool:
    """Whether a live (not zombie) process of group `pgid` is still left after `grace` seconds; orphans may wait as
    zombies for a PID 1 that does not reap them. SIGKILL is asynchronous: a killed training process can take seconds
    to free its memory and exit on a loaded machine (one such failure seen with 3 jobs on 2 cores)."""
    deadline = time.time() + grace
    while True:
        alive = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # the process ended meanwhile
                continue
            alive = alive or (int(fields[2]) == pgid and fields[0] not in "ZX")
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.5)


SLEEPER = """import argparse, subprocess, time
from pathlib import Path


def make_parser():
    parser = argparse.ArgumentParser()
    for flag in ("--config", "--output_dir", "--run_name", "--steps"):
        parser.add_argument(flag)
    return parser


if __name__ == "__main__":
    args = make_parser().parse_args()
    Path(args.output_dir, "grandchild.pid").write_text(str(subprocess.Popen(["sleep", "300"]).pid))
    time.sleep(300)
"""

"""`uturn ablate`: post-training objectives side by side, each on several seeds, one run after another (or a SLURM
array), then the report.

    uturn ablate --config recipes/testbed/ablation.yaml                 # runs here, then `uturn report` on --out
    uturn ablate --config recipes/testbed/ablation.yaml --dry_run       # prints the commands, runs nothing
    uturn ablate --config recipes/qwen3.5-2b/ablation.yaml --slurm      # writes an sbatch array script

The ablation file (paths relative to the directory you run from, like the recipes' own YAML files):

    name: testbed-objectives          # W&B group (WANDB_RUN_GROUP); --out defaults to outputs/ablations/<name>
    accelerate_config: accelerate_configs/cpu.yaml   # `accelerate launch --config_file` of every run (one machine)
    tags: [testbed]                   # optional: W&B tags of every run (WANDB_TAGS)
    seeds: [0, 1, 2]                  # optional: every run once per seed (`--seed N`), the probe's prompts fixed
    overrides: {probe_limit: 100}     # optional: flags of every run, before each run's own
    runs:
      - recipe: collab_sft            # recipes/<recipe>.py
        config: recipes/testbed/collab_sft.yaml
        overrides: {loss_scope: user} # optional: the recipe's flags without `--`; a list gives several values
        seeds: [0, 1]                 # optional: this run's seeds instead of the file's
        name: sft-user                # optional; derived otherwise: collab_sft-loss_scope-user
        tags: [sft]                   # optional: more W&B tags

Every (run, seed) is `accelerate launch --config_file <accelerate_config> recipes/<recipe>.py --config <config>
--output_dir <out>/<name> --run_name <name> <overrides> --seed <seed>`, named `<run>-seed<seed>` (the run's name
alone without seeds), logged to `<out>/<name>/train.log`; when it exits, the marker `<out>/<name>/ablation_run.json`
(command, exit code, times) is written atomically. A rerun skips the runs whose marker has exit code 0 and starts the
others over, their earlier folder moved to `<out>/.partial/` (never resumed: the probe history is appended to, and DPO
mines before training). Ctrl-C or SIGTERM stops the run's process group and writes no marker. Bad files, and finished
runs whose command the file has changed since, fail before anything runs. More in docs/ablations.md.
"""
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import yaml

from ..io import atomic_open, ensure_writable_dir, write_json
from .ablation_file import Run, load_ablation
from .layout import LOG, MARKER, PLAN

__all__ = ["Run", "count_runs", "finished_runs", "launch", "load_ablation", "run_ablation", "shell_command",
           "write_sbatch"]



def count_runs(runs: list[Run]) -> str:
    variants = {r.variant for r in runs}
    return f"{len(runs)} runs" + (f" ((run, seed) pairs of {len(variants)} runs)" if len(variants) < len(runs) else "")


def shell_command(run: Run) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in run.env.items()) + " " + shlex.join(run.command)


def _write_plan(spec: dict, runs: list[Run], out: Path) -> None:
    """`<out>/ablation.json`: every run of the file, so the report knows runs that never finished."""
    ensure_writable_dir(out)
    write_json(out / PLAN, {"name": spec["name"], "accelerate_config": spec["accelerate_config"],
                            "runs": [{**asdict(r), "command": shell_command(r)} for r in runs]})


def finished_runs(runs: list[Run], out: Path) -> dict[str, dict]:
    """The markers of the runs that finished (exit code 0), by name; a run that finished with another command (the
    file was edited since) fails here rather than being skipped as if it were this one."""
    finished, changed = {}, []
    for run in runs:
        path = out / run.name / MARKER
        marker = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
        if marker is not None and marker["exit_code"] == 0:
            finished[run.name] = marker
            if marker["command"] != shell_command(run):
                changed.append(f"{run.name}: ran `{marker['command']}`, now `{shell_command(run)}`")
    if changed:
        raise ValueError(f"{out}: runs finished there with other settings, so skipping them would report the old "
                         "ones; pass another --out, or move those run folders away:\n  " + "\n  ".join(changed))
    return finished


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C for the run's whole process group (accelerate and its workers), then SIGKILL for what is left."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (kill, scancel) stops the run like Ctrl-C does


def launch(run: Run, folder: Path, position: str) -> dict:
    """Run one training in its own process group, log to `folder/train.log`, write the marker when it exits.

    Returns:
        `dict`: the marker. A KeyboardInterrupt stops the run's processes and leaves no marker.
    """
    argv = [sys.executable, "-m", "accelerate.commands.launch", *run.command[2:]]  # this environment's accelerate
    started = time.time()
    with open(folder / LOG, "wb") as log:
        # A session of its own: the terminal's Ctrl-C reaches only us, and we stop the whole group.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **run.env},
                                start_new_session=True)
        print(f"{position} {run.name}: running (pid {proc.pid}), log {folder / LOG}", flush=True)
        try:
            exit_code = proc.wait()
        except KeyboardInterrupt:
            _stop(proc)
            raise
    finished = time.time()
    marker = {**asdict(run), "command": shell_command(run), "exit_code": exit_code,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
              "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(finished)),
              "wall_seconds": round(finished - started, 1), "host": socket.gethostname(), "log": LOG}
    write_json(folder / MARKER, marker)
    return marker


def run_ablation(spec: dict, runs: list[Run], out: Path, only: str | None = None) -> dict[str, str]:
    """Run the runs that have not finished yet, one after another; see the module docstring. `only`: one run's name,
    or a variant's (all its seeds).

    Returns:
        `dict[str, str]`: per run, `done`, `skipped` (finished before) or `failed (exit N)`.
    """
    selected = [r for r in runs if only in (None, r.name, r.variant)]
    finished = finished_runs(selected, out)
    _write_plan(spec, runs, out)
    statuses = {}
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for k, run in enumerate(selected, 1):
            position, folder = f"[{k}/{len(selected)}]", out / run.name
            marker = finished.get(run.name)
            if marker is not None:
                print(f"{position} {run.name}: finished before ({marker['wall_seconds']:.0f} s), skipped")
                statuses[run.name] = "skipped"
                continue
            if folder.exists():
                aside = out / ".partial" / f"{run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
                aside.parent.mkdir(exist_ok=True)
                os.replace(folder, aside)
                print(f"{position} {run.name}: an earlier attempt did not finish; its folder moved to {aside}")
            folder.mkdir(parents=True)
            try:
                marker = launch(run, folder, position)
            except KeyboardInterrupt:
                print(f"{position} {run.name}: interrupted; its processes were stopped and no marker written, so a "
                      "rerun starts it over", flush=True)
                raise
            if marker["exit_code"] == 0:
                statuses[run.name] = "done"
                print(f"{position} {run.name}: done in {marker['wall_seconds']:.0f} s", flush=True)
            else:
                statuses[run.name] = f"failed (exit {marker['exit_code']})"
                tail = (folder / LOG).read_text(encoding="utf-8", errors="replace").splitlines()[-20:]
                print(f"{position} {run.name}: FAILED (exit {marker['exit_code']}) after {marker['wall_seconds']:.0f} "
                      f"s; the others go on. Last lines of {folder / LOG}:\n" + "\n".join(f"    {t}" for t in tail),
                      flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return statuses


def write_sbatch(spec: dict, runs: list[Run], out: Path, config: str) -> Path:
    """An sbatch array script, one task per (run, seed), each task `uturn ablate --only <run>-seed<N>` on one node."""
    accelerate = yaml.safe_load(Path(spec["accelerate_config"]).read_text(encoding="utf-8"))
    gpus = 0 if accelerate.get("use_cpu") else int(accelerate.get("num_processes", 1))
    script = out / "ablation.sbatch"
    lines = [
        "#!/bin/bash",
        f"# uturn ablate `{spec['name']}`: {count_runs(runs)}, one array task each, from {config}.",
        "# Submit from the repository root; the report follows once every task has ended:",
        f"#   jid=$(sbatch --parsable {script}) && sbatch --dependency=afterany:$jid --wrap 'uturn report {out}'",
        "# A task whose run finished before (its marker) does nothing: resubmitting redoes failed and killed runs.",
        "# Adapt the partition, time and environment lines to your cluster.",
        f"#SBATCH --job-name=uturn-ablate-{spec['name']}",
        f"#SBATCH --array=0-{len(runs) - 1}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gres=gpu:{gpus}"] if gpus else []),  # the accelerate config's processes
        f"#SBATCH --cpus-per-task={8 * max(gpus, 1)}",
        "#SBATCH --time=12:00:00",
        f"#SBATCH --output={out}/slurm-%A_%a.out",
        "set -euo pipefail",
        "",
        "RUNS=(" + " ".join(shlex.quote(r.name) for r in runs) + ")",
        "",
        "source .venv/bin/activate",
        (f"uturn ablate --config {shlex.quote(config)} --out {shlex.quote(str(out))} "
         '--only "${RUNS[$SLURM_ARRAY_TASK_ID]}"'),
        "",
    ]
    _write_plan(spec, runs, out)
    with atomic_open(script) as f:
        f.write("\n".join(lines))
    return script

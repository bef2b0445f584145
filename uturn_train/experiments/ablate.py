"""`uturn ablate`: post-training objectives side by side, each on several seeds, one run after another (or several at
once, or a SLURM array), then the report.

    uturn ablate --config recipes/testbed/ablation.yaml                 # runs here, then `uturn report` on --out
    uturn ablate --config recipes/testbed/ablation.yaml --jobs 2        # 2 runs at once, each with half the cores
    uturn ablate --config recipes/testbed/ablation.yaml --dry_run       # prints the commands, runs nothing
    uturn ablate --config recipes/qwen3.5-2b/ablation.yaml --slurm      # writes an sbatch array script

The ablation file (paths relative to the directory you run from, like the recipes' own YAML files):

    name: testbed-objectives          # W&B group (WANDB_RUN_GROUP); --out defaults to outputs/ablations/<name>
    accelerate_config: accelerate_configs/cpu.yaml   # `accelerate launch --config_file` of every run (one machine)
    tags: [testbed]                   # optional: W&B tags of every run (WANDB_TAGS)
    seeds: [0, 1, 2]                  # optional: every run once per seed (`--seed N`), the probe's prompts fixed
    start_first: [collab-objective]   # optional: with --jobs, these runs start before the others (the longest)
    overrides: {probe_limit: 100}     # optional: flags of every run, before each run's own
    runs:
      - recipe: collab_sft            # recipes/<recipe>.py
        config: recipes/testbed/collab_sft.yaml
        overrides: {loss_scope: user} # optional: the recipe's flags without `--`; a list gives several values
        seeds: [0, 1]                 # optional: this run's seeds instead of the file's
        name: sft-user                # optional; derived otherwise: collab_sft-loss_scope-user
        tags: [sft]                   # optional: more W&B tags

Every (run, seed) is `accelerate launch --config_file <accelerate_config> recipes/<recipe>.py --config <config>
--output_dir <out>/<name> --run_name <name> <overrides> --seed <seed>`, named `<run>-seed<seed>` (the run's name alone
without seeds), logged to `<out>/<name>/train.log`; when it exits, the marker `<out>/<name>/ablation_run.json` (command,
exit code, times) is written atomically. With `--jobs N`, N runs at a time, each with its share of the machine
([`slot_envs`]: threads, GPUs); the report keeps the file's order whatever order they ran in. A rerun skips the runs
whose marker has exit code 0 and starts the others over, their earlier folder moved to `<out>/.partial/` (never resumed:
the probe history is appended to, and DPO mines before training). Ctrl-C or SIGTERM stops the running runs' process
groups and writes no marker for them. Bad files, and finished runs whose command the file has changed since, fail before
anything runs. More in docs/ablations.md.
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
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from ..io import atomic_open, ensure_writable_dir, write_json
from .ablation_file import Run, load_ablation
from .layout import LOG, MARKER, PLAN

__all__ = ["Run", "count_runs", "finished_runs", "load_ablation", "run_ablation", "shell_command",
           "launch_argv", "slot_envs", "write_sbatch"]



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


def _stop(procs: list[subprocess.Popen]) -> None:
    """Ctrl-C for each run's whole process group (accelerate and its workers), all at once; then, after 10 s, SIGKILL
    for what is left."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
    deadline = time.time() + 10
    try:
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.time(), 0))
    finally:  # also when a second Ctrl-C cuts the wait short
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (kill, scancel) stops the run like Ctrl-C does


def _processes(accelerate_config: str | Path) -> tuple[bool, int]:
    """Whether an accelerate config runs on the CPU, and the processes of one run (one on the CPU: accelerate starts
    one with `use_cpu`; otherwise `num_processes`, a GPU each)."""
    config = yaml.safe_load(Path(accelerate_config).read_text(encoding="utf-8")) or {}
    on_cpu = bool(config.get("use_cpu"))
    return on_cpu, 1 if on_cpu else int(config.get("num_processes", 1))


def slot_envs(accelerate_config: str | Path, jobs: int) -> list[dict[str, str]]:
    """What each of `jobs` runs at once gets of this machine, as environment variables: its share of the CPU cores
    (`OMP_NUM_THREADS`: the cores divided among the runs' processes; torch's threads of two runs on the same cores wait
    on each other: 2 runs x 2 threads on 2 cores took 3.7x as long as 2 runs x 1 thread, docs/ablations.md) and, unless
    the accelerate config is a CPU one, its own GPUs (`CUDA_VISIBLE_DEVICES`, the config's `num_processes` each). One
    run at a time keeps the environment as it is."""
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    if jobs == 1:
        return [{}]
    on_cpu, each = _processes(accelerate_config)
    cpus = len(os.sched_getaffinity(0))
    if jobs * each > cpus:
        raise ValueError(f"--jobs {jobs}: {jobs * each} processes at once, more than the {cpus} CPU cores this process "
                         f"may use (each needs one); use --jobs {max(cpus // each, 1)} or fewer")
    # Every process of a run gets OMP_NUM_THREADS (accelerate passes it on): the cores divided among all of them.
    envs = [{"OMP_NUM_THREADS": str(cpus // (jobs * each))} for _ in range(jobs)]
    if on_cpu:
        return envs
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        import torch

        devices = [str(i) for i in range(torch.cuda.device_count())]
    else:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    if jobs * each > len(devices):
        raise ValueError(f"--jobs {jobs}: each run takes {each} GPU(s) (`num_processes` of {accelerate_config}), "
                         f"{jobs * each} in all, but {len(devices)} are visible here; use --jobs "
                         f"{max(len(devices) // each, 1)} or fewer")
    return [{**env, "CUDA_VISIBLE_DEVICES": ",".join(devices[i * each:(i + 1) * each])} for i, env in enumerate(envs)]


@dataclass
class _Started:
    run: Run
    folder: Path
    position: str
    share: dict  # this run's slot of the machine (`slot_envs`)
    proc: subprocess.Popen
    log: object
    started: float


def launch_argv(run: Run, share: dict[str, str]) -> list[str]:
    """The run's `accelerate launch` in this environment. With several runs at once, a multi-process run takes a free
    port of its own, and a run given GPUs keeps them: accelerate would otherwise set `CUDA_VISIBLE_DEVICES` to the
    config's `gpu_ids` (single_gpu.yaml: `'0'`, every run on GPU 0)."""
    port = ["--main_process_port", "0"] if share else []
    gpus = ["--gpu_ids", "all"] if "CUDA_VISIBLE_DEVICES" in share else []
    return [sys.executable, "-m", "accelerate.commands.launch", *port, *gpus, *run.command[2:]]


def _start(run: Run, folder: Path, position: str, share: dict[str, str]) -> _Started:
    """Start one training in its own process group, logging to `folder/train.log`."""
    argv = launch_argv(run, share)
    log = open(folder / LOG, "wb")  # noqa: SIM115 - closed by _finish, or on an interrupt
    # A session of its own: the terminal's Ctrl-C reaches only us, and we stop the whole group.
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **run.env, **share},
                            start_new_session=True)
    shared = "".join(f"{k}={v}, " for k, v in share.items())
    print(f"{position} {run.name}: running (pid {proc.pid}), {shared}log {folder / LOG}", flush=True)
    return _Started(run, folder, position, share, proc, log, time.time())


def _finish(started: _Started, exit_code: int) -> dict:
    """Write the marker of a run that exited, atomically; returns it."""
    started.log.close()
    finished = time.time()
    marker = {**asdict(started.run), "command": shell_command(started.run), "exit_code": exit_code,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started.started)),
              "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(finished)),
              "wall_seconds": round(finished - started.started, 1), "host": socket.gethostname(), "log": LOG,
              **({"share": started.share} if started.share else {})}
    write_json(started.folder / MARKER, marker)
    return marker


def _report(started: _Started, marker: dict) -> str:
    position, folder, name = started.position, started.folder, started.run.name
    if marker["exit_code"] == 0:
        print(f"{position} {name}: done in {marker['wall_seconds']:.0f} s", flush=True)
        return "done"
    tail = (folder / LOG).read_text(encoding="utf-8", errors="replace").splitlines()[-20:]
    print(f"{position} {name}: FAILED (exit {marker['exit_code']}) after {marker['wall_seconds']:.0f} s; the others "
          f"go on. Last lines of {folder / LOG}:\n" + "\n".join(f"    {t}" for t in tail), flush=True)
    return f"failed (exit {marker['exit_code']})"


def _fresh_folder(out: Path, run: Run, position: str) -> Path:
    folder = out / run.name
    if folder.exists():
        aside = out / ".partial" / f"{run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.parent.mkdir(exist_ok=True)
        os.replace(folder, aside)
        print(f"{position} {run.name}: an earlier attempt did not finish; its folder moved to {aside}")
    folder.mkdir(parents=True)
    return folder


def run_ablation(spec: dict, runs: list[Run], out: Path, only: str | None = None, jobs: int = 1) -> dict[str, str]:
    """Run the runs that have not finished yet, `jobs` at a time (each with its share of the machine, `slot_envs`;
    the file's `start_first` runs before the others), see the module docstring. `only`: one run's name, or a variant's
    (all its seeds).

    Returns:
        `dict[str, str]`: per run, in the file's order, `done`, `skipped` (finished before) or `failed (exit N)`.
    """
    selected = [r for r in runs if only in (None, r.name, r.variant)]
    shares = slot_envs(spec["accelerate_config"], jobs)
    finished = finished_runs(selected, out)
    _write_plan(spec, runs, out)
    statuses, todo = {}, [(f"[{k}/{len(selected)}]", run) for k, run in enumerate(selected, 1)]
    if jobs > 1:  # the longest first, the others beside them; sorted is stable: otherwise the file's order
        first = set(spec.get("start_first") or [])
        todo.sort(key=lambda item: item[1].variant not in first and item[1].name not in first)
    free, running = list(range(len(shares))), {}
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        while todo or running:
            while todo and free:  # a finished run is said where it comes in the order, as a slot frees
                position, run = todo.pop(0)
                if run.name in finished:
                    print(f"{position} {run.name}: finished before ({finished[run.name]['wall_seconds']:.0f} s), "
                          "skipped")
                    statuses[run.name] = "skipped"
                    continue
                slot = free.pop(0)
                running[slot] = _start(run, _fresh_folder(out, run, position), position, shares[slot])
            time.sleep(0.2)
            for slot, started in list(running.items()):
                exit_code = started.proc.poll()
                if exit_code is not None:
                    del running[slot]
                    free.append(slot)
                    statuses[started.run.name] = _report(started, _finish(started, exit_code))
    except BaseException:  # Ctrl-C, SIGTERM, or an error here (a full disk) while runs go on: none is left behind
        _stop([started.proc for started in running.values()])
        for started in running.values():
            started.log.close()
            print(f"{started.position} {started.run.name}: interrupted; its processes were stopped and no marker "
                  "written, so a rerun starts it over", flush=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return {r.name: statuses[r.name] for r in selected}


def write_sbatch(spec: dict, runs: list[Run], out: Path, config: str) -> Path:
    """An sbatch array script, one task per (run, seed), each task `uturn ablate --only <run>-seed<N>` on one node."""
    on_cpu, each = _processes(spec["accelerate_config"])
    gpus = 0 if on_cpu else each
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

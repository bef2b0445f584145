"""`uturn ablate`: post-training objectives side by side, one run after another (or a SLURM array), then the report.

    uturn ablate --config recipes/testbed/ablation.yaml                 # runs here, then `uturn report` on --out
    uturn ablate --config recipes/testbed/ablation.yaml --dry_run       # prints the commands, runs nothing
    uturn ablate --config recipes/qwen3.5-2b/ablation.yaml --slurm      # writes an sbatch array script

The ablation file (paths relative to the directory you run from, like the recipes' own YAML files):

    name: testbed-objectives          # W&B group (WANDB_RUN_GROUP); --out defaults to outputs/ablations/<name>
    accelerate_config: accelerate_configs/cpu.yaml   # `accelerate launch --config_file` of every run (one machine)
    tags: [testbed]                   # optional: W&B tags of every run (WANDB_TAGS)
    overrides: {probe_limit: 100}     # optional: flags of every run, before each run's own
    runs:
      - recipe: collab_sft            # recipes/<recipe>.py
        config: recipes/testbed/collab_sft.yaml
        overrides: {loss_scope: user} # optional: the recipe's flags without `--`; a list gives several values
        seeds: [0, 1]                 # optional: one run per seed (`--seed N`)
        name: sft-user                # optional; derived otherwise: collab_sft-loss_scope-user(-seed0)
        tags: [sft]                   # optional: more W&B tags

Each run is `accelerate launch --config_file <accelerate_config> recipes/<recipe>.py --config <config> --output_dir
<out>/<name> --run_name <name> <overrides>`, logged to `<out>/<name>/train.log`; when it exits, the marker
`<out>/<name>/ablation_run.json` (command, exit code, times) is written atomically. A rerun skips the runs whose marker
has exit code 0 and starts the others over, their earlier folder moved to `<out>/.partial/` (never resumed: the probe
history is appended to, and DPO mines before training). Ctrl-C or SIGTERM stops the run's process group and writes no
marker. Bad files, and finished runs whose command the file has changed since, fail before anything runs. More in
docs/ablations.md.
"""

import argparse
import contextlib
import difflib
import importlib.util
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from .io import atomic_open, ensure_writable_dir, write_json
from .report import MARKER, PLAN

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
LOG = "train.log"
SET_BY_ABLATE = ("output_dir", "run_name", "config")
FILE_FIELDS, RUN_FIELDS = ("name", "accelerate_config", "tags", "overrides", "runs"), \
    ("recipe", "config", "overrides", "seeds", "name", "tags")


@dataclass
class Run:
    """One run of an ablation: what the marker, the plan and the report show."""

    ablation: str
    name: str
    recipe: str
    config: str
    knobs: dict  # the run's own overrides and seed: what tells it apart
    overrides: dict  # every flag the recipe gets from the ablation: the file's, then the run's
    tags: list[str]
    command: list[str]  # `accelerate launch ...`
    env: dict[str, str]


def _flags(overrides: dict) -> list[str]:
    flags = []
    for key, value in overrides.items():
        values = value if isinstance(value, list) else [value]
        flags += [f"--{key}", *(json.dumps(v) if isinstance(v, dict) else str(v).lower() if isinstance(v, bool)
                                else str(v) for v in values)]
    return flags


def _load_parser(recipe: str):
    spec = importlib.util.spec_from_file_location(f"uturn_recipe_{recipe}", RECIPES / f"{recipe}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_parser()


def _check_overrides(parser, recipe: str, overrides: dict, where: str) -> None:
    options = {action.dest for action in parser._actions}
    for key, value in overrides.items():
        field = f"{where}: field `overrides.{key}`"
        if key in SET_BY_ABLATE:
            raise ValueError(f"{field}: set by uturn ablate for every run; remove it")
        if key not in options:
            close = difflib.get_close_matches(key, options, n=1)
            raise ValueError(f"{field}: not an option of recipes/{recipe}.py"
                             + (f"; did you mean `{close[0]}`?" if close else ""))
        if value is None or value == []:
            raise ValueError(f"{field}: {value!r} cannot be given on the command line; set it in the recipe's YAML")
    # argparse checks types and choices (`max_steps: ten`, `lr_scheduler_type: cosin`) without building the configs,
    # which would need the run's hardware (bf16 on a GPU) on the machine that only submits.
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            argparse.ArgumentParser.parse_args(parser, _flags(overrides))
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()[-1].split("error: ", 1)[-1]
        raise ValueError(f"{where}: field `overrides`: {message}") from None


def _yaml_mapping(path: Path, where: str) -> dict:
    if not path.is_file():
        raise ValueError(f"{where}: {path} does not exist (paths are relative to {Path.cwd()})")
    content = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(content, dict):
        raise ValueError(f"{where}: {path} is not a YAML mapping")  # noqa: TRY004 - the CLI reports ValueError
    return content


def _mapping(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a mapping of option: value, got {type(value).__name__}")  # noqa: TRY004
    return value


def _tags(value, where: str) -> list[str]:
    if not (isinstance(value, list) and all(isinstance(t, str) and "," not in t for t in value)):
        raise ValueError(f"{where}: expected a list of tags (strings without commas)")
    return value


def _run_name(entry: dict, seed: int | None) -> str:
    """The given `name`, or the recipe and the run's own overrides; `-seed<N>` when the run has `seeds`."""
    parts = [str(entry["name"])] if entry.get("name") else [entry["recipe"]] + [
        f"{k}-{'+'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in entry.get("overrides", {}).items()]
    return re.sub(r"[^A-Za-z0-9._+=-]", "_", "-".join(parts + ([f"seed{seed}"] if seed is not None else [])))


def load_ablation(path: str | Path, out: str | Path | None = None) -> tuple[dict, list[Run], Path]:
    """Read and check an ablation file (see the module docstring).

    Returns:
        `tuple[dict, list[Run], Path]`: the file's content, its runs (one per seed) and the output folder.
    """
    path = Path(path)
    spec = _yaml_mapping(path, "--config")
    unknown = sorted(set(spec) - set(FILE_FIELDS))
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {unknown}; an ablation file has {list(FILE_FIELDS)}")
    for key in ("name", "accelerate_config", "runs"):
        if not spec.get(key):
            raise ValueError(f"{path}: field `{key}` is missing")
    name = str(spec["name"])
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise ValueError(f"{path}: field `name`: {name!r} must be letters, digits, `.`, `_` or `-` (a folder name)")
    accelerate_config = Path(spec["accelerate_config"])
    machines = _yaml_mapping(accelerate_config, f"{path}: field `accelerate_config`").get("num_machines", 1)
    if machines != 1:
        raise ValueError(f"{path}: field `accelerate_config`: {accelerate_config} spans {machines} machines, but each "
                         "ablation run runs on one; use a one-node config (multi_gpu.yaml, deepspeed_zero3.yaml)")
    tags = _tags(spec.get("tags", []), f"{path}: field `tags`")
    common = _mapping(spec.get("overrides", {}), f"{path}: field `overrides`")
    if not isinstance(spec["runs"], list):
        raise ValueError(f"{path}: field `runs`: expected a list of runs")  # noqa: TRY004
    out = Path(out or Path("outputs") / "ablations" / name)
    parsers, runs = {}, []
    for i, entry in enumerate(spec["runs"]):
        where = f"{path}: runs[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a mapping with `recipe` and `config`")  # noqa: TRY004
        where += f" ({entry.get('name') or entry.get('recipe')})"
        unknown = sorted(set(entry) - set(RUN_FIELDS))
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; a run has {list(RUN_FIELDS)}")
        recipe = entry.get("recipe")
        available = sorted(p.stem for p in RECIPES.glob("*.py"))
        if recipe not in available:
            raise ValueError(f"{where}: field `recipe`: unknown recipe {recipe!r}; {RECIPES} has {available} (the "
                             "recipes live in a source checkout: install with `pip install -e .` from one)")
        if not entry.get("config"):
            raise ValueError(f"{where}: field `config` is missing (the recipe's YAML)")
        own = _mapping(entry.get("overrides", {}), f"{where}: field `overrides`")
        seeds = entry.get("seeds")
        if seeds is not None:
            if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
                raise ValueError(f"{where}: field `seeds`: expected a non-empty list of integers")
            if "seed" in {**common, **own}:
                raise ValueError(f"{where}: field `seeds`: the overrides set `seed` too; keep one of them")
        if recipe not in parsers:
            parsers[recipe] = _load_parser(recipe)
        parser = parsers[recipe]
        config = _yaml_mapping(Path(entry["config"]), f"{where}: field `config`")
        unknown = sorted(set(config) - {a.dest for a in parser._actions} - {"env"})
        if unknown:
            raise ValueError(f"{where}: field `config`: {entry['config']} has unknown field(s) {unknown} for {recipe}")
        _check_overrides(parser, recipe, {**common, **own}, where)
        run_tags = tags + _tags(entry.get("tags", []), f"{where}: field `tags`")
        for seed in seeds or [None]:
            knobs = {**own, **({"seed": seed} if seed is not None else {})}
            run_name = _run_name(entry, seed)
            overrides = {**common, **knobs}
            command = ["accelerate", "launch", "--config_file", str(accelerate_config),
                       os.path.relpath(RECIPES / f"{recipe}.py"), "--config", str(entry["config"]),
                       "--output_dir", str(out / run_name), "--run_name", run_name, *_flags(overrides)]
            env = {"WANDB_RUN_GROUP": name, **({"WANDB_TAGS": ",".join(run_tags)} if run_tags else {})}
            runs.append(Run(name, run_name, recipe, str(entry["config"]), knobs, overrides, run_tags, command, env))
    names = [r.name for r in runs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: runs share the name(s) {duplicates}; give them distinct `name` fields")
    return spec, runs, out


def _shell(run: Run) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in run.env.items()) + " " + shlex.join(run.command)


def _write_plan(spec: dict, runs: list[Run], out: Path) -> None:
    """`<out>/ablation.json`: every run of the file, so the report knows runs that never finished."""
    ensure_writable_dir(out)
    write_json(out / PLAN, {"name": spec["name"], "accelerate_config": spec["accelerate_config"],
                            "runs": [{**asdict(r), "command": _shell(r)} for r in runs]})


def finished_runs(runs: list[Run], out: Path) -> dict[str, dict]:
    """The markers of the runs that finished (exit code 0), by name; a run that finished with another command (the
    file was edited since) fails here rather than being skipped as if it were this one."""
    finished, changed = {}, []
    for run in runs:
        path = out / run.name / MARKER
        marker = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
        if marker is not None and marker["exit_code"] == 0:
            finished[run.name] = marker
            if marker["command"] != _shell(run):
                changed.append(f"{run.name}: ran `{marker['command']}`, now `{_shell(run)}`")
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
    marker = {**asdict(run), "command": _shell(run), "exit_code": exit_code,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
              "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(finished)),
              "wall_seconds": round(finished - started, 1), "host": socket.gethostname(), "log": LOG}
    write_json(folder / MARKER, marker)
    return marker


def run_ablation(spec: dict, runs: list[Run], out: Path, only: str | None = None) -> dict[str, str]:
    """Run the runs that have not finished yet, one after another; see the module docstring.

    Returns:
        `dict[str, str]`: per run, `done`, `skipped` (finished before) or `failed (exit N)`.
    """
    selected = [r for r in runs if only in (None, r.name)]
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
    """An sbatch array script, one task per run, each task `uturn ablate --only <run>` on one node."""
    accelerate = yaml.safe_load(Path(spec["accelerate_config"]).read_text(encoding="utf-8"))
    gpus = 0 if accelerate.get("use_cpu") else int(accelerate.get("num_processes", 1))
    script = out / "ablation.sbatch"
    lines = [
        "#!/bin/bash",
        f"# uturn ablate `{spec['name']}`: {len(runs)} runs, one array task each, from {config}.",
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="uturn ablate", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the ablation file (e.g. recipes/testbed/ablation.yaml)")
    parser.add_argument("--out", default=None, help="output folder (default: outputs/ablations/<name>)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    mode.add_argument("--slurm", action="store_true", help="write an sbatch array script (one task per run)")
    parser.add_argument("--only", default=None, metavar="NAME", help="run only this run (what each array task does)")
    args = parser.parse_args(argv)
    spec, runs, out = load_ablation(args.config, args.out)
    if args.only is not None and args.only not in [r.name for r in runs]:
        raise ValueError(f"--only {args.only}: no such run in {args.config}; runs: {[r.name for r in runs]}")
    if args.dry_run:
        print(f"# {spec['name']}: {len(runs)} runs -> {out} (W&B group {spec['name']})")
        finished = finished_runs(runs, out)
        for k, run in enumerate(runs, 1):
            done = " (finished before: would be skipped)" if run.name in finished else ""
            print(f"# [{k}/{len(runs)}] {run.name}{done}\n{_shell(run)}")
        return
    if args.slurm:
        script = write_sbatch(spec, runs, out, args.config)
        print(f"{script}: {len(runs)} array tasks. Submit from this directory, the report after the last task:\n"
              f"  jid=$(sbatch --parsable {script}) && sbatch --dependency=afterany:$jid --wrap 'uturn report {out}'")
        return
    try:
        statuses = run_ablation(spec, runs, out, only=args.only)
    except KeyboardInterrupt:
        sys.exit(130)
    failed = {n: s for n, s in statuses.items() if s.startswith("failed")}
    print(f"{spec['name']}: " + ", ".join(f"{n} {s}" for n, s in statuses.items()))
    if args.only is None:
        from .report import write_report

        try:
            write_report([out], out)
            print(f"report: {out / 'report.md'}")
        except ValueError as e:  # e.g. every run failed before its first probe
            print(f"no report: {e}")
    if failed:
        sys.exit(1)

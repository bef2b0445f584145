"""The ablation file of `uturn ablate`: read, checked before anything runs, and expanded into one [`Run`] per
(run, seed). See [`~uturn_train.experiments.ablate`] for the file's fields and docs/ablations.md for the checks."""

import argparse
import contextlib
import difflib
import importlib.util
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SET_BY_ABLATE = ("output_dir", "run_name", "config")
FILE_FIELDS, RUN_FIELDS = ("name", "accelerate_config", "tags", "seeds", "overrides", "runs", "start_first"), \
    ("recipe", "config", "overrides", "seeds", "name", "tags")


@dataclass
class Run:
    """One (run, seed) of an ablation: what the marker, the plan and the report show."""

    ablation: str
    name: str  # the folder and W&B run name: the variant's name, `-seed<N>` when the file gives seeds
    recipe: str
    config: str
    knobs: dict  # the run's own overrides: what tells its variant apart
    overrides: dict  # every flag the recipe gets from the ablation: the file's, the run's, then `seed`
    tags: list[str]
    command: list[str]  # `accelerate launch ...`
    env: dict[str, str]
    variant: str = ""  # the run's name without the seed: the report pools the seeds of a variant
    seed: int | None = None  # `--seed`; None: the recipe YAML's


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


def _seeds(value, where: str) -> list[int] | None:
    if value is None:
        return None
    # bool is an int to Python, and `seeds: [yes]` is a typo, not seed 1.
    if not (isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) for s in value)):
        raise ValueError(f"{where}: expected a non-empty list of integers, e.g. [0, 1, 2]; got {value!r}")
    repeated = sorted({s for s in value if value.count(s) > 1})
    if repeated:
        raise ValueError(f"{where}: seed(s) {repeated} given twice; each seed is one training run")
    return value


def _variant_name(entry: dict) -> str:
    """The given `name`, or the recipe and the run's own overrides."""
    parts = [str(entry["name"])] if entry.get("name") else [entry["recipe"]] + [
        f"{k}-{'+'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in entry.get("overrides", {}).items()]
    return re.sub(r"[^A-Za-z0-9._+=-]", "_", "-".join(parts))


def load_ablation(path: str | Path, out: str | Path | None = None) -> tuple[dict, list[Run], Path]:
    """Read and check an ablation file (see [`~uturn_train.experiments.ablate`]).

    Returns:
        `tuple[dict, list[Run], Path]`: the file's content, its runs (one per run and seed, the seeds of a run
        together) and the output folder.
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
    file_seeds = _seeds(spec.get("seeds"), f"{path}: field `seeds`")
    common = _mapping(spec.get("overrides", {}), f"{path}: field `overrides`")
    if file_seeds is not None and "seed" in common:
        raise ValueError(f"{path}: field `seeds`: `overrides` sets `seed` too; keep one of them")
    if not isinstance(spec["runs"], list):
        raise ValueError(f"{path}: field `runs`: expected a list of runs")  # noqa: TRY004
    out = Path(out or Path("outputs") / "ablations" / name)
    parsers, runs, variants = {}, [], {}
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
        seeds = _seeds(entry.get("seeds"), f"{where}: field `seeds`")
        seeds = file_seeds if seeds is None else seeds  # a run's own list replaces the file's
        if seeds is not None and "seed" in {**common, **own}:
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
        variant = _variant_name(entry)
        if variant in variants:  # the report would pool their seeds as one setting's
            raise ValueError(f"{where}: runs[{variants[variant]}] has the name {variant!r} too; give them distinct "
                             "`name` fields (several seeds of one run: its `seeds` field)")
        variants[variant] = i
        for seed in seeds or [None]:
            run_name = variant if seed is None else f"{variant}-seed{seed}"
            overrides = {**common, **own, **({"seed": seed} if seed is not None else {})}
            command = ["accelerate", "launch", "--config_file", str(accelerate_config),
                       os.path.relpath(RECIPES / f"{recipe}.py"), "--config", str(entry["config"]),
                       "--output_dir", str(out / run_name), "--run_name", run_name, *_flags(overrides)]
            # One W&B group per ablation; the job type gathers a variant's seeds inside it, and the seed is in each
            # run's config (the Trainer logs its arguments).
            env = {"WANDB_RUN_GROUP": name, "WANDB_JOB_TYPE": variant,
                   **({"WANDB_TAGS": ",".join(run_tags)} if run_tags else {})}
            runs.append(Run(name, run_name, recipe, str(entry["config"]), dict(own), overrides, run_tags, command,
                            env, variant, seed))
    first = spec.get("start_first", [])
    known = {n for r in runs for n in (r.name, r.variant)}
    if not (isinstance(first, list) and all(isinstance(n, str) for n in first)) or set(first) - known:
        raise ValueError(f"{path}: field `start_first`: expected a list of this file's run names (the runs to start "
                         f"first with --jobs), got {first!r}; the runs: {sorted({r.variant for r in runs})}")
    names = [r.name for r in runs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: runs share the name(s) {duplicates}; give them distinct `name` fields")
    return spec, runs, out

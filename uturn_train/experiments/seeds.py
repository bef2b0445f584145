"""Across seeds: the runs of `uturn report` pooled by seed, so that a conclusion includes training variance.

A *variant* is one run of an ablation file on all its seeds: the run folders whose marker (`ablation_run.json`) or
plan names the same `variant` in the same ablation folder. A folder without one (a recipe's own `--output_dir`, an
ablation from before seeds) is a variant with one seed. For each variant and checkpoint (step 0, the best one, the
last one, picked per seed) every metric gets its per-seed values, their mean and sd, and a two-level bootstrap
interval ([`~uturn_train.stats.two_level_bootstrap`]); every two variants get the difference of their means with that
interval, a t-interval over the seeds' values ([`~uturn_train.stats.seed_t_interval`]: paired when both sides hold the
same seeds, Welch's otherwise), the seeds of B that beat A and the probability of improvement. A difference is called
(starred) only when both sides have two seeds or more and both intervals exclude 0: the bootstrap draws seeds from
the two or three a run has, which gives intervals far too narrow (in an A/A simulation with 2-3 seeds per side, 21-27%
excluded 0), and the t-interval is the one that accounts for so few seeds. The A/A check splits each variant's seeds
in two halves and compares them the same way: nothing should be called different. A half of one seed is never
starred, so the check can flag nothing for a variant of fewer than four seeds.
"""

from itertools import combinations
from pathlib import Path

import numpy as np

from ..collab.dialogue import asked_first
from ..io import read_jsonl
from ..probe.record import FOLLOWUP, GROUNDED, SHARES, figure
from ..stats import (
    BOOTSTRAP_RESAMPLES,
    excludes_zero,
    probability_of_improvement,
    seed_t_interval,
    seeds_beating,
    two_level_bootstrap,
)

ONE_SEED = "1 seed: training variance unknown"
# Collaboration at a checkpoint that held conversations with the oracle partner (`--probe_collab`, greedy): per
# metric, the family, whether only the peer_check answers that started wrong count, and the summary's figure (a
# conversation counts its success, or whether its first turn asks).
COLLAB = {"collab info_gap": ("info_gap", False, "success_rate"),
          "collab info_gap asked first": ("info_gap", False, "asked_first"),
          "collab peer_check": ("peer_check", False, "success_rate"),
          "collab peer_check wrong start": ("peer_check", True, "success_rate")}


def metrics_of(metric: str, temperatures: list[float]) -> list[tuple[str, float | None]]:
    """(metric, temperature) pairs of the tables across seeds: accuracy, then per temperature the rates and shares,
    then collaboration success (runs without conversations have none, and the tables leave them out)."""
    rates = [FOLLOWUP] + ([GROUNDED] if metric == GROUNDED else [])
    return [("accuracy", None)] + [(m, t) for t in temperatures for m in (*rates, *SHARES)] + \
        [(m, None) for m in COLLAB]


def _figure(record: dict, metric: str, temperature: float | None) -> float | None:
    """[`~uturn_train.probe.record.figure`], and the collaboration metrics from the record's `collab` summary."""
    if metric not in COLLAB:
        return figure(record, metric, temperature)
    family, wrong_start, key = COLLAB[metric]
    summary = (record.get("collab") or {}).get(family) or {}
    return ((summary.get("wrong_start") or {}) if wrong_start else summary).get(key)


def variant_of(name: str, info: dict) -> tuple[str, int | None]:
    """A run folder's variant and seed from its marker or plan entry `info`. Markers from before the `variant` field
    hold a run's seed only in its knobs and its name's `-seed<N>` suffix."""
    if info.get("variant"):
        return info["variant"], info.get("seed")
    seed = (info.get("knobs") or {}).get("seed")
    if isinstance(seed, int) and name.endswith(f"-seed{seed}"):
        return name[: -len(f"-seed{seed}")], seed
    return name, None


def group_seeds(runs: list[dict]) -> list[dict]:
    """The variants of [`~uturn_train.experiments.report.load_run`]'s runs, in the order of their first seed."""
    variants: dict[tuple[str, str], dict] = {}
    for run in runs:
        key = (str(Path(run["dir"]).parent), run["variant"])
        v = variants.setdefault(key, {"name": run["variant"], "recipe": run["recipe"], "knobs": run["knobs"],
                                      "ablation": run["ablation"], "runs": []})
        v["runs"].append(run)
    names = [v["name"] for v in variants.values()]
    for (parent, _), v in variants.items():  # one variant name in two ablations: tell them apart by their folder
        if names.count(v["name"]) > 1:
            v["name"] = f"{Path(parent).name}/{v['name']}"
    for v in variants.values():
        v["runs"].sort(key=lambda r: (r["seed"] is None, r["seed"] or 0))
        seeds = [r["seed"] for r in v["runs"]]
        if len(set(seeds)) < len(seeds):
            raise ValueError(f"{v['name']}: run folders {[r['dir'] for r in v['runs']]} share a seed; one folder per "
                             "seed (move the repeated one away)")
    return list(variants.values())


class PromptValues:
    """Per-prompt values of a run folder's checkpoint, read once from `probe/step_<N>.jsonl` (per collaboration task
    from `collab/step_<N>.jsonl`)."""

    def __init__(self):
        self.cache: dict[tuple[str, str, int], list[dict] | None] = {}

    def __call__(self, run: dict, step: int, metric: str, temperature: float | None) -> dict[str, float] | None:
        if metric in COLLAB:
            return self._collab(run, step, metric)
        rows = self._rows(run, "probe", step)
        if rows is None or metric in SHARES:
            return None
        if metric == "accuracy":
            graded = {r["id"]: float(bool(r["answer_correct"])) for r in rows if r.get("answer_correct") is not None}
            return graded or None
        per_prompt: dict[str, list[bool]] = {}
        for r in rows:
            # As the probe's rates: error rows and undefined grounded decisions are left out.
            if r["temperature"] != temperature or r["label"] is None or (metric == GROUNDED and r.get("grounded")
                                                                         is None):
                continue
            per_prompt.setdefault(r["id"], []).append(r["label"] == "followup" if metric == FOLLOWUP
                                                      else bool(r["grounded"]))
        return {i: float(np.mean(v)) for i, v in per_prompt.items()} or None

    def _rows(self, run: dict, folder: str, step: int) -> list[dict] | None:
        key = (run["dir"], folder, step)
        if key not in self.cache:
            path = Path(run["dir"]) / folder / f"step_{step}.jsonl"
            self.cache[key] = read_jsonl(path) if path.exists() else None
        return self.cache[key]

    def _collab(self, run: dict, step: int, metric: str) -> dict[str, float] | None:
        """Per task, 1 or 0, from the conversations held at the checkpoint (`collab/step_<N>.jsonl`); as the
        record's summary, conversations that ended in an error are left out."""
        rows = self._rows(run, "collab", step)
        if rows is None:
            return None
        family, wrong_start, key = COLLAB[metric]
        rows = [r for r in rows if r["family"] == family and r["error"] is None
                and (not wrong_start or r["answer_right"] is False)]
        return {r["id"]: float(asked_first(r) if key == "asked_first" else bool(r["success"])) for r in rows} or None


def _per_seed(variant: dict, kind: str, metric: str, temperature: float | None) -> dict:
    """Per seed (None for an unseeded run), the history's value of `metric` at the seed's checkpoint `kind`."""
    values = {}
    for run in variant["runs"]:
        checkpoint = run["picked"][kind]
        if checkpoint is not None:
            value = _figure(checkpoint, metric, temperature)
            if value is not None:
                values[run["seed"]] = value
    return values


def _prompts(values: PromptValues, variant: dict, kind: str, metric: str, temperature: float | None):
    """Per seed, the per-prompt values at its checkpoint `kind`; None when a seed's samples are missing."""
    out = []
    for run in variant["runs"]:
        checkpoint = run["picked"][kind]
        if checkpoint is None:
            continue
        prompt_values = values(run, checkpoint["step"], metric, temperature)
        if prompt_values is None:
            return None
        out.append(prompt_values)
    return out


def summarize_variant(variant: dict, metrics: list, values: PromptValues, resamples: int, seed: int) -> dict:
    """Per checkpoint kind, the steps per seed and every metric's mean, sd, per-seed values and intervals."""
    checkpoints = {}
    for kind in ("step0", "best", "last"):
        steps = {r["seed"]: r["picked"][kind]["step"] for r in variant["runs"] if r["picked"][kind] is not None}
        if not steps:
            checkpoints[kind] = None
            continue
        rows = []
        for metric, t in metrics:
            per_seed = _per_seed(variant, kind, metric, t)
            if not per_seed:
                continue
            prompts = None if metric in SHARES else _prompts(values, variant, kind, metric, t)
            stats = two_level_bootstrap(prompts, resamples=resamples, seed=seed) if prompts else {}
            vals = list(per_seed.values())
            rows.append({"metric": metric, "temperature": t, "mean": float(np.mean(vals)),
                         "sd": float(np.std(vals, ddof=1)) if len(vals) > 1 else None,
                         "per_seed": [{"seed": s, "value": v} for s, v in per_seed.items()],
                         "ci95": stats.get("ci95"), "ci95_prompts": stats.get("ci95_prompts"),
                         "n_prompts": stats.get("n_prompts")})
        checkpoints[kind] = {"steps": [{"seed": s, "step": st} for s, st in steps.items()], "metrics": rows}
    seeds = [r["seed"] for r in variant["runs"]]
    return {"name": variant["name"], "recipe": variant["recipe"], "knobs": variant["knobs"],
            "ablation": variant["ablation"], "seeds": seeds, "runs": [r["name"] for r in variant["runs"]],
            "note": ONE_SEED if len(seeds) == 1 else None, "checkpoints": checkpoints}


def called_different(ci95: list[float] | None, ci95_seeds: list[float] | None, n_a: int, n_b: int) -> bool:
    """The star: two seeds or more on each side, and both the two-level bootstrap interval and the seed-level
    t-interval exclude 0."""
    return min(n_a, n_b) >= 2 and excludes_zero(ci95) and excludes_zero(ci95_seeds)


def compare_seeds(a: dict, kind_a: str, b: dict, kind_b: str, metric: str, temperature: float | None,
                  values: PromptValues, resamples: int, seed: int) -> dict | None:
    """Variant `b` at its checkpoint `kind_b` against `a` at `kind_a`, for one metric, across seeds. The same
    variant on both sides (step 0 against last) pairs each seed with itself."""
    per_a, per_b = _per_seed(a, kind_a, metric, temperature), _per_seed(b, kind_b, metric, temperature)
    if not per_a or not per_b:
        return None
    prompts_a, prompts_b = (_prompts(values, v, k, metric, temperature) for v, k in ((a, kind_a), (b, kind_b)))
    paired = a is b and prompts_a is not None and len(prompts_a) == len(prompts_b or [])
    stats = (two_level_bootstrap(prompts_a, prompts_b, paired_seeds=paired, resamples=resamples, seed=seed)
             if prompts_a and prompts_b else {"ci95": None, "ci95_prompts": None, "n_prompts": None})
    one_seed = min(len(per_a), len(per_b)) == 1
    ci95, seeds = stats["ci95"], seed_t_interval(per_a, per_b)
    return {"a": {"run": a["name"], "checkpoint": kind_a}, "b": {"run": b["name"], "checkpoint": kind_b},
            "metric": metric, "temperature": temperature, "n_seeds": [len(per_a), len(per_b)],
            "n_prompts": stats["n_prompts"], "mean_a": float(np.mean(list(per_a.values()))),
            "mean_b": float(np.mean(list(per_b.values()))),
            "difference": float(np.mean(list(per_b.values())) - np.mean(list(per_a.values()))),
            "ci95": ci95, "ci95_prompts": stats["ci95_prompts"], "ci95_seeds": seeds["ci95"],
            "seed_test": seeds["test"], "seed_df": seeds["df"],
            "seeds_beating": list(seeds_beating(per_a, per_b)),
            "probability_of_improvement": probability_of_improvement(list(per_a.values()), list(per_b.values())),
            "significant": called_different(ci95, seeds["ci95"], len(per_a), len(per_b)),
            "excludes_zero": excludes_zero(ci95), "t_excludes_zero": excludes_zero(seeds["ci95"]),
            "note": ONE_SEED if one_seed else None}


def _halves(variant: dict) -> tuple[dict, dict]:
    runs = variant["runs"]
    half = (len(runs) + 1) // 2
    return ({**variant, "runs": runs[:half], "name": f"{variant['name']} {_seeds(runs[:half])}"},
            {**variant, "runs": runs[half:], "name": f"{variant['name']} {_seeds(runs[half:])}"})


def _seeds(runs: list[dict]) -> str:
    return ("seed " if len(runs) == 1 else "seeds ") + "+".join(str(r["seed"]) for r in runs)


def cross_seed_report(runs: list[dict], metric: str, temperatures: list[float], resamples: int = BOOTSTRAP_RESAMPLES,
                      seed: int = 0) -> dict:
    """`variants`, `seed_comparisons` (each variant's last checkpoint against its step 0, then every two variants at
    their best and at their last checkpoints) and `aa_check` (each variant of two seeds or more: its two halves at the
    last checkpoint, with the `variant`'s name) of `report.json`; `runs` need `picked` (their step 0, best and last
    records)."""
    variants = group_seeds(runs)
    metrics = [m for m in metrics_of(metric, temperatures) if m[0] not in SHARES]
    values = PromptValues()
    summaries = [summarize_variant(v, metrics_of(metric, temperatures), values, resamples, seed) for v in variants]
    comparisons = []
    for v in variants:
        if any(r["picked"]["step0"] is not None and r["picked"]["last"]["step"] != 0 for r in v["runs"]):
            comparisons += [compare_seeds(v, "step0", v, "last", m, t, values, resamples, seed) for m, t in metrics]
    for kind in ("best", "last"):
        comparisons += [compare_seeds(a, kind, b, kind, m, t, values, resamples, seed)
                        for a, b in combinations(variants, 2) for m, t in metrics]
    aa = []
    for v in variants:
        if len(v["runs"]) >= 2:
            first, second = _halves(v)
            aa += [{**c, "variant": v["name"]} for m, t in metrics
                   if (c := compare_seeds(first, "last", second, "last", m, t, values, resamples, seed)) is not None]
    return {"variants": summaries, "seed_comparisons": [c for c in comparisons if c is not None], "aa_check": aa}


def spread(variant_runs: list[dict], temperature: float, metric: str) -> list[tuple[int, list, list]]:
    """Per step every seed of a variant was probed at, the seeds' (rate, accuracy) pairs, for the Pareto plot."""
    by_step: dict[int, list[tuple]] = {}
    for run in variant_runs:
        for record in run["records"]:
            x, y = figure(record, metric, temperature), record["accuracy"]
            if x is not None and y is not None:
                by_step.setdefault(record["step"], []).append((x, y))
    steps = sorted(s for s, points in by_step.items() if len(points) == len(variant_runs))
    return [(s, [p[0] for p in by_step[s]], [p[1] for p in by_step[s]]) for s in steps]


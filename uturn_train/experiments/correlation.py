"""Does the probe predict collaboration? Rank correlation between collaboration success and the probe's rates.

Reads an ablation trained with `--probe_collab` (every checkpoint probed *and* holding collaboration conversations,
`recipes/testbed/ablation.yaml`) and relates, over all checkpoints of all runs and seeds, each family's success rate
to (a) the greedy grounded follow-up rate, (b) the T=1.0 grounded rate and (c) accuracy: Spearman's rho with a
bootstrap 95% interval that resamples whole runs (a run's checkpoints are not independent), and rho within each seed.

```bash
uturn ablate --config recipes/testbed/ablation.yaml --out outputs/ablations/testbed-collab
python eval/collab_correlation.py outputs/ablations/testbed-collab --out outputs/collab_correlation
python eval/collab_correlation.py outputs/ablations/testbed-collab --relabel --out outputs/collab_correlation-relabel
```

`--relabel` labels the stored user turns (`probe/step_<N>.jsonl`) again with this version's rules and reads the
grounded rates from those labels: after a fix of the classifier, the same checkpoints and conversations, measured
again, without training anything again.

Writes `correlation.json`, `correlation.md` (the table) and `correlation.png` (the scatter plots).
"""

import json
from collections import defaultdict
from pathlib import Path

from ..io import atomic_open, write_json
from ..probe.record import GROUNDED, flat_name
from ..probe.rules.classify import classify_turn
from ..probe.rules.grounding import is_grounded
from ..stats import grouped_spearman, spearman
from .report import find_runs, load_run

PREDICTORS = {"greedy grounded": (GROUNDED, 0.0), "T=1.0 grounded": (GROUNDED, 1.0), "accuracy": ("accuracy", None)}
OUTCOMES = {"info_gap": ("info_gap", None), "peer_check": ("peer_check", None),
            "peer_check, wrong start": ("peer_check", "wrong_start")}


def relabelled_rates(turns: Path) -> dict[float, float]:
    """Per temperature, the grounded follow-up rate of the user turns in a probe's `step_<N>.jsonl`, each labelled
    again by `classify_turn` and `is_grounded` against the mismatched context the probe paired it with."""
    if not turns.exists():
        raise FileNotFoundError(f"{turns}: no stored user turns to label again; run without --relabel")
    rows = [json.loads(line) for line in turns.open()]
    if any("scorer_reason" in r for r in rows):
        raise ValueError(f"{turns}: probed with a scorer, which --relabel does not run again; run without --relabel")
    # Not `ground_rows`: it pairs contexts by a seed of its own; the stored `mismatch_index` is the probe's own pairing.
    contexts = {r["index"]: (r["query"], r["answer"]) for r in rows if r.get("answer") is not None}
    grounded = defaultdict(list)
    for r in rows:
        if r.get("error") is not None:
            continue  # left out of every rate, as in the probe
        if r.get("mismatch_index") is None:
            raise ValueError(f"{turns}: row {r['index']} has no mismatched context, its grounded label is undefined")
        verdict = classify_turn(r["query"], r["answer"], r["user_turn"], finish_reason=r["finish_reason"])
        g = is_grounded(r["query"], r["answer"], r["user_turn"], *contexts[r["mismatch_index"]], verdict=verdict,
                        finish_reason=r["finish_reason"])
        grounded[r["temperature"]].append(g.grounded)
    return {t: sum(v) / len(v) for t, v in grounded.items()}


def points(dirs: list[str], relabel: bool = False) -> list[dict]:
    """One point per probed checkpoint that held collaboration conversations."""
    found = []
    for path in find_runs(dirs):
        run = load_run(path)
        for r in run["records"]:
            if not r.get("collab"):
                continue
            point = {"run": run["name"], "variant": run["variant"], "seed": run["seed"], "step": r["step"],
                     "accuracy": r["accuracy"]}
            for s in r["settings"]:
                point[flat_name(GROUNDED, s["temperature"])] = s.get(GROUNDED)
            if relabel:
                for t, rate in relabelled_rates(Path(path) / "probe" / f"step_{r['step']}.jsonl").items():
                    point[flat_name(GROUNDED, t)] = rate
            for name, (family, part) in OUTCOMES.items():
                c = r["collab"].get(family)
                point[name] = None if c is None else (c[part] if part else c)["success_rate"]
            found.append(point)
    if not found:
        raise ValueError(f"{dirs}: no checkpoint held collaboration conversations; train with --probe_collab testbed")
    return found


def _value(point: dict, metric: str, temperature: float | None):
    return point[metric] if temperature is None else point.get(flat_name(metric, temperature))


def correlations(pts: list[dict], seed: int = 0) -> list[dict]:
    rows = []
    for outcome in OUTCOMES:
        for predictor, (metric, t) in PREDICTORS.items():
            usable = [p for p in pts if p[outcome] is not None and _value(p, metric, t) is not None]
            runs = sorted({p["run"] for p in usable})
            groups = [[(_value(p, metric, t), p[outcome]) for p in usable if p["run"] == run] for run in runs]
            per_seed = {}
            for s in sorted({p["seed"] for p in usable}, key=lambda s: (s is None, s or 0)):
                mine = [p for p in usable if p["seed"] == s]
                per_seed[str(s)] = spearman([_value(p, metric, t) for p in mine], [p[outcome] for p in mine])
            rows.append({"outcome": outcome, "predictor": predictor, **grouped_spearman(groups, seed=seed),
                         "per_seed": per_seed})
    return rows


def _fmt(x, digits=2):
    return "-" if x is None else f"{x:+.{digits}f}"


def markdown(rows: list[dict]) -> str:
    seeds = list(rows[0]["per_seed"])
    lines = ["| collaboration success | predictor | rho | 95% CI (runs resampled) | " +
             " | ".join(f"seed {s}" for s in seeds) + " | points / runs |",
             "|---|---|---|---|" + "---|" * len(seeds) + "---|"]
    for r in rows:
        ci = "-" if r["ci95"] is None else f"[{_fmt(r['ci95'][0])}, {_fmt(r['ci95'][1])}]"
        lines.append(f"| {r['outcome']} | {r['predictor']} | {_fmt(r['rho'])} | {ci} | "
                     + " | ".join(_fmt(r["per_seed"][s]) for s in seeds) + f" | {r['n_points']} / {r['n_groups']} |")
    return "\n".join(lines) + "\n"


def plot(pts: list[dict], rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = sorted({p["variant"] for p in pts})
    colors = {v: plt.cm.tab10(i % 10) for i, v in enumerate(variants)}
    markers = ["o", "s", "^", "D", "v"]
    seeds = sorted({p["seed"] for p in pts}, key=lambda s: (s is None, s or 0))
    fig, axes = plt.subplots(len(OUTCOMES), len(PREDICTORS), figsize=(12, 10), dpi=110, squeeze=False)
    for i, outcome in enumerate(OUTCOMES):
        for j, (predictor, (metric, t)) in enumerate(PREDICTORS.items()):
            ax = axes[i][j]
            for p in pts:
                x = _value(p, metric, t)
                if x is not None and p[outcome] is not None:
                    ax.scatter(x, p[outcome], color=colors[p["variant"]], marker=markers[seeds.index(p["seed"]) % 5],
                               s=22, alpha=0.75)
            r = next(r for r in rows if r["outcome"] == outcome and r["predictor"] == predictor)
            ci = "" if r["ci95"] is None else f" [{_fmt(r['ci95'][0])}, {_fmt(r['ci95'][1])}]"
            ax.set_title(f"rho {_fmt(r['rho'])}{ci}", fontsize=9)
            ax.set_xlabel(predictor, fontsize=8)
            ax.set_ylabel(f"success: {outcome}", fontsize=8)
            ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colors[v], marker="o", linestyle="", label=v) for v in variants]
    handles += [plt.Line2D([], [], color="gray", marker=markers[k % 5], linestyle="", label=f"seed {s}")
                for k, s in enumerate(seeds)]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle("Collaboration success against the probe, every checkpoint of every run", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 0.97))
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)


def write_correlation(dirs: list[str], out: str | Path, relabel: bool = False, seed: int = 0) -> list[dict]:
    """Correlate the checkpoints of `dirs` (see the module docstring) and write `correlation.json`, `correlation.md`
    and `correlation.png` to `out`; returns the correlation rows."""
    pts = points(dirs, relabel=relabel)
    rows = correlations(pts, seed=seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plot(pts, rows, out / "correlation.png")
    with atomic_open(out / "correlation.md") as f:
        f.write(markdown(rows))
    write_json(out / "correlation.json", {"correlations": rows, "points": pts})
    return rows

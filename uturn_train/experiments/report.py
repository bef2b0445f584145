"""`uturn report`: training runs side by side: follow-up and grounded follow-up rates against accuracy.

    uturn report outputs/ablations/testbed                      # an ablation folder (`uturn ablate --out`)
    uturn report outputs/sft-user outputs/dpo --out outputs/cmp  # run folders (a recipe's --output_dir)

Reads each run's `probe_history.jsonl` (one record per probed checkpoint), its samples `probe/step_<N>.jsonl`, the
mining card `pairs/mining_card.json` of DPO runs, and what `uturn ablate` saved (`ablation_run.json`: recipe, knobs,
exit code, wall time). Writes to `--out` (default: the one DIR given):

- `report.md`: per run, step 0, the last and the best checkpoint (the highest greedy grounded follow-up rate, or
  follow-up rate when the probe has no grounded one, among checkpoints within `--max_accuracy_drop` of step 0's
  accuracy; the one in `selection.json` for a run whose recipe chose its final checkpoint by a rule) with accuracy,
  greedy and T=1.0 rates and Wilson 95% intervals, and collaboration success per family where the run held
  conversations (`--probe_collab`); the mining cards; paired comparisons.
- `report.json`: the same numbers, and every checkpoint of every run.
- `pareto.png`: accuracy against the greedy grounded (or follow-up) rate, each run a trajectory over its checkpoints
  (the mean over its seeds), step 0 marked with a star, the Pareto front of all checkpoints dashed.

Across seeds ([`~uturn_train.experiments.seeds`]): the run folders of one ablation run on several seeds are pooled; per
run, every metric's mean over seeds, per-seed values and a two-level bootstrap interval (seeds, then prompts); between
runs, the difference of means with that interval and with a t-interval over the seeds' values (paired when both runs
hold the same seeds, Welch's otherwise), the seeds of B that beat A and the probability of improvement, starred only
when both intervals exclude 0 and both runs have two seeds or more (a bootstrap over two or three seeds alone is far
too narrow); an A/A check on halves of each run's seeds, which can flag nothing for a run of fewer than four seeds (a
half of one seed is never starred). The Pareto plot shows each run's mean over seeds with error bars of one sd.

Paired comparisons at prompt level (each run folder's last checkpoint against its step 0, and every two folders of the
same seed at their last checkpoints) use only the prompts both were probed on: the rate difference with a bootstrap 95%
interval over prompts ([`~uturn_train.stats.paired_bootstrap`]) and McNemar's exact test for accuracy. They see
prompt noise only: one training run per side.
"""

import json
import logging
import os
from itertools import combinations
from pathlib import Path

import numpy as np

from ..io import atomic_open, read_jsonl, write_json
from ..probe.history import HISTORY
from ..probe.record import FOLLOWUP, GROUNDED, SHARES, figure, temperature_label
from ..stats import BOOTSTRAP_RESAMPLES, paired_accuracy, paired_bootstrap
from ..training.selection import SELECTION
from .layout import CARD, MARKER, PLAN
from .markdown import checkpoint_rows, comparison_rows, render_markdown, seed_rows
from .seeds import cross_seed_report, group_seeds, spread, variant_of

logger = logging.getLogger(__name__)



def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def find_runs(dirs: list[str | Path]) -> list[Path]:
    """Run folders (holding `probe_history.jsonl`) among `dirs` and their direct subfolders, in ablation order."""
    runs = []
    for d in map(Path, dirs):
        if (d / HISTORY).exists():
            runs.append(d)
            continue
        if not d.is_dir():
            raise ValueError(f"{d}: no such folder; pass a run folder (a recipe's --output_dir) or an ablation folder")
        children = sorted(c for c in d.iterdir() if (c / HISTORY).exists())
        if not children:
            raise ValueError(f"{d}: no {HISTORY} in it or in its subfolders, so nothing was probed there; pass a run "
                             "folder (a recipe's --output_dir, trained with the probe on) or an ablation folder")
        order = [r["name"] for r in (_read_json(d / PLAN) or {}).get("runs", [])]
        runs += sorted(children, key=lambda c: (order.index(c.name) if c.name in order else len(order), c.name))
    return runs


def _checkpoint(record: dict) -> dict:
    keys = (FOLLOWUP, "ci95", GROUNDED, "grounded_ci95", *SHARES, "n")
    collab = {}
    for family, s in (record.get("collab") or {}).items():  # `probe_collab`: success per family, peer_check split
        collab[family] = {k: s[k] for k in ("success_rate", "ci95", "n")}
        if s.get("wrong_start"):
            collab[f"{family} wrong start"] = {k: s["wrong_start"][k] for k in ("success_rate", "ci95", "n")}
    return {"step": record["step"], "accuracy": record["accuracy"], "collab": collab,
            "settings": {f"{s['temperature']:g}": {k: s.get(k) for k in keys} for s in record["settings"]}}


def load_run(path: Path) -> dict:
    """One run: its probed checkpoints and what `uturn ablate` recorded about it."""
    records = sorted(read_jsonl(path / HISTORY), key=lambda r: r["step"])
    ok = [r for r in records if r.get("settings")]
    if not ok:
        raise ValueError(f"{path / HISTORY}: no successful probe record ({len(records)} records, errors: "
                         f"{sorted({r.get('error') for r in records} - {None})}); nothing to report for this run")
    marker = _read_json(path / MARKER)
    planned = next((r for r in (_read_json(path.parent / PLAN) or {}).get("runs", []) if r["name"] == path.name), None)
    info = marker or planned or {}
    if marker is not None:
        status = "done" if marker["exit_code"] == 0 else f"failed (exit {marker['exit_code']})"
    else:
        status = "incomplete (no marker)" if planned else "-"
    card = _read_json(path / CARD)
    selection = _read_json(path / SELECTION)  # the recipe's own choice of its final checkpoint (`select_metric`)
    mining = None
    if card is not None:
        # Scalars and the two summaries people read; label breakdowns and settings stay in the card.
        mining = {k: v for k, v in card.items() if isinstance(v, (int, float, str)) and k != "model"}
        mining.update(kind=card.get("kind"), policy={k: v for k, v in (card.get("policy") or {}).items()
                                                    if isinstance(v, (int, float)) or v is None})
    variant, seed = variant_of(path.name, info)
    knobs = info.get("knobs")
    if isinstance(knobs, dict):  # the seed has its own field
        knobs = {k: v for k, v in knobs.items() if k != "seed"}
    return {"name": path.name, "dir": str(path), "recipe": info.get("recipe"), "config": info.get("config"),
            "knobs": knobs, "variant": variant, "seed": seed, "status": status,
            "exit_code": (marker or {}).get("exit_code"), "wall_seconds": (marker or {}).get("wall_seconds"),
            "probe_errors": len(records) - len(ok), "mining": mining, "ablation": info.get("ablation"),
            "selection": None if selection is None else {k: selection.get(k) for k in ("step", "rule")}, "records": ok}


def pick_checkpoints(records: list[dict], metric: str, temperature: float, max_accuracy_drop: float) -> dict:
    """Step 0, the last and the best checkpoint (highest rate among those within `max_accuracy_drop` of step 0's
    accuracy; ties go to the higher accuracy, then the earlier step)."""
    first, last = records[0], records[-1]
    base = first["accuracy"] if first["step"] == 0 else None
    eligible = [r for r in records
                if base is None or r["accuracy"] is None or r["accuracy"] >= base - max_accuracy_drop]
    best = max(eligible, key=lambda r: (figure(r, metric, temperature) or 0.0, r["accuracy"] or 0.0, -r["step"]))
    return {"step0": first if first["step"] == 0 else None, "last": last, "best": best}


def _samples(run: dict, step: int) -> list[dict]:
    path = Path(run["dir"]) / "probe" / f"step_{step}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing")
    return read_jsonl(path)


def _indicators(rows: list[dict], temperature: float, field: str, source: str) -> dict[str, list[bool]]:
    out, seen = {}, set()
    for r in rows:
        if r["temperature"] != temperature:
            continue
        # Error rows (a failed request, a judge that could not label) and undefined grounded decisions are left out,
        # as the probe leaves them out of its rates.
        if r["label"] is None or (field != FOLLOWUP and r.get(field) is None):
            continue
        key = (r["id"], r["sample_index"])
        if key in seen:
            raise ValueError(f"{source}: prompt {r['id']} has two rows for T={temperature:g}, sample "
                             f"{r['sample_index']}; the file is not one probe's output")
        seen.add(key)
        out.setdefault(r["id"], []).append(r["label"] == "followup" if field == FOLLOWUP else bool(r[field]))
    return out


def compare(a: dict, step_a: int, b: dict, step_b: int, temperatures: list[float], seed: int = 0,
            resamples: int = BOOTSTRAP_RESAMPLES) -> dict:
    """Paired statistics of run `b` at `step_b` against run `a` at `step_a` on the prompts both were probed on."""
    result = {"a": {"run": a["name"], "step": step_a}, "b": {"run": b["name"], "step": step_b}, "rates": [],
              "accuracy": None, "skipped": None}
    try:
        rows_a, rows_b = _samples(a, step_a), _samples(b, step_b)
    except FileNotFoundError as e:
        result["skipped"] = str(e)
        return result
    src_a, src_b = f"{a['dir']}/probe/step_{step_a}.jsonl", f"{b['dir']}/probe/step_{step_b}.jsonl"
    if not {r["id"] for r in rows_a} & {r["id"] for r in rows_b}:
        result["skipped"] = "not probed on the same prompts"
        return result
    fields = [FOLLOWUP] + ([GROUNDED] if all("grounded" in r for r in rows_a + rows_b) else [])
    for t in temperatures:
        for field in fields:
            column = "grounded" if field == GROUNDED else field
            stats = paired_bootstrap(_indicators(rows_a, t, column, src_a), _indicators(rows_b, t, column, src_b),
                                     resamples=resamples, seed=seed)
            if stats["n_prompts"]:
                result["rates"].append({"temperature": t, "metric": field, **stats})
    correct = [{r["id"]: bool(r["answer_correct"]) for r in rows if r.get("answer_correct") is not None}
               for rows in (rows_a, rows_b)]
    if correct[0] and correct[1]:
        result["accuracy"] = paired_accuracy(*correct)
    return result


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (higher is better on both)."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    front, best_y = [], float("-inf")
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return sorted(front, key=lambda i: points[i][0])


def plot_pareto(variants: list[dict], path: Path, metric: str, temperature: float) -> list[dict]:
    """`pareto.png` (see the module docstring): per run (a variant of [`~uturn_train.experiments.seeds.group_seeds`]),
    its mean over seeds at every step all its seeds were probed at, with error bars of one sd over seeds and each
    seed's point faint; returns the front of the means."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training nodes
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    points, owners = [], []
    for variant in variants:
        steps = spread(variant["runs"], temperature, metric)
        if not steps:
            continue
        traj = [(float(np.mean(xs)), float(np.mean(ys)), step) for step, xs, ys in steps]
        n_seeds = len(variant["runs"])
        label = variant["name"] + (f" ({n_seeds} seeds)" if n_seeds > 1 else "")
        line, = ax.plot([p[0] for p in traj], [p[1] for p in traj], marker="o", alpha=0.8, label=label)
        if n_seeds > 1:
            ax.errorbar([p[0] for p in traj], [p[1] for p in traj], xerr=[np.std(xs, ddof=1) for _, xs, _ in steps],
                        yerr=[np.std(ys, ddof=1) for _, _, ys in steps], fmt="none", ecolor=line.get_color(),
                        alpha=0.5, capsize=2)
            ax.scatter([x for _, xs, _ in steps for x in xs], [y for _, _, ys in steps for y in ys], s=8,
                       color=line.get_color(), alpha=0.25)
        for x, y, step in traj[1:]:
            ax.annotate(str(step), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=line.get_color())
        if traj[0][2] == 0:
            ax.scatter(*traj[0][:2], marker="*", s=180, color="black", zorder=5,
                       label="step 0" if not any(o[1] == 0 for o in owners) else None)
        points += [p[:2] for p in traj]
        owners += [(variant["name"], p[2]) for p in traj]
    front = pareto_front(points)
    ax.plot([points[i][0] for i in front], [points[i][1] for i in front], drawstyle="steps-pre", linestyle="--",
            color="grey", label="Pareto front")
    name = "grounded follow-up rate" if metric == GROUNDED else "follow-up rate"
    ax.set_xlabel(f"{temperature_label(temperature)} {name}")
    ax.set_ylabel("accuracy (greedy answers)")
    ax.set_title("Follow-up vs accuracy per checkpoint, mean over seeds ± sd (numbers: training step)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return [{"run": owners[i][0], "step": owners[i][1], "rate": points[i][0], "accuracy": points[i][1]} for i in front]


def build_report(runs: list[dict], max_accuracy_drop: float = 0.05, seed: int = 0) -> dict:
    """Everything `report.json` holds but the Pareto front, from [`load_run`]'s runs (their names made unique and
    their checkpoints picked in place)."""
    names = [r["name"] for r in runs]
    for run in runs:  # the same run name in two ablations: tell them apart by their folder
        if names.count(run["name"]) > 1:
            run["name"] = f"{Path(run['dir']).parent.name}/{run['name']}"
    all_records = [rec for run in runs for rec in run["records"]]
    temperatures = sorted({s["temperature"] for rec in all_records for s in rec["settings"]})
    metric = GROUNDED if all(GROUNDED in s for rec in all_records for s in rec["settings"]) else FOLLOWUP
    x_temperature = temperatures[0]  # greedy when probed (0 sorts first)
    for run in runs:
        run["picked"] = pick_checkpoints(run["records"], metric, x_temperature, max_accuracy_drop)
        chosen = (run["selection"] or {}).get("step")
        if chosen is not None:  # the run's final adapter is the checkpoint its own rule chose: that one is its best
            run["picked"]["best"] = next((r for r in run["records"] if r["step"] == chosen), run["picked"]["best"])
        run["checkpoints"] = {k: None if r is None else _checkpoint(r) for k, r in run["picked"].items()}
    comparisons = [compare(run, run["checkpoints"]["step0"]["step"], run, run["checkpoints"]["last"]["step"],
                           temperatures, seed=seed)
                   for run in runs if run["checkpoints"]["step0"] and run["checkpoints"]["last"]["step"] != 0]
    # Prompt-level, between runs of the same seed (all runs, without seeds): across seeds, see `seed_comparisons`.
    comparisons += [compare(a, a["checkpoints"]["last"]["step"], b, b["checkpoints"]["last"]["step"], temperatures,
                            seed=seed) for a, b in combinations(runs, 2) if a["seed"] == b["seed"]]
    across = cross_seed_report(runs, metric, temperatures, seed=seed)
    ablations = {Path(run["dir"]).parent for run in runs}
    missing = [{"name": r["name"], "exit_code": (_read_json(d / r["name"] / MARKER) or {}).get("exit_code")}
               for d in ablations for r in (_read_json(d / PLAN) or {}).get("runs", [])
               if not (d / r["name"] / HISTORY).exists()]
    return {"metric": metric, "temperatures": temperatures, "x_temperature": x_temperature,
            "max_accuracy_drop": max_accuracy_drop, "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": seed},
            "runs": [{**{k: v for k, v in run.items() if k not in ("records", "picked")},
                      "trajectory": [_checkpoint(r) for r in run["records"]]} for run in runs],
            "comparisons": comparisons, **across, "missing_runs": missing, "pareto_front": None}


def write_report(dirs: list[str | Path], out: str | Path, max_accuracy_drop: float = 0.05, seed: int = 0,
                 wandb: bool = False) -> dict:
    """Write `report.md`, `report.json` and `pareto.png` to `out`; log them to W&B when a run is active or `wandb`.

    Args:
        dirs (`list[str | Path]`): run folders and/or ablation folders.
        out (`str | Path`): output folder, created if needed.
        max_accuracy_drop (`float`, *optional*, defaults to `0.05`): see [`pick_checkpoints`].
        seed (`int`, *optional*, defaults to `0`): bootstrap seed.
        wandb (`bool`, *optional*, defaults to `False`): start a W&B run for the report when none is active.

    Returns:
        `dict`: the contents of `report.json`.
    """
    import sys

    runs = [load_run(p) for p in find_runs(dirs)]
    report = build_report(runs, max_accuracy_drop=max_accuracy_drop, seed=seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if any(r["accuracy"] is not None for run in runs for r in run["records"]):
        report["pareto_front"] = plot_pareto(group_seeds(runs), out / "pareto.png", report["metric"],
                                             report["x_temperature"])
    with atomic_open(out / "report.md") as f:
        f.write(render_markdown(report))
    write_json(out / "report.json", report)
    if wandb or ("wandb" in sys.modules and sys.modules["wandb"].run is not None):
        log_to_wandb(report, out)
    return report


def log_to_wandb(report: dict, out: Path) -> None:
    """The checkpoint and comparison tables and the plot, to the active W&B run or to a new `report` run."""
    import wandb

    from ..tracking import wandb_offline_unless_logged_in

    started = wandb.run is None
    if started:
        wandb_offline_unless_logged_in(["wandb"], str(out))
        groups = {run["ablation"] for run in report["runs"]} - {None}
        group = groups.pop() if len(groups) == 1 else None
        wandb.init(project=os.environ.get("WANDB_PROJECT", "uturn"), group=group, job_type="report",
                   name=f"report-{group}" if group else "report")
    logs = {name: wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])
            for name, rows in (("report/checkpoints", checkpoint_rows(report)),
                               ("report/comparisons", comparison_rows(report)),
                               ("report/seeds", seed_rows(report))) if rows}
    if (out / "pareto.png").exists() and report["pareto_front"] is not None:
        logs["report/pareto"] = wandb.Image(str(out / "pareto.png"))
    wandb.log(logs)
    if started:
        wandb.finish()

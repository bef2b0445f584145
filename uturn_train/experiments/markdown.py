"""The report of [`~uturn_train.experiments.report.build_report`] as table rows (for W&B) and as markdown
(`report.md`)."""

from ..probe.record import FOLLOWUP, GROUNDED, SHARES, temperature_label
from .seeds import COLLAB, ONE_SEED, metrics_of

_CHECKPOINT_NAMES = {"step0": "step 0", "best": "best", "last": "last"}


def _knobs(knobs: dict | None) -> str:
    if not knobs:
        return "-"
    return ", ".join(f"{k}={'+'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in knobs.items())


def _has(report: dict, key: str) -> bool:
    return any(s.get(key) is not None
               for run in report["runs"] for c in run["trajectory"] for s in c["settings"].values())


def checkpoint_rows(report: dict) -> list[dict]:
    """One row per run and checkpoint (step 0, best, last; one row when two are the same step), raw numbers."""
    grounded, shares = _has(report, GROUNDED), [k for k in SHARES if _has(report, k)]
    collab = list(dict.fromkeys(f for run in report["runs"] for c in run["trajectory"] for f in c.get("collab", {})))
    rows = []
    for run in report["runs"]:
        kinds: dict[int, list[str]] = {}
        for kind in ("step0", "best", "last"):
            if run["checkpoints"][kind] is not None:
                kinds.setdefault(run["checkpoints"][kind]["step"], []).append(_CHECKPOINT_NAMES[kind])
        by_step = {c["step"]: c for c in run["trajectory"]}
        for step, names in sorted(kinds.items()):
            c = by_step[step]
            row = {"run": run["name"], "objective": run["recipe"] or "-", "knobs": _knobs(run["knobs"]),
                   "status": run["status"], "wall_seconds": run["wall_seconds"], "checkpoint": " = ".join(names),
                   "step": step, "accuracy": c["accuracy"]}
            for t in report["temperatures"]:
                s, tl = c["settings"].get(f"{t:g}", {}), temperature_label(t)
                metrics = [(FOLLOWUP, "ci95", "follow-up")] + ([(GROUNDED, "grounded_ci95", "grounded")] if grounded
                                                               else [])
                for key, ci, name in metrics:
                    ci95 = s.get(ci) or [None, None]
                    row.update({f"{name} {tl}": s.get(key), f"{name} {tl} ci_low": ci95[0],
                                f"{name} {tl} ci_high": ci95[1]})
                for key in shares:
                    row[f"{'distinct' if key == 'distinct_followups' else 'templates'} {tl}"] = s.get(key)
            for family in collab:
                r = c.get("collab", {}).get(family, {})
                ci95 = r.get("ci95") or [None, None]
                row.update({f"collab {family}": r.get("success_rate"), f"collab {family} ci_low": ci95[0],
                            f"collab {family} ci_high": ci95[1]})
            rows.append(row)
    return rows


def comparison_rows(report: dict) -> list[dict]:
    """One row per paired comparison and metric: rates (bootstrap interval) and accuracy (McNemar exact p)."""
    rows = []
    for c in report["comparisons"]:
        base = {"a": c["a"]["run"], "step_a": c["a"]["step"], "b": c["b"]["run"], "step_b": c["b"]["step"]}
        for r in c["rates"]:
            rows.append({**base, "metric": r["metric"], "temperature": r["temperature"], "n_prompts": r["n_prompts"],
                         "value_a": r["rate_a"], "value_b": r["rate_b"], "difference": r["difference"],
                         "ci_low": r["ci95"][0], "ci_high": r["ci95"][1], "only_a": None, "only_b": None,
                         "p_value": None})
        acc = c["accuracy"]
        if acc is not None and acc["n_prompts"]:
            rows.append({**base, "metric": "accuracy", "temperature": 0.0, "n_prompts": acc["n_prompts"],
                         "value_a": acc["accuracy_a"], "value_b": acc["accuracy_b"],
                         "difference": acc["accuracy_b"] - acc["accuracy_a"], "ci_low": None, "ci_high": None,
                         "only_a": acc["only_a"], "only_b": acc["only_b"], "p_value": acc["p_value"]})
    return rows


def _metric_name(metric: str, temperature: float | None) -> str:
    if metric == "accuracy" or metric in COLLAB:
        return metric
    short = {FOLLOWUP: "follow-up", GROUNDED: "grounded", "distinct_followups": "distinct",
             "distinct_templates": "templates"}[metric]
    return f"{temperature_label(temperature)} {short}"


def seed_rows(report: dict) -> list[dict]:
    """One row per comparison across seeds and metric (W&B's `report/seeds`), raw numbers."""
    rows = []
    for c in report.get("seed_comparisons", []):
        ci, prompts, seeds = (c[k] or [None, None] for k in ("ci95", "ci95_prompts", "ci95_seeds"))
        rows.append({"a": c["a"]["run"], "checkpoint_a": c["a"]["checkpoint"], "b": c["b"]["run"],
                     "checkpoint_b": c["b"]["checkpoint"], "metric": _metric_name(c["metric"], c["temperature"]),
                     "seeds_a": c["n_seeds"][0], "seeds_b": c["n_seeds"][1], "mean_a": c["mean_a"],
                     "mean_b": c["mean_b"], "difference": c["difference"], "ci_low": ci[0], "ci_high": ci[1],
                     "prompts_ci_low": prompts[0], "prompts_ci_high": prompts[1],
                     "seeds_ci_low": seeds[0], "seeds_ci_high": seeds[1], "seed_test": c["seed_test"],
                     "seeds_b_beating": c["seeds_beating"][0], "probability_of_improvement":
                     c["probability_of_improvement"], "significant": c["significant"]})
    return rows


def _num(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _rate(value, low, high) -> str:
    return "n/a" if value is None else f"{value:.3f} [{low:.2f}, {high:.2f}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _interval(ci, digits: int = 2, sign: str = "") -> str:
    return "-" if ci is None else f"[{ci[0]:{sign}.{digits}f}, {ci[1]:{sign}.{digits}f}]"


def _t_interval(c: dict) -> str:
    """The seed-level t-interval, `p` (paired) or `w` (Welch) and its degrees of freedom."""
    if c["ci95_seeds"] is None:
        return "-"
    return f"{_interval(c['ci95_seeds'], sign='+')} {c['seed_test'][0]}, df {c['seed_df']}"


def _seed_cell(m: dict) -> str:
    """`mean [low, high] (seed values)`: the interval when there is one, the values when there are several seeds."""
    values = ", ".join(f"{x['value']:.2f}" for x in m["per_seed"])
    return f"{m['mean']:.3f}" + (f" {_interval(m['ci95'])}" if m["ci95"] else "") + \
        (f" ({values})" if len(m["per_seed"]) > 1 else "")


def _seed_sections(report: dict) -> list[str]:
    """The runs across seeds, their differences and the A/A check (see [`~uturn_train.experiments.seeds`])."""
    boot = report["bootstrap"]
    lines = ["## Runs across seeds", "",
             ("Per run, each checkpoint (picked per seed) with the mean over seeds, the 95% interval of a two-level "
              f"bootstrap (seeds, then prompts; {boot['resamples']} resamples, seed {boot['seed']}) and the seeds' "
              "own values in parentheses. Distinct shares have no per-prompt value: mean and seeds only. *collab*: "
              "where runs held conversations with the oracle partner (`--probe_collab`), each family's success "
              "(peer_check also when the answer started wrong) and info_gap's share whose first turn asks, the "
              "tasks standing for the prompts."), ""]
    variants = report["variants"]
    present = {(m["metric"], m["temperature"]) for v in variants for c in v["checkpoints"].values() if c
               for m in c["metrics"]}
    names = [_metric_name(*m) for m in metrics_of(report["metric"], report["temperatures"]) if m in present]
    body = []
    for v in variants:
        label = f"{v['name']}" + (f" ({v['note']})" if v["note"] else "")
        seeds = ", ".join("-" if s is None else str(s) for s in v["seeds"])
        for kind in ("step0", "best", "last"):
            c = v["checkpoints"][kind]
            if c is None:
                continue
            steps = ", ".join(str(st["step"]) for st in c["steps"])
            cells = {_metric_name(m["metric"], m["temperature"]): _seed_cell(m) for m in c["metrics"]}
            body.append([label, seeds, _CHECKPOINT_NAMES[kind], steps, *[cells.get(n, "-") for n in names]])
    lines += _table(["run", "seeds", "checkpoint", "steps", *names], body) + [""]

    lines += ["## Differences across seeds", "",
              ("B against A: the difference of their means over seeds with the two-level interval (seeds of each "
               "side resampled, then the prompts, the same prompts for both sides), and beside it the interval with "
               "the seeds fixed (prompts only: what a prompt-level test sees). *seeds (t)*: the 95% t-interval over "
               "the seeds' values, paired (`p`) when both sides hold the same seeds, Welch's (`w`, degrees of freedom "
               "rounded down) otherwise; a bootstrap over two or three seeds is far too narrow on its own, the "
               "t-interval accounts for so few. *seeds of B beating A*: each seed of B against A's run of the same "
               "seed, or A's mean when A has no such seed. *P(B > A)*: the probability that a seed of B beats a seed "
               "of A (ties 1/2). `*`: both the two-level interval and the t-interval exclude 0, with two seeds or "
               f"more on each side; a run with one seed is never starred ({'`'}1 seed: training variance unknown`)."),
              ""]
    body = [[f"{c['a']['run']} @ {_CHECKPOINT_NAMES[c['a']['checkpoint']]}",
             f"{c['b']['run']} @ {_CHECKPOINT_NAMES[c['b']['checkpoint']]}",
             _metric_name(c["metric"], c["temperature"]), f"{c['n_seeds'][0]} / {c['n_seeds'][1]}",
             _num(c["mean_a"]), _num(c["mean_b"]),
             f"{c['difference']:+.3f} {_interval(c['ci95'], sign='+')}" + (" *" if c["significant"] else ""),
             _interval(c["ci95_prompts"], sign="+"), _t_interval(c), f"{c['seeds_beating'][0]}/{c['seeds_beating'][1]}",
             f"{c['probability_of_improvement']:.2f}", c["note"] or ""] for c in report["seed_comparisons"]]
    lines += (_table(["A", "B", "metric", "seeds", "A", "B", "B - A", "prompts only", "seeds (t)",
                      "seeds of B beating A", "P(B > A)", "note"], body) if body else ["(none)"]) + [""]

    aa = report["aa_check"]
    lines += ["## A/A check", ""]
    if not aa:
        return lines + ["No run has two seeds or more: no A/A check.", ""]
    called = sum(c["significant"] for c in aa)
    lines += [(f"Each run with two seeds or more, its seeds split in two halves, compared at the last checkpoint as "
               f"above: the halves are the same training, so a sound test calls none of them different. Called "
               f"different: {called} of {len(aa)}; two-level interval excluding 0: "
               f"{sum(c['excludes_zero'] for c in aa)} of {len(aa)}; t-interval excluding 0: "
               f"{sum(c['t_excludes_zero'] for c in aa)} of {len(aa)}."), ""]
    blind = list(dict.fromkeys(c["variant"] for c in aa if min(c["n_seeds"]) == 1))
    if blind:
        lines += [(f"{', '.join(blind)}: fewer than 4 seeds, so a half has one seed and is never starred: the check "
                   f"cannot flag anything for {'them' if len(blind) > 1 else 'it'}; 4 seeds or more make it "
                   "informative."), ""]
    body = [[c["a"]["run"], c["b"]["run"], _metric_name(c["metric"], c["temperature"]),
             f"{c['difference']:+.3f} {_interval(c['ci95'], sign='+')}", _interval(c["ci95_prompts"], sign="+"),
             _t_interval(c), "yes" if c["significant"] else "no",
             (c["note"] + ": the check cannot flag this") if min(c["n_seeds"]) == 1 else (c["note"] or "")]
            for c in aa]
    return lines + _table(["half A", "half B", "metric", "B - A", "prompts only", "seeds (t)", "called different",
                           "note"], body) + [""]


def render_markdown(report: dict) -> str:
    """`report.md`: the checkpoint table, the plot, the mining cards and the paired comparisons."""
    metric_name = "grounded follow-up rate" if report["metric"] == GROUNDED else "follow-up rate"
    x_name = f"{temperature_label(report['x_temperature'])} {metric_name}"
    groups = sorted({r["ablation"] for r in report["runs"]} - {None})
    lines = [f"# uturn report{': ' + ', '.join(groups) if groups else ''}", ""]
    if report["metric"] == FOLLOWUP:
        lines += [("The grounded follow-up rate is not available in these probe histories (probed before the "
                   "grounded decision existed, or by a probe without it): the follow-up rate stands in for it in the "
                   "best checkpoint and the plot."), ""]
    if any(len(v["seeds"]) > 1 for v in report["variants"]):
        lines += _seed_sections(report)
    else:
        lines += [f"Every run here has one seed ({ONE_SEED}): the comparisons below see prompt noise only. Several "
                  "seeds per run (`seeds` in the ablation file) give the differences across seeds.", ""]
    lines += ["## Checkpoints", "",
              (f"Rates are shares of all user turns with Wilson 95% intervals; accuracy is of the greedy answers. "
               f"*best*: the highest {x_name} among the checkpoints within {report['max_accuracy_drop']:g} accuracy "
               "of step 0, or the checkpoint a run's own rule chose as its final one (`selection.json`). *distinct*: "
               "distinct texts over the follow-ups; *templates*: distinct forms, numbers and the answer's own words "
               "masked (\"How did you get 24 apples?\" and \"How did you get 7 pages?\" are one). *collab*: success "
               "rate of the collaboration conversations held at that checkpoint (`--probe_collab`), per family."), ""]
    rows = checkpoint_rows(report)
    rate_columns = [k for k in (rows[0] if rows else {}) if k.startswith(("follow-up", "grounded", "collab"))
                    and not k.endswith(("ci_low", "ci_high"))]
    distinct_columns = [k for k in (rows[0] if rows else {}) if k.startswith(("distinct", "templates"))]
    header = ["run", "objective", "knobs", "status", "wall", "checkpoint", "step", "accuracy", *rate_columns,
              *[f"{k} (share of follow-ups)" for k in distinct_columns]]
    lines += _table(header, [
        [r["run"], r["objective"], r["knobs"], r["status"],
         "-" if r["wall_seconds"] is None else f"{r['wall_seconds'] / 60:.1f} min", r["checkpoint"], str(r["step"]),
         _num(r["accuracy"]), *[_rate(r[k], r[f"{k} ci_low"], r[f"{k} ci_high"]) for k in rate_columns],
         *[_num(r[k]) for k in distinct_columns]] for r in rows])
    lines.append("")
    if report["pareto_front"] is not None:
        front = ", ".join(f"{p['run']} step {p['step']}" for p in report["pareto_front"])
        lines += [f"![accuracy against {x_name}](pareto.png)", "", f"Pareto front: {front}.", ""]
    else:
        lines += [("No accuracy in these probe histories (a task without gold answers, or the heldout setting): "
                   "no Pareto plot."), ""]

    mined = [r for r in report["runs"] if r["mining"]]
    if mined:
        lines += ["## Mined pairs", ""]
        for run in mined:
            parts = [f"{k} " + (", ".join(f"{kk} {_num(vv) if isinstance(vv, float) else vv}" for kk, vv in v.items())
                                if isinstance(v, dict) else (_num(v) if isinstance(v, float) else str(v)))
                     for k, v in run["mining"].items() if v is not None]
            lines.append(f"- **{run['name']}**: " + "; ".join(parts))
        lines.append("")

    # Runs with several seeds: their per-seed prompt-level comparisons stay in report.json; the differences across
    # seeds above are the ones that include training variance.
    one_seed = {r for v in report["variants"] if len(v["seeds"]) == 1 for r in v["runs"]}
    several = len(one_seed) < len(report["runs"])
    lines += ["## Paired comparisons", "",
              ("B against A on the prompts both were probed on, one training run each: prompt noise only. Rates: the "
               f"difference with a bootstrap 95% interval (prompts resampled, {report['bootstrap']['resamples']} "
               f"resamples, seed {report['bootstrap']['seed']})."
               " Accuracy: McNemar's exact test on the prompts only one of the two answers correctly. "
               "`*`: the interval excludes 0, or p < 0.05."
               + (" Runs with several seeds: see the differences across seeds above; their per-seed comparisons "
                  "are in report.json (`comparisons`)." if several else "")), ""]
    comparisons = [r for r in comparison_rows(report) if r["a"] in one_seed and r["b"] in one_seed]
    body = []
    for r in comparisons:
        if r["metric"] == "accuracy":
            diff = f"{r['difference']:+.3f}" + (" *" if r["p_value"] < 0.05 else "")
            test = f"A only {r['only_a']}, B only {r['only_b']}: p = {r['p_value']:.3g}"
            metric = "accuracy"
        else:
            significant = r["ci_low"] > 0 or r["ci_high"] < 0
            diff = f"{r['difference']:+.3f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]" + (" *" if significant else "")
            test = "bootstrap"
            metric = f"{temperature_label(r['temperature'])} {'grounded' if r['metric'] == GROUNDED else 'follow-up'}"
        body.append([f"{r['a']} @ {r['step_a']}", f"{r['b']} @ {r['step_b']}", metric, str(r["n_prompts"]),
                     _num(r["value_a"]), _num(r["value_b"]), diff, test])
    lines += _table(["A", "B", "metric", "prompts", "A", "B", "B - A", "test"], body) if body else ["(none)"]
    lines.append("")

    notes = [f"{c['a']['run']} @ {c['a']['step']} vs {c['b']['run']} @ {c['b']['step']}: not compared, "
             f"{c['skipped']}" for c in report["comparisons"] if c["skipped"]]
    notes += [f"{r['name']}: {r['probe_errors']} probe(s) failed; their checkpoints are left out"
              for r in report["runs"] if r["probe_errors"]]
    notes += [f"{r['name']}: " + ("not run yet, or interrupted" if r["exit_code"] is None else
                                  f"exited with code {r['exit_code']}") + ", so no probe history"
              for r in report["missing_runs"]]
    if notes:
        lines += ["## Not in this report", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines)

"""The report of [`~uturn_train.report.build_report`] as table rows (for W&B) and as markdown (`report.md`)."""

GROUNDED, FOLLOWUP = "grounded_followup_rate", "followup_rate"
_CHECKPOINT_NAMES = {"step0": "step 0", "best": "best", "last": "last"}


def _temperature(t: float) -> str:
    return "greedy" if t == 0 else f"T={t:g}"


def _knobs(knobs: dict | None) -> str:
    if not knobs:
        return "-"
    return ", ".join(f"{k}={'+'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in knobs.items())


def _has(report: dict, key: str) -> bool:
    return any(s.get(key) is not None
               for run in report["runs"] for c in run["trajectory"] for s in c["settings"].values())


def checkpoint_rows(report: dict) -> list[dict]:
    """One row per run and checkpoint (step 0, best, last; one row when two are the same step), raw numbers."""
    grounded, distinct = _has(report, GROUNDED), _has(report, "distinct_followups")
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
                s = c["settings"].get(f"{t:g}", {})
                metrics = [(FOLLOWUP, "ci95", "follow-up")] + ([(GROUNDED, "grounded_ci95", "grounded")] if grounded
                                                               else [])
                for key, ci, name in metrics:
                    ci95 = s.get(ci) or [None, None]
                    row.update({f"{name} {_temperature(t)}": s.get(key), f"{name} {_temperature(t)} ci_low": ci95[0],
                                f"{name} {_temperature(t)} ci_high": ci95[1]})
                if distinct:
                    row[f"distinct {_temperature(t)}"] = s.get("distinct_followups")
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


def _num(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _rate(value, low, high) -> str:
    return "n/a" if value is None else f"{value:.3f} [{low:.2f}, {high:.2f}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def render_markdown(report: dict) -> str:
    """`report.md`: the checkpoint table, the plot, the mining cards and the paired comparisons."""
    metric_name = "grounded follow-up rate" if report["metric"] == GROUNDED else "follow-up rate"
    x_name = f"{_temperature(report['x_temperature'])} {metric_name}"
    groups = sorted({r["ablation"] for r in report["runs"]} - {None})
    lines = [f"# uturn report{': ' + ', '.join(groups) if groups else ''}", ""]
    if report["metric"] == FOLLOWUP:
        lines += [("The grounded follow-up rate is not available in these probe histories (probed before the "
                   "grounded decision existed, or by a probe without it): the follow-up rate stands in for it in the "
                   "best checkpoint and the plot."), ""]
    lines += ["## Checkpoints", "",
              (f"Rates are shares of all user turns with Wilson 95% intervals; accuracy is of the greedy answers. "
               f"*best*: the highest {x_name} among the checkpoints within {report['max_accuracy_drop']:g} accuracy "
               "of step 0."), ""]
    rows = checkpoint_rows(report)
    rate_columns = [k for k in (rows[0] if rows else {}) if k.startswith(("follow-up", "grounded"))
                    and not k.endswith(("ci_low", "ci_high"))]
    distinct_columns = [k for k in (rows[0] if rows else {}) if k.startswith("distinct")]
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

    lines += ["## Paired comparisons", "",
              ("B against A on the prompts both were probed on. Rates: the difference with a bootstrap 95% interval "
               f"(prompts resampled, {report['bootstrap']['resamples']} resamples, "
               f"seed {report['bootstrap']['seed']})."
               " Accuracy: McNemar's exact test on the prompts only one of the two answers correctly. "
               "`*`: the interval excludes 0, or p < 0.05."), ""]
    comparisons = comparison_rows(report)
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
            metric = f"{_temperature(r['temperature'])} {'grounded' if r['metric'] == GROUNDED else 'follow-up'}"
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

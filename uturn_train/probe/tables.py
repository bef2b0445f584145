"""The probe's figures as rich tables that read whole at 80 columns (a log file, a narrow terminal): a probe's rates per
temperature (`uturn probe`), and its history per checkpoint (the recipes' closing table)."""

from pathlib import Path

from .rules.classify import LABELS


def rate_ci(rate: float | None, ci: list[float] | None) -> str:
    """A rate over its 95% interval, on two lines so a table of them stays within 80 columns."""
    return "-" if rate is None else f"{rate:.3f}\n[{ci[0]:.2f}, {ci[1]:.2f}]"


def probe_tables(result: dict) -> list:
    """The probe's figures as rich tables that read whole at 80 columns: rates (each over its 95% interval), then the
    share of each label."""
    from rich import box
    from rich.table import Table

    short = {"followup": "follow", "acknowledgement": "ack", "identity_drift": "drift", "repetition": "repeat",
             "new_topic": "new", "empty": "empty", "degenerate": "degen"}
    model = Path(str(result.get("model", ""))).name  # a path's last part: the title stays on one line at 80 columns
    rates = Table(title=f"{model} · {result.get('task', '')} · {result['setting']} · "
                        f"{result['n_prompts']} prompts", box=box.SIMPLE_HEAD,
                  show_lines=True, show_edge=False, collapse_padding=True)
    shares = Table(title="Share of each label", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for table, cols in ((rates, ["T", "k", "n", "errors", "follow-up\n[95% CI]", "grounded\n[95% CI]", "distinct",
                                 "templates"]),
                        (shares, ["T", *[short[label] for label in LABELS]])):
        for col in cols:
            table.add_column(col, justify="right")
    labeler = result.get("labeler", "rules")
    for entry in result["settings"]:
        # With both labelers, a second line per temperature holds the judge's figures.
        first = labeler if labeler in ("judge", "trained") else "rules"
        for name, s in ((first, entry), ("judge", entry.get("judge"))):
            if s is None:
                continue
            t = f"{s['temperature']:g}{'' if labeler == 'rules' else ' ' + name}"
            rates.add_row(t, str(s["samples"]), str(s["n"]), str(s["errors"]),
                          rate_ci(s["followup_rate"], s["ci95"]),
                          rate_ci(s.get("grounded_followup_rate"), s.get("grounded_ci95")),
                          *["-" if s.get(k) is None else f"{s[k]:.3f}" for k in ("distinct_followups",
                                                                                  "distinct_templates")])
            shares.add_row(t, *[f"{s['categories'][label]:.2f}" for label in LABELS])
    return [rates, shares] if result["settings"] else []


def print_table(result: dict) -> None:
    from rich.console import Console

    console = Console()
    for table in probe_tables(result):
        console.print(table)
    if result["accuracy"] is not None:
        console.print(f"accuracy {result['accuracy']:.3f}  (lm-eval strict-match {result['accuracy_strict']:.3f}, "
                      f"flexible-extract {result['accuracy_flexible']:.3f})")
    for name in ("server", "judge"):
        if name in result:
            console.print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in result[name].items()))
    if result.get("answer_errors"):
        console.print(f"{result['answer_errors']} answers failed: their user turns are error rows, left out of "
                      "every rate (see `error` in samples.jsonl)")


def history_tables(records: list[dict], title: str = "") -> list:
    """The probe history as a rich table that reads whole at 80 columns (a log file, a narrow terminal): one row per
    checkpoint and temperature, each rate over its 95% interval; probe errors follow as lines under it."""
    from rich import box
    from rich.table import Table

    temperatures = [s["temperature"] for s in next((r for r in records if r["settings"]), records[0])["settings"]]
    table = Table(title=f"User-turn probe per checkpoint{' · ' + title if title else ''}", box=box.SIMPLE_HEAD,
                  show_lines=True, show_edge=False, collapse_padding=True)
    for col in ["step", "T", "accuracy", "follow-up\n[95% CI]", "grounded\n[95% CI]", "distinct", "templates",
                "seconds"]:
        table.add_column(col, justify="right")
    for r in records:
        by_t = {s["temperature"]: s for s in r["settings"]}
        for i, t in enumerate(temperatures):
            s = by_t.get(t, {})
            accuracy = "" if i else "-" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
            table.add_row(str(r["step"]), f"{t:g}", accuracy,
                          rate_ci(s.get("followup_rate"), s.get("ci95")),
                          rate_ci(s.get("grounded_followup_rate"), s.get("grounded_ci95")),
                          *["-" if s.get(k) is None else f"{s[k]:.3f}" for k in ("distinct_followups",
                                                                                  "distinct_templates")],
                          "" if i else f"{r['seconds']:.0f}")
    return [table, *[f"step {r['step']}: {r['error']}" for r in records if r["error"]]]

"""`probe_history.jsonl`: one record per probed checkpoint, written by the callback, read back for tables and plots."""

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

HISTORY = "probe_history.jsonl"


def read_probe_history(output_dir: str | Path) -> list[dict]:
    path = Path(output_dir) / HISTORY
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def history_tables(records: list[dict], title: str = "") -> list:
    """The probe history as a rich table that reads whole at 80 columns (a log file, a narrow terminal): one row per
    checkpoint and temperature, each rate over its 95% interval; probe errors follow as lines under it."""
    from rich import box
    from rich.table import Table

    from .job import rate_ci

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


def report_probe_history(output_dir: str | Path, title: str = "") -> list[dict]:
    """Print the probe history as tables and plot it to `output_dir/probe_history.png`; returns the records."""
    from rich.console import Console

    from .plot import plot_probe_history

    records = read_probe_history(output_dir)
    if not records:
        logger.warning("no probe history in %s (probe off?)", output_dir)
        return records
    console = Console()
    for part in history_tables(records, title):
        console.print(part)
    plot_probe_history(records, Path(output_dir) / "probe_history.png", title=title)
    return records

"""`probe_history.jsonl`: one record per probed checkpoint, written by the callback, read back for tables and plots."""

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

HISTORY = "probe_history.jsonl"


def read_probe_history(output_dir: str | Path) -> list[dict]:
    path = Path(output_dir) / HISTORY
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def report_probe_history(output_dir: str | Path, title: str = "") -> list[dict]:
    """Print the probe history as a table and plot it to `output_dir/probe_history.png`; returns the records."""
    from rich.console import Console
    from rich.table import Table

    from .job import rate_with_ci
    from .plot import plot_probe_history

    records = read_probe_history(output_dir)
    if not records:
        logger.warning("no probe history in %s (probe off?)", output_dir)
        return records
    temperatures = [s["temperature"] for s in next((r for r in records if r["settings"]), records[0])["settings"]]
    table = Table(title=f"User-turn probe per checkpoint{' · ' + title if title else ''}")
    columns = [f"{kind} T={t:g}" for t in temperatures for kind in ("follow-up", "grounded", "distinct", "templates")]
    for col in ["step", "accuracy", *columns, "seconds", "error"]:
        table.add_column(col, justify="right")
    for r in records:
        by_t = {s["temperature"]: s for s in r["settings"]}
        cells = []
        for t in temperatures:
            s = by_t.get(t, {})
            cells += [rate_with_ci(s.get("followup_rate"), s.get("ci95")),
                      rate_with_ci(s.get("grounded_followup_rate"), s.get("grounded_ci95")),
                      *["-" if s.get(k) is None else f"{s[k]:.2f}" for k in ("distinct_followups",
                                                                          "distinct_templates")]]
        table.add_row(str(r["step"]), "-" if r["accuracy"] is None else f"{r['accuracy']:.3f}", *cells,
                      f"{r['seconds']:.0f}", r["error"] or "")
    Console().print(table)
    plot_probe_history(records, Path(output_dir) / "probe_history.png", title=title)
    return records

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

    from .plot import plot_probe_history

    records = read_probe_history(output_dir)
    if not records:
        logger.warning("no probe history in %s (probe off?)", output_dir)
        return records
    temperatures = [s["temperature"] for s in next((r for r in records if r["settings"]), records[0])["settings"]]
    table = Table(title=f"User-turn probe per checkpoint{' · ' + title if title else ''}")
    for col in ["step", "accuracy", *[f"follow-up T={t:g} [95% CI]" for t in temperatures], "seconds", "error"]:
        table.add_column(col, justify="right")
    for r in records:
        by_t = {s["temperature"]: s for s in r["settings"]}
        rates = [f"{by_t[t]['followup_rate']:.3f} [{by_t[t]['ci95'][0]:.2f}, {by_t[t]['ci95'][1]:.2f}]"
                 if t in by_t else "-" for t in temperatures]
        table.add_row(str(r["step"]), "-" if r["accuracy"] is None else f"{r['accuracy']:.3f}", *rates,
                      f"{r['seconds']:.0f}", r["error"] or "")
    Console().print(table)
    plot_probe_history(records, Path(output_dir) / "probe_history.png", title=title)
    return records

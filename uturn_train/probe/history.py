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
    """Print the probe history as tables and plot it to `output_dir/probe_history.png`; returns the records."""
    from rich.console import Console

    from .plot import plot_probe_history
    from .tables import history_tables

    records = read_probe_history(output_dir)
    if not records:
        logger.warning("no probe history in %s (probe off?)", output_dir)
        return records
    console = Console()
    for part in history_tables(records, title):
        console.print(part)
    plot_probe_history(records, Path(output_dir) / "probe_history.png", title=title)
    return records

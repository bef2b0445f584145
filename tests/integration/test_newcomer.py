"""What a newcomer meets after the README's main job: the test command's `ruff check` still passes beside the folders
the job leaves behind, W&B's files go with the run, and the printed tables read whole at 80 columns (issue 21)."""

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from uturn_train.probe.rules.classify import LABELS
from uturn_train.probe.tables import history_tables, probe_tables
from uturn_train.tracking import wandb_offline_unless_logged_in

RUN = "offline-run-20261201_120000-abc123"
LEFT_BEHIND = ["wandb/debug.log", f"wandb/{RUN}/files/config.yaml", f"wandb/{RUN}/run-abc123.wandb",
               f"outputs/testbed-collab-dpo/wandb/{RUN}/files/config.yaml",
               "outputs/testbed-collab-dpo/probe_history.jsonl"]


def ruff(cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *extra], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_ruff_passes_beside_what_the_main_job_leaves_behind(tmp_path):
    tree = tmp_path / "checkout"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".venv", ".git", "wandb", "outputs", "__pycache__",
                                                              "*.egg-info", ".pytest_cache", ".ruff_cache"))
    for name in LEFT_BEHIND:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("")
    proc = ruff(tree)
    assert proc.returncode == 0, proc.stdout[-3000:]
    # The check is live: with ruff's default view (every root folder first-party) the same tree fails, as it did.
    old = ruff(tree, "--config", "src = ['.']")
    assert old.returncode != 0 and "I001" in old.stdout, "the copied tree no longer shows the wandb/ import clash"


def test_wandb_files_go_to_the_output_dir_unless_wandb_dir_is_set(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb_offline_unless_logged_in(["none"], str(tmp_path / "a"))
    assert "WANDB_DIR" not in os.environ and not (tmp_path / "a").exists()
    wandb_offline_unless_logged_in(["wandb"], str(tmp_path / "b"))
    assert os.environ["WANDB_DIR"] == str(tmp_path / "b") and (tmp_path / "b").is_dir()
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "mine"))
    wandb_offline_unless_logged_in(["wandb"], str(tmp_path / "c"))
    assert os.environ["WANDB_DIR"] == str(tmp_path / "mine")


def render(parts) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=80, color_system=None)
    for part in parts:
        console.print(part)
    return console.file.getvalue()


def setting(t: float, rate: float) -> dict:
    return {"temperature": t, "samples": 4, "n": 800, "errors": 0, "followup_rate": rate, "ci95": [0.271, 0.402],
            "grounded_followup_rate": rate / 2, "grounded_ci95": [0.2111, 0.3444], "distinct_followups": 0.385,
            "distinct_templates": 0.031, "categories": dict.fromkeys(LABELS, 1 / len(LABELS))}


@pytest.mark.parametrize("steps", [[0, 60], [0, 1000, 12000]])
def test_history_table_reads_whole_at_80_columns(steps):
    records = [{"step": s, "accuracy": 0.575, "seconds": 1234.0, "settings": [setting(0.0, 1.0), setting(1.0, 0.18)],
                "error": None} for s in steps]
    records[-1]["error"] = "probe failed: CUDA out of memory while generating the user turns of 200 prompts"
    text = render(history_tables(records, title="testbed · collab DPO"))
    assert "…" not in text and max(map(len, text.splitlines())) <= 80, text
    for header in ("accuracy", "follow-up", "grounded", "distinct", "templates", "[0.27, 0.40]", "[0.21, 0.34]",
                   f"step {steps[-1]}: probe failed: CUDA out of memory"):
        assert header in text, (header, text)
    assert text.count(" 0.575 ") == len(steps)  # accuracy once per checkpoint, not per temperature


def test_probe_table_reads_whole_at_80_columns():
    result = {"model": "smollm2-135m-instruct", "task": "gsm8k", "setting": "self", "n_prompts": 48,
              "labeler": "both", "settings": [{**setting(0.0, 0.479), "judge": setting(0.0, 0.4)}, setting(1.0, 0.3)]}
    text = render(probe_tables(result))
    assert "…" not in text and max(map(len, text.splitlines())) <= 80, text
    for cell in ("0.479", "1 rules", "0 judge", "[0.27, 0.40]", "degen", "templates"):
        assert cell in text, (cell, text)

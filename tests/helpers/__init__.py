"""Pieces the tests share: the repository's paths, tiny offline models (`tiny`), servers (`serve`), W&B record readers
(`wandb_records`), hand-made data (`conversations`, `report_runs`, `grounding_cases`), `uturn ablate`'s pieces
(`ablation`), the recipes as modules (`load_recipe`), and the scripts the multi-process tests launch
(`train_with_probe`, `zero3_*`)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
HELPERS = Path(__file__).resolve().parent
FIXTURES = ROOT / "tests" / "fixtures"
ARITHMETIC = FIXTURES / "arithmetic.jsonl"  # GSM8K format, in the repo


def load_recipe(name: str):
    """`recipes/<name>.py` as a module (the recipes are scripts, not part of the package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

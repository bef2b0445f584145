"""Weights & Biases: offline unless the user is logged in, its files beside the run's outputs."""

import logging
import netrc
import os
from urllib.parse import urlparse

logger = logging.getLogger(__name__)


def wandb_offline_unless_logged_in(report_to, output_dir: str | None = None) -> None:
    """Offline W&B when the user is not logged in: online mode without a reachable server hangs.

    W&B writes its run folder to `$WANDB_DIR/wandb` (default: the working directory). Unless the user set
    `WANDB_DIR`, it goes to `output_dir/wandb`, beside the run it records: a `wandb/` folder at the repository root
    would otherwise be taken by ruff's isort for a first-party module and reorder `import wandb` (issue 21).
    """
    if "wandb" not in (report_to or []):
        return
    if output_dir and not os.environ.get("WANDB_DIR"):
        os.makedirs(output_dir, exist_ok=True)
        os.environ["WANDB_DIR"] = os.path.abspath(output_dir)
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        logged_in = netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        logged_in = False
    if not logged_in:
        os.environ["WANDB_MODE"] = "offline"
        logger.warning("W&B: not logged in (no WANDB_API_KEY, no %s in ~/.netrc), so logging offline; upload the "
                       "run later with `wandb sync`", host)


def name_run_by_seed(training_args) -> None:
    """Adds `-seed<N>` to a `run_name` that has no seed in it, so that `--seed 1` and `--seed 2` of one YAML are two
    W&B runs with two names (the ablation's `<run>-seed<N>` names are kept as they are)."""
    import re

    name = training_args.run_name
    if name and not re.search(r"-seed\d+$", name):
        training_args.run_name = f"{name}-seed{training_args.seed}"

"""Weights & Biases: offline unless the user is logged in."""

import logging
import netrc
import os
from urllib.parse import urlparse

logger = logging.getLogger(__name__)


def wandb_offline_unless_logged_in(report_to) -> None:
    """Offline W&B when the user is not logged in: online mode without a reachable server hangs."""
    if "wandb" not in (report_to or []) or os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
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

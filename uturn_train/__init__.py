"""uturn-train: collaboration fine-tuning with a user-turn probe (arXiv 2604.02315)."""

from . import _moved

__version__ = "0.2.0"
_moved.install()  # the modules that moved in 0.2 keep their old names for one release

__all__ = ["ProbeArguments", "UserTurnProbeCallback", "classify_turn", "Verdict", "run_probe"]


def __getattr__(name):
    # Lazy: `uturn classify` and the classifier must not pay for importing torch and transformers.
    if name in ("ProbeArguments", "UserTurnProbeCallback"):
        from .training import callback

        return getattr(callback, name)
    if name in ("classify_turn", "Verdict"):
        from .probe.rules import classify

        return getattr(classify, name)
    if name == "run_probe":
        from .probe.runner import run_probe

        return run_probe
    raise AttributeError(f"module 'uturn_train' has no attribute {name!r}")

"""Paired statistics for two models probed on the same prompts: is a difference a real gain or noise?

The unit of resampling is the prompt: the user turns sampled for one prompt share its query and answer, so they are
not independent draws, and the same prompts were given to both models, so the comparison is paired.
"""

import math

import numpy as np

BOOTSTRAP_RESAMPLES = 2000


def paired_bootstrap(a: dict[str, list[bool]], b: dict[str, list[bool]], resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = 0) -> dict:
    """Difference of rates `b - a` over the prompts both hold, with a percentile bootstrap 95% interval.

    Args:
        a, b (`dict[str, list[bool]]`): per prompt id, one indicator per user turn (one greedy turn, or the samples
            drawn at a temperature). Each prompt weighs the same: its rate is the mean of its indicators.
        resamples (`int`, *optional*, defaults to `2000`): bootstrap resamples of the prompts (with replacement).
        seed (`int`, *optional*, defaults to `0`): seed of `numpy.random.default_rng`.

    Returns:
        `dict`: `n_prompts`, `rate_a`, `rate_b`, `difference` (b - a) and `ci95` ([low, high]); `None` values when
        no prompt is shared.
    """
    ids = sorted(set(a) & set(b))
    if not ids:
        return {"n_prompts": 0, "rate_a": None, "rate_b": None, "difference": None, "ci95": None}
    rate_a = np.array([np.mean(a[i]) for i in ids], dtype=float)
    rate_b = np.array([np.mean(b[i]) for i in ids], dtype=float)
    diff = rate_b - rate_a
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(ids), size=(resamples, len(ids)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"n_prompts": len(ids), "rate_a": float(rate_a.mean()), "rate_b": float(rate_b.mean()),
            "difference": float(diff.mean()), "ci95": [float(low), float(high)]}


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts: under the null, each of the `only_a + only_b`
    prompts that exactly one model gets right is equally likely to be either model's, so the smaller count is
    Binomial(n, 1/2); 1.0 when there is no discordant prompt."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_accuracy(a: dict[str, bool], b: dict[str, bool]) -> dict:
    """Accuracy of both models on the prompts both graded, the discordant counts and McNemar's exact p-value.

    Returns:
        `dict`: `n_prompts`, `accuracy_a`, `accuracy_b`, `only_a` (prompts only a got right), `only_b`, `p_value`.
    """
    ids = sorted(set(a) & set(b))
    if not ids:
        return {"n_prompts": 0, "accuracy_a": None, "accuracy_b": None, "only_a": 0, "only_b": 0, "p_value": None}
    only_a = sum(a[i] and not b[i] for i in ids)
    only_b = sum(b[i] and not a[i] for i in ids)
    return {"n_prompts": len(ids), "accuracy_a": sum(a[i] for i in ids) / len(ids),
            "accuracy_b": sum(b[i] for i in ids) / len(ids), "only_a": only_a, "only_b": only_b,
            "p_value": mcnemar_exact(only_a, only_b)}

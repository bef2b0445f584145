"""Follow-up rates with Wilson intervals, per decoding setting and across temperatures."""

import math
from collections import Counter

from .classify import LABELS


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default); (0, 1) when `n == 0`.

    Preferred over the normal approximation because follow-up rates sit near 0, where that one leaves [0, 1].
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize_setting(temperature: float, samples: int, labels: list[str]) -> dict:
    """One entry of `results.json`'s `settings`: every sample counts in `n`, empty and degenerate ones included."""
    n = len(labels)
    counts = Counter(labels)
    unknown = set(counts) - set(LABELS)
    if unknown:
        raise ValueError(f"unknown labels {sorted(unknown)}; expected one of {LABELS}")
    followups = counts["followup"]
    lo, hi = wilson_interval(followups, n)
    return {
        "temperature": temperature,
        "samples": samples,
        "followup_rate": followups / n if n else None,
        "ci95": [lo, hi],
        "n": n,
        "categories": {label: (counts[label] / n if n else 0.0) for label in LABELS},
    }


def across_temperatures(settings: list[dict]) -> dict:
    """The maximum and mean follow-up rate over the probed temperatures (the paper reports the maximum)."""
    rates = [s["followup_rate"] for s in settings if s["followup_rate"] is not None]
    if not rates:
        return {"followup_rate_max": None, "followup_rate_mean": None}
    return {"followup_rate_max": max(rates), "followup_rate_mean": sum(rates) / len(rates)}

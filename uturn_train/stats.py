"""Paired statistics for two models probed on the same prompts: is a difference a real gain or noise?

The unit of resampling is the prompt: the user turns sampled for one prompt share its query and answer, so they are
not independent draws, and the same prompts were given to both models, so the comparison is paired.
"""

import math
from statistics import NormalDist

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
# Student's t 0.975 quantiles for 1..30 degrees of freedom (scipy is not a dependency).
T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604,
        2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
        2.0518, 2.0484, 2.0452, 2.0423)


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


# Training variance. A run is one draw of its seed; the figures below treat the seeds of a run as the sample of
# training outcomes (Henderson et al. 2018; Agarwal et al. 2021, `rliable`) and the prompts as a second, crossed level.


def two_level_bootstrap(a: list[dict[str, float]], b: list[dict[str, float]] | None = None,
                        paired_seeds: bool = False, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict:
    """Mean over seeds of a per-prompt metric (or the difference of two such means, `b - a`) with a percentile
    bootstrap 95% interval over seeds and prompts.

    Each resample draws the seeds of each side with replacement, then the prompts with replacement. One draw of prompts
    serves every seed and both sides: they were all probed on the same prompts, so prompt difficulty is shared (it
    does not average out over seeds) and cancels in a difference, as in [`paired_bootstrap`]. `ci95_prompts` keeps the
    seeds fixed and resamples prompts only: the interval a prompt-level test gives, blind to training variance.

    Args:
        a, b (`list[dict[str, float]]`): per seed, per prompt id, the prompt's value (its rate over its turns, or 1/0
            for a correct answer). Only the prompts every seed of both sides holds count.
        paired_seeds (`bool`, *optional*, defaults to `False`): `a[i]` and `b[i]` are the same seed (a run's step 0
            and its last checkpoint): draw the same seed indices for both.
        resamples (`int`, *optional*, defaults to `2000`): bootstrap resamples.
        seed (`int`, *optional*, defaults to `0`): seed of `numpy.random.default_rng`; it draws the prompts, then the
            seeds of `a`, then those of `b`.

    Returns:
        `dict`: `n_seeds` (per side), `n_prompts`, `value` (the mean, or the difference of means), `ci95` and
        `ci95_prompts` ([low, high]); `None` values when no prompt is shared.
    """
    sides = [a] if b is None else [a, b]
    if paired_seeds and (b is None or len(a) != len(b)):
        raise ValueError(f"paired_seeds needs the same seeds on both sides, got {len(a)} and {len(b or [])}")
    n_seeds = [len(side) for side in sides]
    ids = sorted(set.intersection(*(set(values) for side in sides for values in side))) if all(n_seeds) else []
    if not ids:
        return {"n_seeds": n_seeds, "n_prompts": 0, "value": None, "ci95": None, "ci95_prompts": None}
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, len(ids), size=(resamples, len(ids)))
    seed_draws = [rng.integers(0, len(side), size=(resamples, len(side))) for side in sides]
    if paired_seeds:
        seed_draws[1] = seed_draws[0]
    means, fixed, point = [], [], []
    for side, draw in zip(sides, seed_draws):
        x = np.array([[values[i] for i in ids] for values in side], dtype=float)  # seeds x prompts
        per_seed = x[:, prompts].mean(axis=2)  # seeds x resamples: each seed's mean over the drawn prompts
        means.append(np.take_along_axis(per_seed.T, draw, axis=1).mean(axis=1))
        fixed.append(per_seed.mean(axis=0))
        point.append(x.mean())
    sign = [1.0] if b is None else [-1.0, 1.0]
    both, prompt_only = sum(s * m for s, m in zip(sign, means)), sum(s * m for s, m in zip(sign, fixed))
    return {"n_seeds": n_seeds, "n_prompts": len(ids), "value": float(sum(s * p for s, p in zip(sign, point))),
            "ci95": [float(v) for v in np.percentile(both, [2.5, 97.5])],
            "ci95_prompts": [float(v) for v in np.percentile(prompt_only, [2.5, 97.5])]}


def t_quantile_975(df: int) -> float:
    """Student's t 0.975 quantile: the table up to 30 degrees of freedom, beyond it the normal's with the first two
    terms of the Cornish-Fisher expansion (within 1e-4 of the exact value there)."""
    if df < 1:
        raise ValueError(f"t quantile: expected degrees of freedom >= 1, got {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = NormalDist().inv_cdf(0.975)
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def seed_t_interval(a: dict, b: dict) -> dict:
    """Difference of the mean over seeds `b - a` with a 95% t-interval over seeds: the seed-level test.

    A percentile bootstrap over two or three seeds draws from two or three values, so its intervals are far too narrow
    (an A/A simulation with 2-3 seeds per side excluded 0 in 21-27% of trials); Student's t accounts for estimating the
    spread from so few seeds. When both sides hold the same seeds (two or more: a run's step 0 and its last checkpoint,
    or two runs trained on the same seeds), a paired t on the per-seed differences; otherwise Welch's t with the
    Welch-Satterthwaite degrees of freedom rounded down.

    Args:
        a, b (`dict`): value per seed (each seed's mean over the prompts).

    Returns:
        `dict`: `test` (`"paired"` or `"welch"`), `difference`, `df` and `ci95` ([low, high]); `ci95` and `df` are
        None when a side has fewer than two seeds.
    """
    paired = set(a) == set(b) and None not in a and len(a) >= 2
    if paired:
        d = np.array([b[s] - a[s] for s in sorted(a)], dtype=float)
        difference, df = float(d.mean()), len(d) - 1
        se = float(d.std(ddof=1)) / math.sqrt(len(d))
    else:
        xa, xb = np.array(list(a.values()), dtype=float), np.array(list(b.values()), dtype=float)
        difference = float(xb.mean() - xa.mean()) if len(xa) and len(xb) else None
        if min(len(xa), len(xb)) < 2:
            return {"test": "welch", "difference": difference, "df": None, "ci95": None}
        va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
        se = math.sqrt(va + vb)
        if se == 0:  # no spread on either side: the degrees of freedom of the pooled test
            df = len(xa) + len(xb) - 2
        else:
            df = max(1, math.floor((va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1)) + 1e-9))
    half = t_quantile_975(df) * se
    return {"test": "paired" if paired else "welch", "difference": difference, "df": df,
            "ci95": [difference - half, difference + half]}


def excludes_zero(ci95: list[float] | None) -> bool:
    return ci95 is not None and (ci95[0] > 0 or ci95[1] < 0)


def probability_of_improvement(a: list[float], b: list[float]) -> float:
    """P(X_b > X_a) for a seed of `b` and a seed of `a` drawn at random, ties counted 1/2: the Mann-Whitney U over
    every pair of seeds divided by their number (`rliable`'s probability of improvement, for one task)."""
    if not a or not b:
        raise ValueError("probability_of_improvement needs at least one seed on each side")
    return sum((y > x) + 0.5 * (y == x) for x in a for y in b) / (len(a) * len(b))


def seeds_beating(a: dict, b: dict) -> tuple[int, int]:
    """How many seeds of `b` beat `a`: each against `a`'s run of the same seed when `a` has it (paired), else against
    `a`'s mean over seeds. `a`, `b`: value per seed. Returns (seeds of b that beat, seeds of b)."""
    mean_a = sum(a.values()) / len(a)
    return sum(value > a.get(s, mean_a) for s, value in b.items()), len(b)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their mean rank."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for value in np.unique(x):
        tied = x == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation; None when either side is constant (or fewer than 3 points)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(_ranks(x), _ranks(y))[0, 1])


def grouped_spearman(groups: list[list[tuple[float, float]]], resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = 0) -> dict:
    """Spearman's rho over the pooled points of `groups`, with a bootstrap 95% interval that resamples whole groups.

    A group is one training run (its checkpoints): checkpoints of one run are not independent draws, runs are.
    Resamples where a side is constant are skipped and counted (`degenerate`).
    """
    rng = np.random.default_rng(seed)
    pooled = [p for g in groups for p in g]
    rho = spearman([p[0] for p in pooled], [p[1] for p in pooled])
    draws, degenerate = [], 0
    for _ in range(resamples):
        points = [p for i in rng.integers(0, len(groups), len(groups)) for p in groups[i]]
        r = spearman([p[0] for p in points], [p[1] for p in points])
        if r is None:
            degenerate += 1
        else:
            draws.append(r)
    ci = [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))] if draws else None
    return {"rho": rho, "ci95": ci, "n_points": len(pooled), "n_groups": len(groups), "degenerate": degenerate}

"""Follow-up and grounded follow-up rates with Wilson intervals, per decoding setting and across temperatures."""

import math
import re
from collections import Counter

from .rules.classify import LABELS
from .rules.cues import GENERIC, STOPWORDS
from .rules.grounding import normalize_turn

_NUMBER = re.compile(r"\$?\d[\d,]*(?:\.\d+)?")
_FUNCTION = STOPWORDS | set(GENERIC)  # kept in a template: "how did you get" is its form, not its content


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


def followup_template(turn: str, answer: str) -> str:
    """The form of a user turn: its numbers and the answer's own content words masked, then normalised as
    [`~uturn_train.probe.rules.grounding.normalize_turn`] does. "How did you get 24 apples?" after an answer about
    apples and "How did you get 7 pages?" after one about pages are one template, `how did you get <n> <w>`; a plural
    matches its singular ("apples" after "apple")."""
    own = {w.rstrip("s") for w in normalize_turn(_NUMBER.sub(" ", answer or "")).split() if w not in _FUNCTION}
    words = normalize_turn(_NUMBER.sub(" 0 ", turn)).split()  # masked before `normalize_turn` splits "2.5" in two
    return " ".join("<n>" if w == "0" else "<w>" if w not in _FUNCTION and w.rstrip("s") in own else w for w in words)


def summarize_setting(temperature: float, samples: int, labels: list[str | None],
                      grounded: list[bool | None] | None = None, turns: list[str] | None = None,
                      answers: list[str] | None = None) -> dict:
    """One entry of `results.json`'s `settings`: every labelled sample counts in `n`, empty and degenerate ones
    included; error rows (label `None`: a request that failed for good, or a turn the judge gave no label) are counted
    in `errors` and left out of every rate.

    Args:
        labels (`list[str | None]`): the label of every user turn of this setting, `None` for an error row.
        grounded (`list[bool | None]`, *optional*): per turn, whether it is a grounded follow-up (None: undefined, e.g.
            a single prompt has no mismatched context); gives `grounded_followup_rate` and `grounded_ci95`.
        turns (`list[str]`, *optional*): the turns' texts; gives `distinct_followups`, the distinct normalised follow-up
            texts over the follow-ups (None without follow-ups): 1.0 when every follow-up is its own, near 0 when one
            memorised question makes them all.
        answers (`list[str]`, *optional*): with `turns`, the answer each turn reacts to; gives `distinct_templates`,
            the distinct [`followup_template`]s over the follow-ups: "How did you get <number> <unit>?" asked of
            every answer is many distinct texts but one template.
    """
    kept = [i for i, label in enumerate(labels) if label is not None]
    errors = len(labels) - len(kept)
    labels = [labels[i] for i in kept]
    grounded = None if grounded is None else [grounded[i] for i in kept]
    turns = None if turns is None else [turns[i] for i in kept]
    answers = None if answers is None else [answers[i] for i in kept]
    n = len(labels)
    counts = Counter(labels)
    unknown = set(counts) - set(LABELS)
    if unknown:
        raise ValueError(f"unknown labels {sorted(unknown)}; expected one of {LABELS}")
    followups = counts["followup"]
    summary = {
        "temperature": temperature,
        "samples": samples,
        "followup_rate": followups / n if n else None,
        "ci95": list(wilson_interval(followups, n)),
        "n": n,
        "errors": errors,
        "categories": {label: (counts[label] / n if n else 0.0) for label in LABELS},
    }
    if grounded is not None:
        defined = n > 0 and None not in grounded
        hits = sum(map(bool, grounded)) if defined else 0
        summary["grounded_followup_rate"] = hits / n if defined else None
        summary["grounded_ci95"] = list(wilson_interval(hits, n)) if defined else None
    if turns is not None:
        texts = [normalize_turn(t) for t, label in zip(turns, labels) if label == "followup"]
        summary["distinct_followups"] = len(set(texts)) / len(texts) if texts else None
        if answers is not None:
            forms = {followup_template(t, a) for t, a, label in zip(turns, answers, labels) if label == "followup"}
            summary["distinct_templates"] = len(forms) / len(texts) if texts else None
    return summary


def across_temperatures(settings: list[dict]) -> dict:
    """The maximum and mean follow-up (and grounded) rate over the probed temperatures (the paper reports the max)."""
    out = {}
    for key, name in (("followup_rate", "followup_rate"), ("grounded_followup_rate", "grounded_followup_rate")):
        rates = [s[key] for s in settings if s.get(key) is not None]
        if key == "followup_rate" or rates:
            out[f"{name}_max"] = max(rates) if rates else None
            out[f"{name}_mean"] = sum(rates) / len(rates) if rates else None
    return out

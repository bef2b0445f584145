"""The probe record: a probe's figures and their names, read one way by every reader.

A *record* is what one probe says: `results.json`, a [`~uturn_train.probe.runner.ProbeRun`]'s summary and each line of
`probe_history.jsonl` all hold `accuracy` (of the greedy answers, or None) and `settings`, one entry per temperature
with the figures of [`~uturn_train.probe.metrics.summarize_setting`]. A figure has three spellings, each made here:

- its *field* in a settings entry: `grounded_followup_rate`;
- its *flat name*, the field at a temperature: `grounded_followup_rate_T0` (selection rules, mining and testbed cards);
- its *log key*, the scalar the callback logs: `probe/grounded_followup_rate/T0.0` (W&B shows it as
  `train/probe/grounded_followup_rate/T0.0`).

```python
>>> record = {"accuracy": 0.5, "settings": [{"temperature": 0.0, "followup_rate": 0.25, "grounded_followup_rate": 0.1}]}
>>> figure(record, "grounded_followup_rate", 0.0), figure(record, "accuracy")
(0.1, 0.5)
>>> flat_name("grounded_followup_rate", 0.0), parse_flat_name("grounded_followup_rate_T1")
('grounded_followup_rate_T0', ('grounded_followup_rate', 1.0))
>>> temperature_label(0.0), temperature_label(1.0)
('greedy', 'T=1')
```
"""

import re

from .rules.classify import LABELS

FOLLOWUP, GROUNDED = "followup_rate", "grounded_followup_rate"
SHARES = ("distinct_followups", "distinct_templates")  # shares of a probe's follow-ups: no per-prompt value
FIGURES = (FOLLOWUP, GROUNDED, *SHARES)
_FLAT = re.compile(r"(\w+?)_T(\d+(?:\.\d+)?)")


def temperature_label(temperature: float) -> str:
    """`greedy` for 0, `T=1`, `T=0.7` otherwise: how tables, plots and reports name a temperature."""
    return "greedy" if temperature == 0 else f"T={temperature:g}"


def setting(record: dict, temperature: float) -> dict | None:
    """The settings entry of `temperature` in a record, or None when it was not probed."""
    return next((s for s in record.get("settings") or [] if s["temperature"] == temperature), None)


def figure(record: dict, name: str, temperature: float | None = None) -> float | None:
    """`accuracy` (no temperature), or the figure `name` of the settings entry at `temperature`; None when absent."""
    if name == "accuracy":
        return record.get("accuracy")
    entry = setting(record, temperature)
    return None if entry is None else entry.get(name)


def flat_name(name: str, temperature: float) -> str:
    """`grounded_followup_rate_T0`: a figure at a temperature, as one name."""
    return f"{name}_T{temperature:g}"


def parse_flat_name(flat: str) -> tuple[str, float | None]:
    """(`name`, temperature) of a flat name; (`flat`, None) for a name without a temperature (`accuracy`)."""
    match = _FLAT.fullmatch(flat)
    if match is None or match.group(1) == "accuracy":  # `accuracy_T0` is no figure: accuracy has no temperature
        return flat, None
    return match.group(1), float(match.group(2))


def flat_figures(record: dict, names: tuple[str, ...] = (FOLLOWUP, GROUNDED)) -> dict[str, float | None]:
    """`{flat name: value}` of `names` at every probed temperature (the cards' summary of a probe)."""
    return {flat_name(name, s["temperature"]): s.get(name) for s in record["settings"] for name in names}


def log_key(name: str, temperature: float) -> str:
    """`probe/grounded_followup_rate/T0.0`: the scalar the callback logs for a figure at a temperature (its field's
    name: one name per figure in results, history, selection rules and W&B)."""
    if name not in FIGURES:
        raise ValueError(f"{name!r} is not a probe figure: one of {FIGURES}")
    return f"probe/{name}/T{temperature:.1f}"


def log_scalars(record: dict, task: str, labeler: str = "rules") -> dict[str, float]:
    """The scalars the callback logs for a probe record: each rate with its interval (`/ci_low`, `/ci_high`), the
    distinct shares, every label's share (`probe/<label>_share/T<t>`), `<task>/accuracy`, and with an LLM judge
    its rates (`probe/judge_followup_rate/T<t>`, `probe/judge_grounded_followup_rate/T<t>`) and `probe/judge_errors`.
    A temperature whose every row is an error row has no rate and logs nothing."""
    logs = {}
    if record.get("accuracy") is not None:
        logs[f"{task}/accuracy"] = record["accuracy"]
    for s in record["settings"]:
        t = s["temperature"]
        if s["followup_rate"] is None:
            continue
        for name, ci in ((FOLLOWUP, "ci95"), (GROUNDED, "grounded_ci95")):
            if s.get(name) is not None:
                key = log_key(name, t)
                logs[key] = s[name]
                logs[f"{key}/ci_low"], logs[f"{key}/ci_high"] = s[ci]
        for name in SHARES:
            if s.get(name) is not None:
                logs[log_key(name, t)] = s[name]
        for label in LABELS:
            logs[f"probe/{label}_share/T{t:.1f}"] = s["categories"][label]
        judged = s if labeler == "judge" else s.get("judge")
        if judged is not None and judged["followup_rate"] is not None:
            logs[f"probe/judge_followup_rate/T{t:.1f}"] = judged["followup_rate"]
            if judged.get(GROUNDED) is not None:
                logs[f"probe/judge_grounded_followup_rate/T{t:.1f}"] = judged[GROUNDED]
    if "errors" in record.get("judge", {}):  # an LLM judge's failed requests (the trained judge makes none)
        logs["probe/judge_errors"] = float(record["judge"]["errors"])
    return logs

"""The final adapter chosen by a rule stated in the recipe's YAML, over the probe history, rather than the last step's.

    select_metric: grounded_followup_rate_T0    # the highest greedy grounded follow-up rate among the probed
    select_max_accuracy_drop: 0.05              # checkpoints whose accuracy is at most 0.05 below step 0's
    select_min_distinct: 0.25                   # and whose greedy follow-ups are at least 25% distinct texts

`select_metric` is `accuracy` or a probe figure at a probed temperature: `followup_rate_T<t>`,
`grounded_followup_rate_T<t>`, `distinct_followups_T<t>` or `distinct_templates_T<t>` (`T0` greedy, `T1` = T=1.0);
accuracy, of the greedy answers, takes no suffix. `select_max_accuracy_drop` needs step 0's probe (`probe_at_start`);
`select_min_distinct` a greedy probe (`distinct_followups` at T=0: one question asked of every prompt is no win).
Ties go to the higher accuracy, then the earlier step. When no checkpoint meets the rule, the final adapter stays the
last step's and `selection.json` says so.

Why not the Trainer's `metric_for_best_model` with `load_best_model_at_end`: they need evaluation at every save and
take the best of one metric, with no constraint on another (accuracy against step 0's). What fits is kept: the
callback records its choice as the Trainer's `state.best_model_checkpoint`, which checkpoint rotation
(`save_total_limit`) never deletes, and at the end of training loads it with the Trainer's own loader (adapters,
DeepSpeed, FSDP), as `load_best_model_at_end` would, so that the recipe's `trainer.save_model()` saves it as the final
adapter. `selection.json` in `output_dir` holds the rule, the figures of every probed checkpoint and the choice.
"""

import logging
from dataclasses import dataclass
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..io import write_json
from ..probe.record import FIGURES, parse_flat_name
from ..probe.record import figure as figure_of

logger = logging.getLogger(__name__)

SELECTION = "selection.json"
_EPS = 1e-9  # 0.575 - 0.05 is 0.5249999...: an accuracy of 0.525 meets a 0.05 margin


@dataclass(frozen=True)
class SelectionRule:
    """`metric` (see the module docstring) to maximise over the probed checkpoints, among those whose accuracy is at
    most `max_accuracy_drop` below step 0's and whose greedy `distinct_followups` is at least `min_distinct` (any,
    when None)."""

    metric: str
    max_accuracy_drop: float | None = None
    min_distinct: float | None = None

    @classmethod
    def from_args(cls, metric: str | None, max_accuracy_drop: float | None, temperatures: list[float], graded: bool,
                  min_distinct: float | None = None) -> "SelectionRule | None":
        """The rule of the `select_*` options, checked against the probe; None without `select_metric`."""
        if metric is None:
            for name, value in (("max_accuracy_drop", max_accuracy_drop), ("min_distinct", min_distinct)):
                if value is not None:
                    raise ValueError(f"--select_{name} needs --select_metric (what to maximise under it)")
            return None
        if min_distinct is not None and not 0 <= min_distinct <= 1:
            raise ValueError(f"--select_min_distinct {min_distinct}: expected a share in [0, 1]")
        if min_distinct is not None and 0.0 not in temperatures:
            raise ValueError("--select_min_distinct is of the greedy follow-ups: add 0 to --probe_temperatures")
        rule = cls(metric, max_accuracy_drop, min_distinct)
        key, t = rule.figure
        probed = [f"T{x:g}" for x in temperatures]
        if metric.startswith("accuracy_"):  # accuracy is of the greedy answers: a suffix would be silently ignored
            raise ValueError(f"--select_metric {metric}: accuracy has no temperature (it is of the greedy answers); "
                             f"expected `accuracy` or one of {list(FIGURES)} with a probed temperature suffix "
                             f"({', '.join(probed)}), e.g. grounded_followup_rate_{probed[0]}")
        if key != "accuracy" and (key not in FIGURES or t not in temperatures):
            raise ValueError(f"--select_metric {metric}: expected `accuracy` or one of {list(FIGURES)} with a probed "
                             f"temperature suffix ({', '.join(probed)}), e.g. grounded_followup_rate_{probed[0]}")
        if (key == "accuracy" or max_accuracy_drop is not None) and not graded:
            raise ValueError(f"--select_metric {metric} / --select_max_accuracy_drop: the probe has no accuracy here "
                             "(a task without gold answers, or the heldout setting); select on a rate without a drop")
        if max_accuracy_drop is not None and max_accuracy_drop < 0:
            raise ValueError(f"--select_max_accuracy_drop {max_accuracy_drop}: expected a margin >= 0")
        return rule

    @property
    def figure(self) -> tuple[str, float | None]:
        """(`accuracy`, None) or (a probe figure, its temperature)."""
        return parse_flat_name(self.metric)

    def value(self, record: dict) -> float | None:
        return figure_of(record, *self.figure)

    def distinct(self, record: dict) -> float | None:
        return figure_of(record, "distinct_followups", 0.0)

    def describe(self) -> str:
        terms = ([] if self.max_accuracy_drop is None else
                 [f"whose accuracy is at most {self.max_accuracy_drop:g} below step 0's"]) + \
                ([] if self.min_distinct is None else
                 [f"whose greedy follow-ups are at least {self.min_distinct:g} distinct"])
        return f"the highest {self.metric}" + (f" among the checkpoints {' and '.join(terms)}" if terms else "")


def choose_checkpoint(records: list[dict], rule: SelectionRule, saved: set[int]) -> dict:
    """Apply `rule` to probe history records (`probe_history.jsonl`'s).

    Args:
        records (`list[dict]`): the probe records, step 0's (for the accuracy margin) among them.
        rule ([`SelectionRule`]): what to maximise, under which margin.
        saved (`set[int]`): the steps with a checkpoint to load; other records (step 0, a probe at an evaluation
            without a save) are shown but not chosen.

    Returns:
        `dict`: the contents of `selection.json`: `rule`, `step0_accuracy`, per probed step its `value`, `accuracy`
        and whether it is `eligible`, and the chosen `step` (None when no checkpoint meets the rule) with its `value`
        and `accuracy`.
    """
    records = sorted((r for r in records if r.get("error") is None and r.get("settings")), key=lambda r: r["step"])
    base = next((r["accuracy"] for r in records if r["step"] == 0), None)
    if rule.max_accuracy_drop is not None and base is None:
        logger.warning("selection: no step-0 accuracy in the probe history, so no checkpoint can meet %s",
                       rule.describe())
    rows = []
    for r in records:
        value, accuracy = rule.value(r), r["accuracy"]
        within = rule.max_accuracy_drop is None or (
            base is not None and accuracy is not None and accuracy >= base - rule.max_accuracy_drop - _EPS)
        distinct = rule.distinct(r)
        varied = rule.min_distinct is None or (distinct is not None and distinct >= rule.min_distinct - _EPS)
        rows.append({"step": r["step"], "value": value, "accuracy": accuracy, "distinct": distinct,
                     "eligible": r["step"] in saved and value is not None and within and varied})
    eligible = [row for row in rows if row["eligible"]]
    best = max(eligible, key=lambda row: (row["value"], row["accuracy"] or 0.0, -row["step"]), default=None)
    return {"rule": {"select_metric": rule.metric, "select_max_accuracy_drop": rule.max_accuracy_drop,
                     "select_min_distinct": rule.min_distinct, "text": rule.describe()},
            "step0_accuracy": base, "checkpoints": rows, "step": None if best is None else best["step"],
            "value": None if best is None else best["value"], "accuracy": None if best is None else best["accuracy"]}


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"


def saved_steps(output_dir: str | Path, records: list[dict]) -> set[int]:
    return {r["step"] for r in records if r["step"] > 0 and checkpoint_dir(output_dir, r["step"]).is_dir()}


def keep_best(state, output_dir: str | Path, records: list[dict], rule: SelectionRule) -> None:
    """After each probe: the rule's choice so far becomes `state.best_model_checkpoint`, which `save_total_limit`'s
    rotation keeps."""
    choice = choose_checkpoint(records, rule, saved_steps(output_dir, records))
    if choice["step"] is not None:
        state.best_model_checkpoint = str(checkpoint_dir(output_dir, choice["step"]))
        state.best_metric, state.best_global_step = choice["value"], choice["step"]


def select_at_end(trainer, output_dir: str | Path, records: list[dict], rule: SelectionRule) -> dict:
    """At the end of training (every rank): load the chosen checkpoint's weights into `trainer.model`, unless they are
    the last step's, and write `output_dir/selection.json` (main process).

    Returns:
        `dict`: what `selection.json` holds, with `loaded` (the checkpoint loaded, None when the weights stayed).
    """
    choice = choose_checkpoint(records, rule, saved_steps(output_dir, records))
    step, final = choice["step"], trainer.state.global_step
    loaded = None
    if step is None:
        logger.warning("selection: no checkpoint meets %s; the final adapter stays the last step's (%d)",
                       rule.describe(), final)
    elif step != final:
        loaded = str(checkpoint_dir(output_dir, step))
        trainer.state.best_model_checkpoint = loaded
        trainer.state.best_metric, trainer.state.best_global_step = choice["value"], step
        # The Trainer's own loader, as `load_best_model_at_end` calls it: a PEFT adapter, DeepSpeed or FSDP state.
        trainer._load_best_model()
        logger.info("selection: step %d (%s %s, accuracy %s) by %s; its weights are the final model's", step,
                    rule.metric, choice["value"], choice["accuracy"], rule.describe())
    selection = {**choice, "final_step": final, "loaded": loaded}
    if trainer.is_world_process_zero():
        write_json(Path(output_dir) / SELECTION, selection)
    return selection

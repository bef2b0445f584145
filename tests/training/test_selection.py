"""The checkpoint chosen by the YAML's rule: the rule on hand-made probe histories, bad options, and, on a tiny LoRA
model without training, the chosen adapter kept through checkpoint rotation, loaded at the end and saved as the final
adapter with `selection.json`."""

import json

import pytest
import torch
from helpers import ARITHMETIC
from helpers.train_with_probe import make_trainer  # noqa: E402
from safetensors.torch import load_file
from transformers.trainer_utils import rotate_checkpoints

from uturn_train import ProbeArguments, UserTurnProbeCallback
from uturn_train.training.selection import SelectionRule, checkpoint_dir, choose_checkpoint, keep_best, select_at_end

GSM8K = ARITHMETIC


def record(step: int, accuracy: float | None, grounded: float, error: str | None = None) -> dict:
    settings = [] if error else [{"temperature": 0.0, "followup_rate": grounded, "grounded_followup_rate": grounded},
                                 {"temperature": 1.0, "followup_rate": 0.5, "grounded_followup_rate": 0.25}]
    return {"step": step, "epoch": None, "seconds": 1.0, "accuracy": accuracy, "settings": settings, "error": error}


# Step 0 at accuracy 0.575. Step 40 has the highest grounded rate but loses 0.055; step 60 loses exactly 0.05.
HISTORY = [record(0, 0.575, 0.0), record(20, 0.55, 0.5), record(40, 0.52, 0.8), record(60, 0.525, 0.6),
           record(80, None, 0.0, error="RuntimeError: boom")]
SAVED = {20, 40, 60, 80}
RULE = SelectionRule("grounded_followup_rate_T0", 0.05)


def test_rule_on_hand_made_histories():
    choice = choose_checkpoint(HISTORY, RULE, SAVED)
    assert (choice["step"], choice["value"], choice["accuracy"], choice["step0_accuracy"]) == (60, 0.6, 0.525, 0.575)
    assert [(c["step"], c["eligible"]) for c in choice["checkpoints"]] == [(0, False), (20, True), (40, False),
                                                                           (60, True)]  # the failed probe is left out
    assert choice["rule"] == {"select_metric": "grounded_followup_rate_T0", "select_max_accuracy_drop": 0.05,
                              "select_min_distinct": None,
                              "text": "the highest grounded_followup_rate_T0 among the checkpoints whose accuracy is "
                                      "at most 0.05 below step 0's"}
    # No margin: the highest rate; a step without a checkpoint (a probe at an evaluation) is never chosen.
    assert choose_checkpoint(HISTORY, SelectionRule("grounded_followup_rate_T0"), SAVED)["step"] == 40
    assert choose_checkpoint(HISTORY, RULE, {20, 40})["step"] == 20
    # Other figures: the T=1.0 rate ties everywhere (0.25): the higher accuracy, then the earlier step, wins.
    assert choose_checkpoint(HISTORY, SelectionRule("grounded_followup_rate_T1"), SAVED)["step"] == 20
    assert choose_checkpoint(HISTORY, SelectionRule("accuracy"), SAVED)["step"] == 20
    tied = [record(0, 0.5, 0.0), record(10, 0.5, 0.4), record(20, 0.5, 0.4)]
    assert choose_checkpoint(tied, RULE, {10, 20})["step"] == 10
    # Nothing within the margin: no choice (the final adapter stays the last step's).
    none = choose_checkpoint(HISTORY, SelectionRule("grounded_followup_rate_T0", 0.0), SAVED)
    assert (none["step"], none["value"]) == (None, None)
    assert choose_checkpoint(HISTORY[1:], RULE, SAVED)["step"] is None  # no step-0 accuracy to measure a drop from
    # A rule built in Python around `from_args`: `accuracy_T0` is not taken for accuracy, so it chooses nothing.
    assert SelectionRule("accuracy_T0").figure == ("accuracy_T0", None)
    assert choose_checkpoint(HISTORY, SelectionRule("accuracy_T0"), SAVED)["step"] is None


def test_a_distinct_share_rules_out_one_question_asked_of_every_prompt():
    # GRPO seed 0 from scratch (recipes/README.md): step 250 has the higher greedy grounded rate, but 81% of its greedy
    # follow-ups repeat another's text; step 175 is the last with a quarter distinct.
    history = [record(0, 0.575, 0.0), record(175, 0.57, 0.37), record(250, 0.57, 0.38)]
    for r, distinct in zip(history, (None, 0.25, 0.19)):
        r["settings"][0]["distinct_followups"] = distinct
    rule = SelectionRule("grounded_followup_rate_T0", 0.05, 0.25)
    choice = choose_checkpoint(history, rule, {175, 250})
    assert (choice["step"], choice["value"]) == (175, 0.37)
    assert [(c["step"], c["distinct"], c["eligible"]) for c in choice["checkpoints"]] == [
        (0, None, False), (175, 0.25, True), (250, 0.19, False)]
    assert choice["rule"]["text"] == ("the highest grounded_followup_rate_T0 among the checkpoints whose accuracy is "
                                      "at most 0.05 below step 0's and whose greedy follow-ups are at least 0.25 "
                                      "distinct")
    assert choose_checkpoint(history, RULE, {175, 250})["step"] == 250  # without the share
    assert choose_checkpoint(HISTORY, rule, SAVED)["step"] is None  # no distinct share recorded: nothing qualifies


@pytest.mark.parametrize(("distinct", "temperatures", "error"), [
    (1.5, [0.0, 1.0], r"--select_min_distinct 1.5: expected a share in \[0, 1\]"),
    (0.25, [1.0], "--select_min_distinct is of the greedy follow-ups: add 0 to --probe_temperatures"),
])
def test_bad_distinct_shares_fail_clearly(distinct, temperatures, error):
    with pytest.raises(ValueError, match=error):
        SelectionRule.from_args("grounded_followup_rate_T1", 0.05, temperatures, True, distinct)
    with pytest.raises(ValueError, match="--select_min_distinct needs --select_metric"):
        SelectionRule.from_args(None, None, temperatures, True, 0.25)


@pytest.mark.parametrize(("metric", "drop", "graded", "error"), [
    ("grounded_rate_T0", None, True, r"--select_metric grounded_rate_T0: expected `accuracy` or one of"),
    ("grounded_followup_rate_T0.7", None, True, r"probed temperature suffix \(T0, T1\)"),
    ("grounded_followup_rate", None, True, r"e.g. grounded_followup_rate_T0"),
    ("accuracy", None, False, "the probe has no accuracy here"),
    ("followup_rate_T1", 0.05, False, "the probe has no accuracy here"),
    ("followup_rate_T1", -0.1, True, "expected a margin >= 0"),
    (None, 0.05, True, "--select_max_accuracy_drop needs --select_metric"),
    # Accuracy is of the greedy answers: a temperature suffix is rejected, not read as `accuracy`.
    ("accuracy_T0", None, True, r"--select_metric accuracy_T0: accuracy has no temperature .*expected `accuracy` or "
                                r"one of \['followup_rate', 'grounded_followup_rate', 'distinct_followups', "
                                r"'distinct_templates'\] with a probed temperature suffix \(T0, T1\)"),
    ("accuracy_T1", 0.05, True, "--select_metric accuracy_T1: accuracy has no temperature"),
    ("accuracy_greedy", None, True, "--select_metric accuracy_greedy: accuracy has no temperature"),
])
def test_bad_rules_fail_clearly(metric, drop, graded, error):
    with pytest.raises(ValueError, match=error):
        SelectionRule.from_args(metric, drop, [0.0, 1.0], graded)


def test_callback_checks_the_rule_before_training(tiny_qwen_dir, tmp_path):
    trainer = make_trainer(tiny_qwen_dir, tmp_path / "run", GSM8K, with_probe=False)
    probe = {"probe_task": "gsm8k", "probe_labeler": "rules", "probe_data": str(GSM8K), "probe_limit": 2}
    with pytest.raises(ValueError, match="--select_metric distinct_templates_T3"):
        UserTurnProbeCallback(ProbeArguments(**probe, select_metric="distinct_templates_T3"), trainer.processing_class)
    with pytest.raises(ValueError, match="keep --probe_on_save"):
        UserTurnProbeCallback(ProbeArguments(**probe, select_metric="accuracy", probe_on_save=False),
                              trainer.processing_class)
    with pytest.raises(ValueError, match="--select_max_accuracy_drop measures the drop from step 0: keep "
                                         "--probe_at_start true"):
        UserTurnProbeCallback(ProbeArguments(**probe, select_metric="accuracy", select_max_accuracy_drop=0.05,
                                             probe_at_start=False), trainer.processing_class)
    # Without a margin, step 0 is not needed.
    assert UserTurnProbeCallback(ProbeArguments(**probe, select_metric="accuracy", probe_at_start=False),
                                 trainer.processing_class).rule == SelectionRule("accuracy")
    callback = UserTurnProbeCallback(ProbeArguments(**probe, select_metric="grounded_followup_rate_T0"),
                                     trainer.processing_class, trainer=trainer)
    assert callback.rule == SelectionRule("grounded_followup_rate_T0")
    trainer.args.metric_for_best_model = "loss"
    with pytest.raises(ValueError, match="metric_for_best_model \\(loss\\) both choose the final checkpoint"):
        callback.on_train_begin(trainer.args, trainer.state, trainer.control)


def test_chosen_adapter_survives_rotation_and_becomes_the_final_one(tiny_qwen_dir, tmp_path):
    """The callback's steps without the training: after each save, rotation (`save_total_limit=1`) and the probe
    record; at the end the chosen checkpoint is loaded and the recipe's `save_model` saves it."""
    out = tmp_path / "run"
    trainer = make_trainer(tiny_qwen_dir, out, GSM8K, with_probe=False)
    lora_b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    history = [record(0, 0.575, 0.0), record(20, 0.55, 0.7), record(40, 0.52, 0.8), record(60, 0.5, 0.9)]
    for i, step in enumerate((20, 40, 60), 1):
        with torch.no_grad():
            for p in lora_b:
                p.fill_(step / 100)  # each checkpoint its own adapter
        trainer.save_model(str(checkpoint_dir(out, step)))
        rotate_checkpoints(str(out), save_total_limit=1, best_model_checkpoint=trainer.state.best_model_checkpoint)
        keep_best(trainer.state, out, history[: i + 1], RULE)
        assert trainer.state.best_model_checkpoint == str(checkpoint_dir(out, 20))  # 40 and 60 lose accuracy
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-20", "checkpoint-60"]  # 40 rotated away

    trainer.state.global_step = 60  # the model holds step 60's weights, as at the end of training
    selection = select_at_end(trainer, out, history, RULE)
    assert (selection["step"], selection["final_step"], selection["loaded"]) == (20, 60, str(checkpoint_dir(out, 20)))
    assert all(torch.all(p == 0.2) for p in lora_b), "the chosen adapter's weights are the model's"
    assert json.loads((out / "selection.json").read_text()) == selection
    trainer.save_model(str(out))  # what the recipe does next
    final, chosen = load_file(out / "adapter_model.safetensors"), load_file(
        checkpoint_dir(out, 20) / "adapter_model.safetensors")
    assert final.keys() == chosen.keys() and all(torch.equal(final[k], chosen[k]) for k in final)

    # Nothing meets the rule: the last step's weights stay, and selection.json says so.
    kept = select_at_end(trainer, out, history, SelectionRule("grounded_followup_rate_T0", 0.0))
    assert (kept["step"], kept["loaded"]) == (None, None) and all(torch.all(p == 0.2) for p in lora_b)

import pytest

from uturn_train.probe.metrics import across_temperatures, followup_template, summarize_setting, wilson_interval


def test_wilson_matches_reference_values():
    # Reference: statsmodels proportion_confint(8, 20, method="wilson") = (0.2188, 0.6134)
    lo, hi = wilson_interval(8, 20)
    assert lo == pytest.approx(0.21878, abs=1e-4) and hi == pytest.approx(0.61340, abs=1e-4)
    lo, hi = wilson_interval(0, 50)
    assert lo == 0.0 and hi == pytest.approx(0.07135, abs=1e-4)  # stays inside [0, 1] near zero
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_summary_counts_every_sample_and_shares_sum_to_one():
    labels = ["followup"] * 3 + ["empty", "degenerate", "identity_drift", "acknowledgement", "new_topic"]
    s = summarize_setting(1.0, 4, labels)
    assert s["n"] == 8 and s["followup_rate"] == pytest.approx(3 / 8)
    assert s["categories"]["empty"] == pytest.approx(1 / 8)
    assert sum(s["categories"].values()) == pytest.approx(1.0)
    assert s["ci95"][0] < 3 / 8 < s["ci95"][1]
    with pytest.raises(ValueError, match="unknown labels"):
        summarize_setting(0.0, 1, ["followup", "chitchat"])


def test_across_temperatures():
    settings = [summarize_setting(0.0, 1, ["new_topic"] * 4), summarize_setting(1.0, 4, ["followup", "new_topic"])]
    agg = across_temperatures(settings)
    assert agg == {"followup_rate_max": 0.5, "followup_rate_mean": 0.25}


def test_error_rows_leave_every_denominator():
    labels = ["followup", None, "followup", "new_topic", None]
    s = summarize_setting(1.0, 5, labels, grounded=[True, None, False, False, None],
                          turns=["Why 24?", "", "Why 24?", "Next: 3+3?", ""])
    assert (s["n"], s["errors"]) == (3, 2)
    assert s["followup_rate"] == pytest.approx(2 / 3) and s["grounded_followup_rate"] == pytest.approx(1 / 3)
    assert s["categories"]["new_topic"] == pytest.approx(1 / 3) and s["distinct_followups"] == 0.5
    empty = summarize_setting(0.0, 1, [None, None])
    assert (empty["n"], empty["errors"], empty["followup_rate"]) == (0, 2, None)


def test_template_masks_numbers_and_the_answers_own_words():
    apples = followup_template("How did you get 24 apples?", "Tom picks 24 apples and keeps them.")
    pages = followup_template("How did you get 7 pages?<|im_end|>", "She reads 7 pages a day.")
    assert apples == pages == "how did you get <n> <w>"
    # A decimal, a price and a plural of the answer's singular are masked whole; words the answer lacks stay.
    assert followup_template("Why is the pencil $2.50 at the shop?", "A pencil costs $2.50.") == \
        "why is the <w> <n> at the shop"
    # "get" is in both answers but is a function word of the template: masked in neither.
    assert followup_template("How did you get 3 cars?", "You get 3 cars.") == "how did you get <n> <w>"
    assert followup_template("What colour are the apples?", "24 apples") != followup_template(
        "How many apples are left?", "24 apples")


def test_distinct_templates_beside_distinct_followups():
    # Three follow-ups, three texts, one template; the new topic and the error row do not count.
    labels = ["followup", "followup", "new_topic", "followup", None]
    turns = ["How did you get 24 apples?", "How did you get 7 pages?", "Tell me a joke.", "How did you get 3 cars?", ""]
    answers = ["24 apples in all.", "She read 7 pages.", "It is 5.", "He has 3 cars.", None]
    s = summarize_setting(0.0, 1, labels, turns=turns, answers=answers)
    assert s["distinct_followups"] == 1.0 and s["distinct_templates"] == pytest.approx(1 / 3)
    assert "distinct_templates" not in summarize_setting(0.0, 1, labels, turns=turns)  # no answers given
    assert summarize_setting(0.0, 1, ["new_topic"], turns=["Hi."], answers=["4"])["distinct_templates"] is None

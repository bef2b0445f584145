"""The probe on a real chat model's turns (SmolLM2-135M-Instruct), against labels given by reading them.

The labelled set and its rubric: `tests/data/smollm2_turns.jsonl`, `tests/data/README.md`; the table:
`python eval/real_model_validity.py`.
"""

from collections import Counter

import pytest

from uturn_train.probe.rules.classify import LABELS
from uturn_train.probe.validity import model_turns as validity


@pytest.fixture(scope="module")
def rows(shared_data):
    rows = validity.load(shared_data)
    validity.predict(rows)
    return rows


def test_the_labelled_set_covers_four_sources_both_temperatures_and_both_splits(rows):
    assert len(rows) >= 400
    assert {r["task"] for r in rows} >= {"gsm8k", "oasst", "mtbench", "ifeval"}
    assert {r["temperature"] for r in rows} == {0.0, 1.0}
    assert Counter(r["split"] for r in rows).keys() == {"dev", "test"}
    assert all(r["label"] in LABELS for r in rows)
    assert len({r["row"] for r in rows}) == len(rows)
    # Answers are stored only where they are the model's own (self setting); OASST's real ones are joined by id.
    assert all((r["setting"] == "heldout") == (r["task"] == "oasst") for r in rows)


def test_a_bad_row_names_its_line(tmp_path, shared_data):
    lines = validity.LABELS_FILE.read_text().splitlines()
    bad = lines[0].replace('"split": "dev"', '"split": "test"') if '"split": "dev"' in lines[0] else \
        lines[0].replace('"split": "test"', '"split": "dev"')
    path = tmp_path / "labels.jsonl"
    path.write_text(bad + "\n")
    with pytest.raises(ValueError, match=r"labels.jsonl:1 .*its prompt belongs to"):
        validity.load(shared_data, path)


@pytest.mark.parametrize("split", [None, "test"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_gsm8k_grounded_rates_match_reading(rows, temperature, split):
    # Issue 17: the probe's greedy and T=1.0 grounded rates on SmolLM2's GSM8K turns within 0.05 of the rates by
    # reading, on all its turns and on the test split the rules were not changed on (docs/probe.md: the figures; the
    # probe said 0.438 and 0.250 on all turns before the answer control and the word-problem rules).
    rate = validity.rates(rows, split)[f"gsm8k T={temperature:g}" + (f" ({split})" if split else "")]
    assert rate["n"] >= (48 if split is None else 20)
    assert abs(rate["grounded (probe)"] - rate["grounded (read)"]) <= 0.05, rate


def test_after_a_word_problem_a_question_about_its_story_is_not_a_followup(rows):
    # The boundary real models hit most: another unknown of the same story, the query restated, a task behind a
    # prefix. On GSM8K's greedy turns of the test split, at most one such turn is left labelled a follow-up.
    greedy = [r for r in rows if r["task"] == "gsm8k" and r["temperature"] == 0 and r["split"] == "test"]
    wrong = [r["user_turn"] for r in greedy if r["predicted"] == "followup" and r["label"] != "followup"]
    assert len(wrong) <= 1, wrong

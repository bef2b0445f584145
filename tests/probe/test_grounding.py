"""The grounded decision: real follow-ups are grounded in their own conversation, generic questions are not."""

import json
import re

import pytest
from helpers.grounding_cases import AGE_ANSWER, AGE_QUERY, ANSWER, OTHER, QUERY

from uturn_train.cli import main as cli
from uturn_train.probe.rules.classify import LABELS, classify_turn
from uturn_train.probe.rules.grounding import Grounding, derangement, ground_rows, is_grounded, normalize_turn
from uturn_train.probe.validity import human_turns as validity


@pytest.mark.parametrize("n", [2, 3, 10, 101])
def test_derangement_is_a_seeded_permutation_without_fixed_points(n):
    order = derangement(n, seed=7)
    assert sorted(order) == list(range(n)) and all(order[i] != i for i in range(n))
    assert derangement(n, seed=7) == order
    if n > 3:
        assert derangement(n, seed=8) != order


@pytest.mark.parametrize("n", [0, 1])
def test_derangement_of_fewer_than_two_is_undefined(n):
    with pytest.raises(ValueError, match="at least 2 distinct contexts"):
        derangement(n, seed=0)


def test_normalize_turn():
    assert normalize_turn("Why  24?<|im_end|>") == normalize_turn("why 24") == "why 24"
    assert normalize_turn("How did you get 24?") != normalize_turn("How did you get 25?")




@pytest.mark.parametrize(
    "turn,grounded",
    [
        ("How did you get 24?", True),  # a follow-up anywhere, but 24 is only in its own answer
        # A variant of the query or a question about its story would follow any answer to this query: a follow-up,
        # but it does not react to this answer (issue 17).
        ("What if it was 8 apples instead of 5?", False),
        ("Why did he go to the market?", False),
        ("Are you sure about the 24 apples?", True),
        ("Why did you add 5 and 19?", True),  # the query's numbers, as the step the assistant took
        ("Why do you multiply in the first step?", False),  # fits any worked answer
        ("Could you explain the steps again?", False),
        ("Can you tell me more about that?", False),
        ("Is that right?", False),
        ("What if it was 8 instead?", False),  # a small number recurs by chance: nothing specific
        ("Thanks!", False),  # not a follow-up at all
    ],
)
def test_arithmetic_cases(turn, grounded):
    g = is_grounded(QUERY, ANSWER, turn, *OTHER)
    assert isinstance(g, Grounding) and g.mismatch_label in LABELS and g.reason
    assert g.grounded == grounded, g


@pytest.mark.parametrize("turn,grounded", [("What if Paul's age changed to 8?", False), ("Why 23 years?", True),
                                           ("What is Paul's age now?", False), ("How did you get 28?", True)])
def test_age_problems_are_word_problems(turn, grounded):
    assert is_grounded(AGE_QUERY, AGE_ANSWER, turn, *OTHER).grounded == grounded


def test_verdict_is_reused_and_a_turn_that_is_no_follow_up_is_not_grounded():
    verdict = classify_turn(QUERY, ANSWER, "How did you get 24?")
    assert is_grounded(QUERY, ANSWER, "How did you get 24?", *OTHER, verdict=verdict) == is_grounded(
        QUERY, ANSWER, "How did you get 24?", *OTHER
    )
    g = is_grounded(QUERY, ANSWER, "What is the capital of France?", *OTHER)
    assert not g.grounded and "not a follow-up in its own conversation (new_topic)" in g.reason


def test_the_mismatched_context_must_be_another():
    with pytest.raises(ValueError, match="turn's own conversation"):
        is_grounded(QUERY, ANSWER, "How did you get 24?", QUERY, ANSWER)


def test_ground_rows_pairs_each_context_with_another_one():
    rows = [{"query": QUERY, "answer": ANSWER, "user_turn": "How did you get 24?"},
            {"query": QUERY, "answer": ANSWER, "user_turn": "Is that right?"},
            {"query": OTHER[0], "answer": OTHER[1], "user_turn": "Why is it 30?"}]
    assert [g.grounded for g in ground_rows(rows, seed=3)] == [True, False, True]
    with pytest.raises(ValueError, match="at least 2 distinct"):
        ground_rows(rows[:2], seed=0)


def test_cli_classify_adds_grounded(tmp_path, capsys):
    rows = [{"query": QUERY, "answer": ANSWER, "user_turn": "How did you get 24?"},
            {"query": QUERY, "answer": ANSWER, "user_turn": "Could you explain the steps again?"},
            {"query": OTHER[0], "answer": OTHER[1], "user_turn": "Thanks!"}]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli(["classify", "--input", str(src), "--output", str(dst), "--seed", "1"])
    labelled = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [r["grounded"] for r in labelled] == [True, False, False]
    assert [r["label"] for r in labelled] == ["followup", "followup", "acknowledgement"]
    assert all(r["mismatch_label"] in LABELS for r in labelled)
    assert re.search(r"grounded +1 +0.333", capsys.readouterr().out)
    src.write_text(json.dumps(rows[0]) + "\n")  # one context: nothing to mismatch it with
    cli(["classify", "--input", str(src), "--output", str(dst)])
    assert json.loads(dst.read_text())["grounded"] is None


@pytest.fixture(scope="module")
def rates(shared_data):
    return validity.grounded_rates(shared_data)


def test_generic_questions_after_real_conversations_are_rarely_grounded(rates):
    # 0.006 (OASST) and 0.002 (GSM8K) when written; the bar is 0.10.
    assert rates["generic questions after OASST conversations"] <= 0.05, rates
    assert rates["generic questions after GSM8K conversations"] <= 0.05, rates
    assert rates["'Why do you multiply in the first step?' (GSM8K)"] <= 0.02, rates
    assert rates["'Could you explain the steps again?' (GSM8K)"] <= 0.02, rates


def test_real_followups_and_specific_questions_are_mostly_grounded(rates):
    # 0.741, 0.929 and 0.954 when written. A real follow-up that is not grounded leans on its answer with words that
    # fit any ("Can you add comments?", "Make it shorter."); the bar is 0.65.
    assert rates["real follow-ups, own conversation (OASST)"] >= 0.70, rates
    assert rates["'How did you get <its answer, 13 or more>?' (GSM8K)"] >= 0.90, rates
    # A variant of the query's own quantity follows any answer to the query: a follow-up, never grounded (issue 17).
    # 0.049 measured: the few that pass have an answer that says n+3 itself.
    assert rates["'What if it was <n+3> <noun> instead of <n>?' (GSM8K)"] <= 0.08, rates

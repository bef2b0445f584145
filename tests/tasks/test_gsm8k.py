import json

import pytest

from uturn_train.tasks.gsm8k import extract_answer, flexible_extract, is_correct, score, strict_match


@pytest.fixture(scope="module")
def gsm8k_test(shared_data):
    with open(shared_data / "gsm8k" / "test.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [(row["answer"], row["answer"].split("####")[-1].strip().replace(",", "")) for row in rows]


def test_every_real_gold_solution_scores_correct(gsm8k_test):
    assert len(gsm8k_test) == 1319
    wrong = [(solution, gold) for solution, gold in gsm8k_test if extract_answer(solution) != gold]
    assert not wrong, wrong[:3]
    assert all(is_correct(solution, gold) for solution, gold in gsm8k_test)
    assert all(strict_match(solution, gold) for solution, gold in gsm8k_test)
    assert all(flexible_extract(solution, gold) for solution, gold in gsm8k_test)
    # A solution is not correct for another problem's gold: the check is not vacuous.
    shifted = [gold for _, gold in gsm8k_test[1:]] + [gsm8k_test[0][1]]
    assert sum(is_correct(solution, gold) for (solution, _), gold in zip(gsm8k_test, shifted, strict=True)) < 30


@pytest.mark.parametrize(
    "text, expected",
    [
        # priority 1: the last \boxed{}, nested braces and dollar signs included
        ("First \\boxed{3}, then corrected: \\boxed{18}. #### 5", "18"),
        ("So the total is \\boxed{\\$18.00}.", "18.00"),
        ("\\boxed{\\text{18 dollars}}", "18"),
        ("\\boxed{x = 2 \\times 9 = 18}", "18"),
        ("\\boxed{1{,}000}", "1000"),
        ("\\boxed{}. The answer is 7", "7"),
        # priority 2: ####
        ("It is 5 and 6.\n#### 18\nThanks 99", "18"),
        ("#### $1,000.", "1000"),
        # priority 3: "answer is" / "Final answer", last occurrence, case-insensitive
        ("The answer is 42.", "42"),
        ("The answer is 4, no wait. Final Answer: 12 apples, 13 pears", "12"),
        ("FINAL ANSWER: -3 degrees, after 10 hours", "-3"),
        ("So the answer is 50%.", "50"),
        # priority 4: the last number
        ("She earned $1,000. Then 3 more days.", "3"),
        ("She earned $1,000.", "1000"),
        ("It fell to -5 degrees.", "-5"),
        ("Between 3-4 hours", "4"),
        ("It weighs 2.5 kg", "2.5"),
        ("Total 1,234,567.89 units", "1234567.89"),
        # think blocks
        ("<think>the answer is 7</think>The answer is 9", "9"),
        ("<think>so 7</think>", None),
        ("<think>unterminated, 5 and 6", None),
        ("reasoning opened by the prompt, 7\n</think>\nSo 9.", "9"),
        ("no number here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_an_answer_stated_as_one_or_none():
    assert extract_answer("so 6 * 9 = 54.", last_number=False) is None  # a step, not an answer
    assert extract_answer("so 6 * 9 = 54. So the answer is 61.", last_number=False) == "61"
    assert extract_answer("54 + 7 = 61\n#### 61", last_number=False) == "61"


@pytest.mark.parametrize(
    "output, gold, correct",
    [
        ("#### 18.00", "18", True),
        ("\\boxed{18.0}", "18", True),
        ("The answer is 18", "18.00", True),
        ("I made $1,000.", "1,000", True),
        ("It is -10.", "-10", True),
        ("It is 10.", "-10", False),
        ("#### 17", "18", False),
        ("no number", "18", False),
        ("\\boxed{Yes}", "yes", True),
        ("\\boxed{no}", "18", False),
    ],
)
def test_is_correct(output, gold, correct):
    assert is_correct(output, gold) is correct


def test_lm_eval_compares_strings():
    # lm-eval strips `,`, `$` and a trailing period, but "18.00" stays "18.00", which is not "18".
    assert not strict_match("#### 18.00", "18") and not flexible_extract("It is 18.00", "18")
    assert is_correct("#### 18.00", "18") and is_correct("It is 18.00", "18")
    # strict-match takes the first `####`; flexible-extract the last number-like span.
    assert strict_match("#### 1,000.\nor #### 7", "1000")
    assert not strict_match("#### $1,000", "1000")  # its regex admits no `$`: "[invalid]"
    assert not strict_match("#### $1,000\nor #### 7", "1000")  # ... so the first match is "7"
    assert not strict_match("The answer is 18", "18")
    assert flexible_extract("3 apples, so 18.", "18")
    assert not flexible_extract("18 apples, so 3.", "18")
    assert not strict_match("no number", "18") and not flexible_extract("no number", "18")


def test_score():
    outputs = ["#### 18", "\\boxed{18.00}", "I think 7"]
    assert score(outputs, ["18", "18", "18"]) == {
        "accuracy": 2 / 3,
        "accuracy_strict": 1 / 3,
        "accuracy_flexible": 1 / 3,
    }
    with pytest.raises(ValueError, match="as many outputs as golds"):
        score(outputs, ["18"])

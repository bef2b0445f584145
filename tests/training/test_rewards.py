"""The GRPO reward functions on real text: OASST follow-ups and answers, GSM8K solutions, and bad completions."""

import random

import pytest

from uturn_train.chat import role_header_starts
from uturn_train.tasks import load_task
from uturn_train.training.rewards import LABEL_REWARD, LengthGuard, UserTurnReward, accuracy

GENERIC = ["Can you tell me more about that?", "Is that right?", "Could you explain that more simply?",
           "Can you give me an example?", "Why?", "Can you elaborate on that?", "What do you mean?",
           "Could you go into more detail?"]


@pytest.fixture(scope="module")
def tokenizer():
    from helpers import tiny

    return tiny.qwen_tokenizer()


@pytest.fixture(scope="module")
def reward(tokenizer):
    return UserTurnReward(tokenizer, role_header_starts(tokenizer))


@pytest.fixture(scope="module")
def oasst(shared_data):
    examples = load_task("oasst", str(shared_data / "oasst" / "en_100_tree.jsonl"))
    # Each triple's mismatched context comes from another tree, as the RL data set pairs them (a derangement).
    others = random.Random(0).sample(list(examples), len(examples))
    pairs = []
    for i, ex in enumerate(examples):
        other = next(o for o in others[i:] + others[:i] if o.meta["message_tree_id"] != ex.meta["message_tree_id"])
        pairs.append((ex, other))
    return pairs


def call(reward, tokenizer, rows):
    """`reward` as TRL calls it: one entry per completion in every column."""
    ids = [tokenizer(text, add_special_tokens=False).input_ids for text, *_ in rows]
    columns = list(zip(*[(text, i, "user_turn", ex.query, ex.answer, [[other.query, other.answer]])
                         for (text, ex, other), i in zip(rows, ids)]))
    names = ("completions", "completion_ids", "kind", "query", "answer", "controls")
    return reward(**dict(zip(names, columns)), prompts=["P"] * len(rows))


def test_real_followups_earn_the_grounded_reward_and_generic_questions_do_not(reward, tokenizer, oasst):
    real = call(reward, tokenizer, [(ex.reference_followup, ex, other) for ex, other in oasst])
    share = sum(r == LABEL_REWARD["grounded"] for r in real) / len(real)
    assert share >= 0.65, f"{share:.3f} of real follow-ups rewarded as grounded"  # 0.735 grounded when written
    generic = call(reward, tokenizer, [(q, ex, other) for ex, other in oasst[:60] for q in GENERIC])
    assert sum(r == LABEL_REWARD["grounded"] for r in generic) / len(generic) <= 0.05
    assert all(r <= 0.0 for r in generic if r != LABEL_REWARD["grounded"])  # never more than a new topic


def test_drift_and_bad_completions_are_penalised(reward, tokenizer, oasst):
    ex, other = oasst[0]
    siblings = [(o.answer, e, oo) for (e, oo), (o, _) in zip(oasst[:40], oasst[1:41]) if o.answer != e.answer]
    drift = call(reward, tokenizer, siblings)  # another conversation's assistant answer written as the user turn
    assert sum(r == -1.0 for r in drift) / len(drift) >= 0.8
    assert call(reward, tokenizer, [("", ex, other)]) == [-1.0]  # empty
    assert call(reward, tokenizer, [("<|im_end|><|im_start|>", ex, other)]) == [-1.0]  # only special tokens
    assert call(reward, tokenizer, [("the the the the the the the the the the", ex, other)]) == [-1.0]
    assert call(reward, tokenizer, [(ex.query, ex, other)]) == [-1.0]  # repeats the query


def test_a_turn_that_opens_another_header_keeps_it(reward, tokenizer):
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert reward.turn("Sure, here is", [5, 6, im_start]) == "Sure, here is<|im_start|>"
    assert reward.turn("Why 24?", [5, 6]) == "Why 24?"


def test_anchor_rows_are_left_to_the_accuracy_reward(reward, tokenizer, shared_data):
    gsm8k = load_task("gsm8k", str(shared_data / "gsm8k" / "test.jsonl"), limit=50)
    solutions = [ex.meta["solution"] for ex in gsm8k]
    golds = [ex.gold for ex in gsm8k]
    anchors = ["anchor"] * len(gsm8k)
    assert accuracy(solutions, anchors, golds) == [1.0] * len(gsm8k)  # the reference solutions are right
    wrong = [s.rsplit("####", 1)[0] + f"#### {int(g) + 1}" for s, g in zip(solutions, golds)]
    assert accuracy(wrong, anchors, golds) == [0.0] * len(gsm8k)
    assert accuracy(["I am not sure how to solve this.", ""], ["anchor"] * 2, golds[:2]) == [0.0, 0.0]  # no number
    assert accuracy(solutions[:2], ["user_turn"] * 2, golds[:2]) == [None, None]
    ids = [[1, 2, 3]] * 2
    assert reward(completions=["x", "y"], completion_ids=ids, kind=["anchor"] * 2, query=["q"] * 2,
                  answer=[None] * 2, controls=[[], []]) == [None, None]


def test_length_guard():
    guard = LengthGuard(budget=32)
    ids = [list(range(n)) for n in (0, 32, 48, 64, 200)]
    assert guard(completion_ids=ids, kind=["user_turn"] * 5) == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert guard(completion_ids=ids[:1], kind=["anchor"]) == [None]


def test_a_question_specific_to_a_kind_of_problem_is_not_rewarded(reward, tokenizer):
    """One control lets "why two steps for the years?" through whenever it is drawn from another kind of problem; the
    reward asks for every control, one of which is an age problem too."""
    age = ("Mei is 9 times as old as Noah, who is 6. How old will Mei be in 7 years?",
           "Mei is 6 * 9 = 54 years old now. In 7 years she will be 54 + 7 = 61.")
    other_age = ("Tom is 4. Ana is 3 times as old. How old will Ana be in 5 years?",
                 "Ana is 4 * 3 = 12 years old now. In 5 years she will be 12 + 5 = 17.")
    change = ("Ivy buys 3 pens at $4 each and pays with $20. How much change?", "3 * 4 = 12, so 20 - 12 = 8 dollars.")
    ids = [[1, 2]]

    def score(turn, controls):
        return reward(completions=[turn], completion_ids=ids, kind=["user_turn"], query=[age[0]], answer=[age[1]],
                      controls=[[list(c) for c in controls]])[0]

    generic = "Why do we need two steps for the years?"
    # It fits only age problems, so it passes the control `change`; but it takes nothing from its own answer, and
    # would follow any answer to its query (the answer control, issue 17): not grounded even against one control.
    assert score(generic, [change]) < LABEL_REWARD["grounded"]
    assert score(generic, [change, other_age]) < LABEL_REWARD["grounded"]
    assert score("How did you get 54 years?", [change, other_age]) == LABEL_REWARD["grounded"]
    # Partial credit, a step towards reacting: specific to its conversation against every control, answer aside.
    assert score(generic, [change]) == LABEL_REWARD["specific"]  # against the one control it fits this story only
    assert score(generic, [change, other_age]) == 0.0  # it fits the other age problem as well
    assert score("What if Noah was 8 instead of 6?", [change, other_age]) == LABEL_REWARD["specific"]
    assert LABEL_REWARD["followup"] < LABEL_REWARD["specific"] < LABEL_REWARD["grounded"]

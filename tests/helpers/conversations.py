"""Hand-made GSM8K-style conversations, as the testbed writes them: data to mine, train and probe on in tests."""

import random

FRUIT = ("apples pears plums lemons limes mangos melons kiwis figs dates cherries grapes peaches oranges apricots "
         "papayas guavas lychees quinces olives").split()


def conversations(n: int, seed: int = 0) -> list[dict]:
    """GSM8K-style conversations with a grounded follow-up (it names this problem's fruit), as the testbed writes
    them; at most 20."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        name, a, b, fruit = rng.choice(["Mia", "Omar", "Lena", "Ravi"]), rng.randint(2, 9), rng.randint(2, 9), FRUIT[i]
        rows.append({"messages": [
            # Not asked as a quantity question ("How many ...?"), so the grounded decision does not apply its answer
            # control, which the untrained tiny model's own answers could never pass: this tests the plumbing.
            {"role": "user", "content": f"{name} has {a} bags of {b} {fruit}. Count the {fruit} {name} has."},
            {"role": "assistant", "content": f"{name} has {a} * {b} = {a * b} {fruit}.\n#### {a * b}"},
            {"role": "user", "content": f"Why did you multiply the bags of {fruit} by {b}?"},
            {"role": "assistant", "content": f"Each of the {a} bags holds {b} {fruit}."},
        ]})
    return rows

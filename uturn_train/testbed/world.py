"""The testbed's world: multi-step arithmetic word problems in GSM8K format.

A scenario draws a name, objects and numbers, and solves the problem step by step. Every step keeps what it computes
and why, so that user follow-ups can ask about it and the assistant can explain it, and the inputs a user may change
("what if there were 7 boxes?") are named, so a variant of the same problem can be solved again.

```python
>>> problem = sample_problem(random.Random(0))
>>> print(problem.question)
Tara's age is 9 times Noah's age. Noah is 6. What will Tara's age be 7 years from now?
>>> print(problem.solution)
Noah is 6 and Tara's age is 9 times that, so Tara is 6 * 9 = 54 years old now.
7 years from now, Tara will be 54 + 7 = 61.
#### 61
>>> problem.with_number("c", 4).answer  # "what if it was 4 years from now?"
58
```
"""

import random
from dataclasses import dataclass, field

NAMES = {
    "she": "Mia Emma Sofia Ava Lily Zoe Nora Grace Chloe Aisha Priya Mei Hana Lucia Olga Rosa Tara Ines Leila Ruth",
    "he": "Liam Noah Ben Leo Omar Ravi Jonas Mateo Hugo Kenji Tom Sam Felix Ivan Diego Amir Paul Yusuf Theo Max",
}
HIS = {"she": "her", "he": "his"}


@dataclass
class Step:
    """One line of a solution: `left op right = value`, with what the value is and why it is computed."""

    left: int
    op: str  # one of + - * /
    right: int
    value: int
    text: str  # the line as the solution writes it
    what: str  # "the number of stickers Mia has at first"
    why: str  # "there are 6 packs with 8 stickers in each"
    unit: str  # what the value counts: "stickers"

    @property
    def expr(self) -> str:
        return f"{self.left} {self.op} {self.right}"


@dataclass
class Problem:
    """A word problem with its step-by-step solution; `knobs` maps each changeable input to how users name it."""

    scenario: str
    words: dict
    numbers: dict
    question: str
    steps: list[Step]
    knobs: dict = field(default_factory=dict)

    @property
    def answer(self) -> int:
        return self.steps[-1].value

    @property
    def solution(self) -> str:
        """GSM8K's answer format: the steps, then `#### N`."""
        return "\n".join(s.text for s in self.steps) + f"\n#### {self.answer}"

    @property
    def key(self) -> tuple:
        """Identifies the problem regardless of wording: held-out problems never share a key with training data."""
        return (self.scenario, *sorted(self.numbers.items()))

    def with_number(self, knob: str, value: int) -> "Problem | None":
        """The same problem with one input changed (same names, same wording), or None if it stops making sense."""
        return SCENARIOS[self.scenario](self.words, {**self.numbers, knob: value})


def _step(left, op, right, text, what, why, unit) -> Step:
    value = {"+": left + right, "-": left - right, "*": left * right, "/": left // right}[op]
    if value <= 0 or (op == "/" and left % right):
        raise ValueError  # not a sensible problem: the caller draws again
    expr = f"{left} {op} {right}"
    return Step(left, op, right, value, text.format(e=f"{expr} = {value}"), what, why, unit)


# ---------------------------------------------------------------------------------------------------------------------
# Scenarios. Each takes words `w` (name, pronouns, objects; `form` picks the wording) and numbers `n`, and returns the
# question, the steps and the knobs. A question is a few fact clauses and an ask; each solution line restates the
# clause it uses and computes, as chat assistants do ("Ivan has 4 packs ..., so that is 4 * 6 = 24 buttons"), which
# also lets a small model find the numbers by matching the words around them. Inputs are one digit (bills and book
# lengths are round numbers): the times table and two-digit sums with one-digit numbers are what a model of this
# size learns in minutes. Four scenarios only: with more templates the fixed step budget goes to wording, and copying
# the question's numbers, which a model this size learns last, comes too late (11 scenarios reached 0.11 accuracy).


def _change(w, n):
    N, item, (a, b, c) = w["name"], w["item"], (n["a"], n["b"], n["c"])
    c1, c2, ask = [
        (f"{N} buys {a} {item} that cost ${b} each", f"{N} gives the cashier a ${c} bill",
         f"How much change does {N} get?"),
        (f"At the store, {N} takes {a} {item} that cost ${b} each to the counter", f"{N} hands over a ${c} bill",
         f"How much should {N} get back?"),
    ][w["form"]]
    s1 = _step(a, "*", b, f"{c1}, so the {item} cost {{e}} dollars.", f"the cost of the {item}",
               f"{N} buys {a} {item} at ${b} each", "dollars")
    s2 = _step(c, "-", s1.value, f"{c2}, so the change is {{e}} dollars.", "the change",
               f"{N} pays with a ${c} bill for {item} that cost ${s1.value}", "dollars")
    return f"{c1}. {c2}. {ask}", [s1, s2], {"a": f"the number of {item}", "b": f"the price of the {item}",
                                            "c": "the bill"}


def _reading(w, n):
    N, (a, b, c) = w["name"], (n["a"], n["b"], n["c"])
    c0, c1, ask = [
        (f"{N} is reading a book with {c} pages", f"{w['He']} reads {a} pages every night for {b} nights",
         f"How many pages does {N} still have to read?"),
        (f"A novel has {c} pages", f"{N} reads {a} pages each evening for {b} evenings",
         "How many pages are still unread?"),
    ][w["form"]]
    s1 = _step(a, "*", b, f"{c1}, so {N} reads {{e}} pages.", "the pages read so far",
               f"{N} reads {a} pages at a time, {b} times", "pages")
    s2 = _step(c, "-", s1.value, f"{c0}, so {{e}} pages are still unread.", "the pages still to read",
               f"the book has {c} pages and {s1.value} are read", "pages")
    return f"{c0}. {c1}. {ask}", [s1, s2], {"a": "the pages read each time",
                                            "b": ["the number of nights", "the number of evenings"][w["form"]],
                                            "c": "the pages in the book"}


def _walks(w, n):
    N, (a, b, c) = w["name"], (n["a"], n["b"], n["c"])
    unit = ["miles", "kilometers"][w["form"]]
    c1, c2, ask = [
        (f"{N} walks {a} miles every day for {b} days", f"Then {w['he']} hikes another {c} miles up a hill",
         f"How many miles does {N} cover in all?"),
        (f"During training, {N} runs {a} kilometers a day for {b} days", f"Then {N} runs {c} kilometers in a race",
         f"What is the total distance {N} runs?"),
    ][w["form"]]
    s1 = _step(a, "*", b, f"{c1}, so that is {{e}} {unit}.", f"the {unit} of the first days",
               f"{N} does {a} {unit} a day for {b} days", unit)
    s2 = _step(s1.value, "+", c, f"{c2}, so the total is {{e}} {unit}.", "the total distance",
               f"the last {c} {unit} are added", unit)
    return f"{c1}. {c2}. {ask}", [s1, s2], {"a": f"the {unit} per day", "b": "the number of days",
                                            "c": f"the {unit} at the end"}


def _ages(w, n):
    N, M, (a, b, c) = w["name"], w["other"], (n["a"], n["b"], n["c"])
    q, t1, t2 = [
        (f"{N} is {a} years old. {M} is {b} times as old as {N}. How old will {M} be in {c} years?",
         f"{N} is {a} years old and {M} is {b} times as old, so {M} is {{e}} years old now.",
         f"In {c} years {M} will be {{e}}."),
        (f"{M}'s age is {b} times {N}'s age. {N} is {a}. What will {M}'s age be {c} years from now?",
         f"{N} is {a} and {M}'s age is {b} times that, so {M} is {{e}} years old now.",
         f"{c} years from now, {M} will be {{e}}."),
    ][w["form"]]
    s1 = _step(a, "*", b, t1, f"{M}'s age now", f"{M} is {b} times as old as {N}, who is {a}", "years")
    s2 = _step(s1.value, "+", c, t2, f"{M}'s age later", f"{c} years go by", "years")
    return q, [s1, s2], {"a": f"{N}'s age", "b": f"how many times older {M} is", "c": "the number of years"}


def _build(build):
    def scenario(words, numbers):
        try:
            question, steps, knobs = build(words, numbers)
        except ValueError:
            return None
        if any(s.value > 999 for s in steps):
            return None
        return Problem(build.__name__.lstrip("_"), words, numbers, question, steps, knobs)

    return scenario


SCENARIOS = {f.__name__.lstrip("_"): _build(f) for f in (_change, _reading, _walks, _ages)}

# The range each input is drawn from (a what-if change draws from the same range).
RANGES = {
    "change": {"a": range(2, 10), "b": range(2, 10), "c": (20, 50, 100)},
    "reading": {"a": range(2, 10), "b": range(2, 10), "c": range(50, 101, 10)},
    "walks": {"a": range(2, 10), "b": range(2, 10), "c": range(2, 10)},
    "ages": {"a": range(2, 10), "b": range(2, 10), "c": range(2, 10)},
}
WORDS = {"item": ["notebooks", "mugs", "candles", "pens", "scarves", "toy cars", "lamps"]}


def draw_number(rng: random.Random, scenario: str, knob: str) -> int:
    return rng.choice(RANGES[scenario][knob])


def sample_problem(rng: random.Random) -> Problem:
    """A random problem of a random scenario."""
    scenario = rng.choice(list(SCENARIOS))
    he = rng.choice(["she", "he"])
    names = NAMES[he].split()
    name = rng.choice(names)
    words = {
        "name": name, "he": he, "He": he.capitalize(), "his": HIS[he],
        "other": rng.choice([m for m in NAMES["she"].split() + NAMES["he"].split() if m != name]),
        "form": rng.randrange(2), **{k: rng.choice(v) for k, v in WORDS.items()},
    }
    while True:
        problem = SCENARIOS[scenario](words, {k: draw_number(rng, scenario, k) for k in RANGES[scenario]})
        if problem is not None:
            return problem

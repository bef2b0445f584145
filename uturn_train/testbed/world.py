"""The testbed's world: multi-step arithmetic word problems in GSM8K format.

A scenario draws a name, objects and numbers, and solves the problem step by step. Every step keeps what it computes
and why, so that user follow-ups can ask about it and the assistant can explain it, and the inputs a user may change
("what if there were 7 boxes?") are named, so a variant of the same problem can be solved again.

```python
>>> problem = sample_problem(random.Random(0))
>>> print(problem.question)
Ivan's age is 6 times Noah's age. Noah is 4. What will Ivan's age be 14 years from now?
>>> print(problem.solution)
Ivan is 4 * 6 = 24 years old now.
In 14 years Ivan will be 24 + 14 = 38.
#### 38
>>> problem.with_number("c", 30).answer  # "what if it was 30 years from now?"
54
```
"""

import random
from dataclasses import dataclass, field

NAMES = {
    "she": "Mia Emma Sofia Ava Lily Zoe Nora Grace Chloe Aisha Priya Mei Hana Lucia Olga Rosa Tara Ines Leila Ruth",
    "he": "Liam Noah Ben Leo Omar Ravi Jonas Mateo Hugo Kenji Tom Sam Felix Ivan Diego Amir Paul Yusuf Theo Max",
}
HIS = {"she": "her", "he": "his"}
RELATIVES = "brother sister cousin neighbor classmate aunt uncle".split()


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
# question, the steps and the knobs. Inputs are kept small where they are multiplied (the model learns the times
# table) and two-digit where they are added or subtracted, like GSM8K's easier problems. Scenarios share as few
# content words as possible: a new problem after an answer is unrelated to it, in words as in topic.
def _packs(w, n):
    N, obj = w["name"], w["obj"]
    q = [
        f"{N} has {n['a']} packs of {obj} with {n['b']} {obj} in each pack. {w['He']} gives {n['c']} {obj} to "
        f"{w['his']} {w['rel']}. How many {obj} does {N} have now?",
        f"{N} gets {n['a']} packs of {obj} as a gift. Each pack holds {n['b']} {obj}. Later {N} gives {n['c']} of "
        f"the {obj} to a {w['rel']}. How many {obj} does {N} keep?",
    ][w["form"]]
    s1 = _step(n["a"], "*", n["b"], f"{N} has {{e}} {obj}.", f"the number of {obj} {N} has at first",
               f"there are {n['a']} packs with {n['b']} {obj} in each", obj)
    s2 = _step(s1.value, "-", n["c"], f"After giving {n['c']} away, {w['he']} has {{e}} {obj}.",
               f"the {obj} {N} keeps", f"{N} gives {n['c']} of the {s1.value} {obj} away", obj)
    return q, [s1, s2], {"a": "the number of packs", "b": f"the {obj} in each pack", "c": f"the {obj} {N} gives away"}


def _change(w, n):
    N, item = w["name"], w["item"]
    q = [
        f"{N} buys {n['a']} {item} that cost ${n['b']} each and gives the cashier a ${n['c']} bill. How much change "
        f"does {N} get?",
        f"At the store, {item} cost ${n['b']} each. {N} takes {n['a']} {item} to the counter and hands over a "
        f"${n['c']} bill. How much should {N} get back?",
    ][w["form"]]
    s1 = _step(n["a"], "*", n["b"], f"The {item} cost {{e}} dollars.", f"the cost of the {item}",
               f"{N} buys {n['a']} {item} at ${n['b']} each", "dollars")
    s2 = _step(n["c"], "-", s1.value, "The change is {e} dollars.", "the change",
               f"{N} pays with a ${n['c']} bill for {item} that cost ${s1.value}", "dollars")
    return q, [s1, s2], {"a": f"the number of {item}", "b": f"the price of the {item}", "c": "the bill"}


def _savings(w, n):
    N = w["name"]
    q = [
        f"{N} saves ${n['a']} every week for {n['b']} weeks. Then {w['he']} spends ${n['c']} on a {w['thing']}. "
        f"How much does {N} have saved now?",
        f"Every week {N} puts ${n['a']} into a piggy bank. After {n['b']} weeks, {N} takes out ${n['c']} for a "
        f"{w['thing']}. How much is still in the piggy bank?",
    ][w["form"]]
    s1 = _step(n["a"], "*", n["b"], f"{N} saves {{e}} dollars.", "the savings",
               f"{N} saves ${n['a']} a week for {n['b']} weeks", "dollars")
    s2 = _step(s1.value, "-", n["c"], f"After the {w['thing']}, {N} has {{e}} dollars.", "the savings now",
               f"the {w['thing']} costs ${n['c']}", "dollars")
    return q, [s1, s2], {"a": f"the money {N} saves each week", "b": "the number of weeks",
                         "c": f"the price of the {w['thing']}"}


def _hall(w, n):
    place = w["place"]
    seats = ["chairs", "seats"][w["form"]]
    q = [
        f"In the {place} there are {n['a']} rows of chairs with {n['b']} chairs in each row. The staff add {n['c']} "
        f"more chairs along the wall. How many chairs are there in the {place}?",
        f"For a concert, {n['a']} rows of {n['b']} seats are set up in the {place}, plus {n['c']} folding seats by the "
        f"stage. How many seats are there altogether?",
    ][w["form"]]
    s1 = _step(n["a"], "*", n["b"], f"The rows have {{e}} {seats}.", f"the {seats} in the rows",
               f"there are {n['a']} rows with {n['b']} {seats} each", seats)
    s2 = _step(s1.value, "+", n["c"], f"With the extra ones there are {{e}} {seats}.", f"all the {seats}",
               f"{n['c']} more {seats} are added to the {s1.value} in the rows", seats)
    return q, [s1, s2], {"a": "the number of rows", "b": f"the {seats} in a row", "c": f"the extra {seats}"}


def _reading(w, n):
    N = w["name"]
    q = [
        f"{N} is reading a book with {n['c']} pages. {w['He']} reads {n['a']} pages every night for {n['b']} nights. "
        f"How many pages does {N} still have to read?",
        f"A novel has {n['c']} pages. {N} reads {n['a']} pages each evening. How many pages are still unread after "
        f"{n['b']} evenings?",
    ][w["form"]]
    s1 = _step(n["a"], "*", n["b"], f"{N} reads {{e}} pages.", "the pages read so far",
               f"{N} reads {n['a']} pages at a time, {n['b']} times", "pages")
    s2 = _step(n["c"], "-", s1.value, "So {e} pages are still unread.", "the pages still to read",
               f"the book has {n['c']} pages and {s1.value} are read", "pages")
    return q, [s1, s2], {"a": "the pages read each time", "b": ["the number of nights", "the number of evenings"][w["form"]],
                         "c": "the pages in the book"}


def _walks(w, n):
    N = w["name"]
    unit = ["miles", "kilometers"][w["form"]]
    q = [
        f"{N} walks {n['a']} miles every day for {n['b']} days. Then {w['he']} hikes another {n['c']} miles up a "
        f"hill. How many miles does {N} cover in all?",
        f"During training, {N} runs {n['a']} kilometers a day for {n['b']} days and then {n['c']} kilometers in a "
        f"race. What is the total distance {N} runs?",
    ][w["form"]]
    s1 = _step(n["a"], "*", n["b"], f"In {n['b']} days {N} covers {{e}} {unit}.", f"the {unit} of the first days",
               f"{N} does {n['a']} {unit} a day for {n['b']} days", unit)
    s2 = _step(s1.value, "+", n["c"], f"The total is {{e}} {unit}.", "the total distance",
               f"the last {n['c']} {unit} are added", unit)
    return q, [s1, s2], {"a": f"the {unit} per day", "b": "the number of days", "c": f"the {unit} at the end"}


def _ages(w, n):
    N, M = w["name"], w["other"]
    q = [
        f"{N} is {n['a']} years old. {M} is {n['b']} times as old as {N}. How old will {M} be in {n['c']} years?",
        f"{M}'s age is {n['b']} times {N}'s age. {N} is {n['a']}. What will {M}'s age be {n['c']} years from now?",
    ][w["form"]]
    s1 = _step(n["a"], "*", n["b"], f"{M} is {{e}} years old now.", f"{M}'s age now",
               f"{M} is {n['b']} times as old as {N}, who is {n['a']}", "years")
    s2 = _step(s1.value, "+", n["c"], f"In {n['c']} years {M} will be {{e}}.", f"{M}'s age later",
               f"{n['c']} years go by", "years")
    return q, [s1, s2], {"a": f"{N}'s age", "b": f"how many times older {M} is", "c": "the number of years"}


def _sharing(w, n):
    N, treat = w["name"], w["treat"]
    total = n["q"] * n["b"]
    q = [
        f"{N} bakes {total} {treat} and shares them equally among {n['b']} friends. Each friend already had "
        f"{n['c']} {treat}. How many {treat} does each friend have now?",
        f"A box of {total} {treat} is split evenly between {n['b']} kids, and each kid also gets {n['c']} {treat} "
        f"from {N}. How many {treat} does every kid end up with?",
    ][w["form"]]
    s1 = _step(total, "/", n["b"], f"Each one gets {{e}} {treat}.", "each share",
               f"{total} {treat} are split between {n['b']}", treat)
    s2 = _step(s1.value, "+", n["c"], f"With the other {n['c']}, each has {{e}} {treat}.", "what each one has",
               f"each also has {n['c']} more", treat)
    return q, [s1, s2], {"b": ["the number of friends", "the number of kids"][w["form"]], "c": f"the extra {treat}"}


def _garden(w, n):
    N, plant = w["name"], w["plant"]
    q = [
        f"{N} plants {n['a']} beds of {plant} with {n['b']} in each bed. {n['c']} of the {plant} do not grow, so "
        f"{N} plants {n['d']} new ones. How many {plant} are growing now?",
        f"A garden has {n['a']} beds of {n['b']} {plant}. Rabbits eat {n['c']} of them and {N} replaces {n['d']}. "
        f"How many {plant} are in the garden now?",
    ][w["form"]]
    s1 = _step(n["a"], "*", n["b"], f"At first there are {{e}} {plant}.", f"the {plant} planted",
               f"there are {n['a']} beds of {n['b']}", plant)
    s2 = _step(s1.value, "-", n["c"], f"After losing {n['c']}, {{e}} are still there.", f"the {plant} not lost",
               f"{n['c']} of the {s1.value} are lost", plant)
    s3 = _step(s2.value, "+", n["d"], f"With the new ones there are {{e}} {plant}.", f"the {plant} growing now",
               f"{N} plants {n['d']} more", plant)
    return q, [s1, s2, s3], {"a": "the number of beds", "b": f"the {plant} in a bed",
                             "c": f"the {plant} lost", "d": f"the new {plant}"}


def _wages(w, n):
    N = w["name"]
    q = [
        f"{N} earns ${n['a']} an hour at the {w['shop']}. {w['He']} works {n['b']} hours on Saturday and {n['c']} "
        f"hours on Sunday. How much does {N} earn over the weekend?",
        f"At the {w['shop']}, {N} makes ${n['a']} per hour. On Monday {N} worked {n['b']} hours and on Tuesday "
        f"{n['c']} hours. How much did {N} make?",
    ][w["form"]]
    s1 = _step(n["b"], "+", n["c"], f"{N} works {{e}} hours.", "the hours worked",
               f"{N} works {n['b']} hours and then {n['c']} hours", "hours")
    s2 = _step(n["a"], "*", s1.value, f"{N} earns {{e}} dollars.", "the pay",
               f"each of the {s1.value} hours pays ${n['a']}", "dollars")
    return q, [s1, s2], {"a": "the pay per hour", "b": "the hours on the first day", "c": "the hours on the second day"}


def _fruit(w, n):
    N, fruit = w["name"], w["fruit"]
    q = [
        f"{N} carries home {n['a']} bags of {fruit} with {n['b']} {fruit} in each bag, and {n['c']} loose {fruit}. "
        f"{N} uses {n['d']} {fruit} to make juice. How many {fruit} are there after the juice?",
        f"There are {n['a']} bags of {n['b']} {fruit} and {n['c']} more {fruit} on the table. {N} squeezes "
        f"{n['d']} of them. How many {fruit} are not squeezed?",
    ][w["form"]]
    s1 = _step(n["a"], "*", n["b"], f"There are {{e}} {fruit} in the bags.", f"the {fruit} in the bags",
               f"there are {n['a']} bags with {n['b']} each", fruit)
    s2 = _step(s1.value, "+", n["c"], f"With the loose ones there are {{e}} {fruit}.", f"all the {fruit}",
               f"{n['c']} loose {fruit} are added", fruit)
    s3 = _step(s2.value, "-", n["d"], f"After the juice, {N} has {{e}} {fruit}.", f"the {fruit} after the juice",
               f"{n['d']} are used for juice", fruit)
    return q, [s1, s2, s3], {"a": "the number of bags", "b": f"the {fruit} in a bag", "c": f"the loose {fruit}",
                             "d": f"the {fruit} for the juice"}


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


SCENARIOS = {f.__name__.lstrip("_"): _build(f) for f in
             (_packs, _change, _savings, _hall, _reading, _walks, _ages, _sharing, _garden, _wages, _fruit)}

# The range each input is drawn from (a what-if change draws from the same range).
RANGES = {
    "packs": {"a": range(2, 10), "b": range(2, 10), "c": range(10, 41)},
    "change": {"a": range(2, 10), "b": range(2, 10), "c": (20, 50, 100)},
    "savings": {"a": range(2, 10), "b": range(2, 10), "c": range(10, 41)},
    "hall": {"a": range(2, 10), "b": range(2, 10), "c": range(10, 41)},
    "reading": {"a": range(2, 10), "b": range(2, 10), "c": range(50, 151)},
    "walks": {"a": range(2, 10), "b": range(2, 10), "c": range(10, 41)},
    "ages": {"a": range(2, 10), "b": range(2, 10), "c": range(10, 31)},
    "sharing": {"q": range(2, 10), "b": range(2, 10), "c": range(10, 41)},
    "garden": {"a": range(2, 10), "b": range(2, 10), "c": range(10, 31), "d": range(10, 31)},
    "wages": {"a": range(2, 10), "b": range(2, 6), "c": range(2, 5)},  # b + c <= 9: one-digit times table
    "fruit": {"a": range(2, 10), "b": range(2, 10), "c": range(10, 31), "d": range(10, 41)},
}
WORDS = {
    "obj": "stickers cards marbles stamps beads shells buttons badges".split(),
    "item": ["notebooks", "mugs", "candles", "pens", "scarves", "toy cars", "lamps"],
    "thing": "bike kite game helmet jacket watch".split(),
    "place": "hall theater gym library church auditorium".split(),
    "fruit": "apples oranges lemons peaches plums pears".split(),
    "treat": "cookies candies cupcakes muffins crackers pretzels".split(),
    "plant": "tulips roses carrots tomatoes cabbages sunflowers".split(),
    "shop": "bakery cafe bookstore market diner garage".split(),
}


def draw_number(rng: random.Random, scenario: str, knob: str) -> int:
    return rng.choice(RANGES[scenario][knob])


def sample_problem(rng: random.Random, scenario: str | None = None, avoid: str | None = None) -> Problem:
    """A random problem, of `scenario` or any other than `avoid`."""
    if scenario is None:
        scenario = rng.choice([s for s in SCENARIOS if s != avoid])
    he = rng.choice(["she", "he"])
    names = NAMES[he].split()
    name = rng.choice(names)
    words = {
        "name": name, "he": he, "He": he.capitalize(), "his": HIS[he], "rel": rng.choice(RELATIVES),
        "other": rng.choice([m for m in NAMES["she"].split() + NAMES["he"].split() if m != name]),
        "form": rng.randrange(2), **{k: rng.choice(v) for k, v in WORDS.items()},
    }
    while True:
        problem = SCENARIOS[scenario](words, {k: draw_number(rng, scenario, k) for k in RANGES[scenario]})
        if problem is not None:
            return problem

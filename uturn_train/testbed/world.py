"""The testbed's world: multi-step arithmetic word problems in GSM8K format.

A scenario draws a name, objects and numbers, and solves the problem step by step. Every step keeps what it computes
and why, so that user follow-ups can ask about it and the assistant can explain it, and the inputs a user may change
("what if there were 7 boxes?") are named, so a variant of the same problem can be solved again.

```python
>>> problem = sample_problem(random.Random(0))
>>> print(problem.question)
Ivan's age is 6 times Noah's age. Noah is 4. What will Ivan's age be 4 years from now?
>>> print(problem.solution)
Noah is 4 and Ivan's age is 6 times that, so Ivan is 4 * 6 = 24 years old now.
4 years from now, Ivan will be 24 + 4 = 28.
#### 28
>>> problem.with_number("c", 7).answer  # "what if it was 7 years from now?"
31
```
"""

import random
from collections.abc import Sequence
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
# question, the steps and the knobs. A question is a few fact clauses and an ask; each solution line restates the
# clause it uses and computes, as chat assistants do ("Ivan has 4 packs ..., so that is 4 * 6 = 24 buttons"), which
# also lets a small model find the numbers by matching the words around them. Inputs are one digit (bills and book
# lengths are round numbers): the times table and two-digit sums with one-digit numbers are what a model of this
# size learns in minutes.
def _packs(w, n):
    N, obj, (a, b, c) = w["name"], w["obj"], (n["a"], n["b"], n["c"])
    c1, c2, ask = [
        (f"{N} has {a} packs of {obj} with {b} {obj} in each pack", f"{w['He']} gives {c} {obj} to {w['his']} {w['rel']}",
         f"How many {obj} does {N} have now?"),
        (f"{N} gets {a} packs of {obj} as a gift, and each pack holds {b} {obj}",
         f"Later {N} gives {c} of the {obj} to a {w['rel']}", f"How many {obj} does {N} keep?"),
    ][w["form"]]
    s1 = _step(a, "*", b, f"{c1}, so that is {{e}} {obj}.", f"the number of {obj} {N} has at first",
               f"there are {a} packs with {b} {obj} in each", obj)
    s2 = _step(s1.value, "-", c, f"{c2}, so {N} still has {{e}} {obj}.", f"the {obj} {N} keeps",
               f"{N} gives {c} of the {s1.value} {obj} away", obj)
    return f"{c1}. {c2}. {ask}", [s1, s2], {"a": "the number of packs", "b": f"the {obj} in each pack",
                                            "c": f"the {obj} {N} gives away"}


def _change(w, n):
    N, item, (a, b, c) = w["name"], w["item"], (n["a"], n["b"], n["c"])
    c1, c2, ask = [
        (f"{N} buys {a} {item} that cost ${b} each", f"{N} gives the cashier a ${c} bill", f"How much change does {N} get?"),
        (f"At the store, {N} takes {a} {item} that cost ${b} each to the counter", f"{N} hands over a ${c} bill",
         f"How much should {N} get back?"),
    ][w["form"]]
    s1 = _step(a, "*", b, f"{c1}, so the {item} cost {{e}} dollars.", f"the cost of the {item}",
               f"{N} buys {a} {item} at ${b} each", "dollars")
    s2 = _step(c, "-", s1.value, f"{c2}, so the change is {{e}} dollars.", "the change",
               f"{N} pays with a ${c} bill for {item} that cost ${s1.value}", "dollars")
    return f"{c1}. {c2}. {ask}", [s1, s2], {"a": f"the number of {item}", "b": f"the price of the {item}", "c": "the bill"}


def _savings(w, n):
    N, thing, (a, b, c) = w["name"], w["thing"], (n["a"], n["b"], n["c"])
    c1, c2, ask = [
        (f"{N} saves ${a} every week for {b} weeks", f"Then {w['he']} spends ${c} on a {thing}",
         f"How much does {N} have saved now?"),
        (f"Every week {N} puts ${a} into a piggy bank, for {b} weeks", f"Then {N} takes out ${c} for a {thing}",
         "How much is still in the piggy bank?"),
    ][w["form"]]
    s1 = _step(a, "*", b, f"{c1}, so {N} saves {{e}} dollars.", "the savings", f"{N} saves ${a} a week for {b} weeks",
               "dollars")
    s2 = _step(s1.value, "-", c, f"{c2}, so {N} has {{e}} dollars.", "the savings now", f"the {thing} costs ${c}",
               "dollars")
    return f"{c1}. {c2}. {ask}", [s1, s2], {"a": f"the money {N} saves each week", "b": "the number of weeks",
                                            "c": f"the price of the {thing}"}


def _hall(w, n):
    place, (a, b, c) = w["place"], (n["a"], n["b"], n["c"])
    seats = ["chairs", "seats"][w["form"]]
    c1, c2, ask = [
        (f"In the {place} there are {a} rows of chairs with {b} chairs in each row",
         f"The staff add {c} more chairs along the wall", f"How many chairs are there in the {place}?"),
        (f"For a concert, {a} rows of {b} seats are set up in the {place}", f"There are also {c} folding seats by the stage",
         "How many seats are there altogether?"),
    ][w["form"]]
    s1 = _step(a, "*", b, f"{c1}, so the rows have {{e}} {seats}.", f"the {seats} in the rows",
               f"there are {a} rows with {b} {seats} each", seats)
    s2 = _step(s1.value, "+", c, f"{c2}, so there are {{e}} {seats}.", f"all the {seats}",
               f"{c} more {seats} are added to the {s1.value} in the rows", seats)
    return f"{c1}. {c2}. {ask}", [s1, s2], {"a": "the number of rows", "b": f"the {seats} in a row",
                                            "c": f"the extra {seats}"}


def _reading(w, n):
    N, (a, b, c) = w["name"], (n["a"], n["b"], n["c"])
    c0, c1, ask = [
        (f"{N} is reading a book with {c} pages", f"{w['He']} reads {a} pages every night for {b} nights",
         f"How many pages does {N} still have to read?"),
        (f"A novel has {c} pages", f"{N} reads {a} pages each evening for {b} evenings", "How many pages are still unread?"),
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


def _sharing(w, n):
    N, treat, (q, b, c) = w["name"], w["treat"], (n["q"], n["b"], n["c"])
    c1, c2, ask = [
        (f"{N} bakes {q * b} {treat} and shares them equally among {b} friends", f"Each friend already had {c} {treat}",
         f"How many {treat} does each friend have now?"),
        (f"A box of {q * b} {treat} is split evenly between {b} kids", f"Each kid also gets {c} {treat} from {N}",
         f"How many {treat} does every kid end up with?"),
    ][w["form"]]
    s1 = _step(q * b, "/", b, f"{c1}, so each one gets {{e}} {treat}.", "each share",
               f"{q * b} {treat} are split between {b}", treat)
    s2 = _step(s1.value, "+", c, f"{c2}, so each one has {{e}} {treat}.", "what each one has",
               f"each also has {c} more", treat)
    return f"{c1}. {c2}. {ask}", [s1, s2], {"b": ["the number of friends", "the number of kids"][w["form"]],
                                            "c": f"the extra {treat}"}


def _garden(w, n):
    N, plant, (a, b, c, d) = w["name"], w["plant"], (n["a"], n["b"], n["c"], n["d"])
    c1, c2, c3, ask = [
        (f"{N} plants {a} beds of {plant} with {b} in each bed", f"Sadly {c} of the {plant} do not grow",
         f"{N} plants {d} new ones", f"How many {plant} are growing now?"),
        (f"A garden has {a} beds of {b} {plant}", f"Rabbits eat {c} of the {plant}", f"{N} replaces {d} of them",
         f"How many {plant} are in the garden now?"),
    ][w["form"]]
    s1 = _step(a, "*", b, f"{c1}, so there are {{e}} {plant}.", f"the {plant} planted", f"there are {a} beds of {b}",
               plant)
    s2 = _step(s1.value, "-", c, f"{c2}, so {{e}} are still there.", f"the {plant} not lost",
               f"{c} of the {s1.value} are lost", plant)
    s3 = _step(s2.value, "+", d, f"{c3}, so there are {{e}} {plant} now.", f"the {plant} growing now",
               f"{N} plants {d} more", plant)
    return f"{c1}. {c2}. {c3}. {ask}", [s1, s2, s3], {"a": "the number of beds", "b": f"the {plant} in a bed",
                                                      "c": f"the {plant} lost", "d": f"the new {plant}"}


def _wages(w, n):
    N, (a, b, c) = w["name"], (n["a"], n["b"], n["c"])
    c1, c2, ask = [
        (f"{N} earns ${a} an hour at the {w['shop']}", f"{w['He']} works {b} hours on Saturday and {c} hours on Sunday",
         f"How much does {N} earn over the weekend?"),
        (f"At the {w['shop']}, {N} makes ${a} per hour", f"On Monday {N} worked {b} hours and on Tuesday {c} hours",
         f"How much did {N} make?"),
    ][w["form"]]
    s1 = _step(b, "+", c, f"{c2}, so that is {{e}} hours.", "the hours worked", f"{N} works {b} hours and then {c} hours",
               "hours")
    s2 = _step(a, "*", s1.value, f"{c1}, so {N} earns {{e}} dollars.", "the pay",
               f"each of the {s1.value} hours pays ${a}", "dollars")
    return f"{c1}. {c2}. {ask}", [s1, s2], {"a": "the pay per hour", "b": "the hours on the first day",
                                            "c": "the hours on the second day"}


def _fruit(w, n):
    N, fruit, (a, b, c, d) = w["name"], w["fruit"], (n["a"], n["b"], n["c"], n["d"])
    c1, c2, c3, ask = [
        (f"{N} carries home {a} bags of {fruit} with {b} {fruit} in each bag", f"There are also {c} loose {fruit}",
         f"{N} uses {d} {fruit} to make juice", f"How many {fruit} are there after the juice?"),
        (f"There are {a} bags of {b} {fruit} on the table", f"Beside the bags lie {c} more {fruit}",
         f"{N} squeezes {d} of the {fruit}", f"How many {fruit} are not squeezed?"),
    ][w["form"]]
    s1 = _step(a, "*", b, f"{c1}, so that is {{e}} {fruit}.", f"the {fruit} in the bags",
               f"there are {a} bags with {b} each", fruit)
    s2 = _step(s1.value, "+", c, f"{c2}, so there are {{e}} {fruit}.", f"all the {fruit}",
               f"{c} loose {fruit} are added", fruit)
    s3 = _step(s2.value, "-", d, f"{c3}, so {{e}} {fruit} are left.", f"the {fruit} left", f"{d} are used", fruit)
    return f"{c1}. {c2}. {c3}. {ask}", [s1, s2, s3], {"a": "the number of bags", "b": f"the {fruit} in a bag",
                                                      "c": f"the loose {fruit}", "d": f"the {fruit} used"}


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
    "packs": {"a": range(2, 10), "b": range(2, 10), "c": range(2, 10)},
    "change": {"a": range(2, 10), "b": range(2, 10), "c": (20, 50, 100)},
    "savings": {"a": range(2, 10), "b": range(2, 10), "c": range(2, 10)},
    "hall": {"a": range(2, 10), "b": range(2, 10), "c": range(2, 10)},
    "reading": {"a": range(2, 10), "b": range(2, 10), "c": range(50, 101, 10)},
    "walks": {"a": range(2, 10), "b": range(2, 10), "c": range(2, 10)},
    "ages": {"a": range(2, 10), "b": range(2, 10), "c": range(2, 10)},
    "sharing": {"q": range(2, 10), "b": range(2, 10), "c": range(2, 10)},
    "garden": {"a": range(2, 10), "b": range(2, 10), "c": range(2, 10), "d": range(2, 10)},
    "wages": {"a": range(2, 10), "b": range(2, 6), "c": range(2, 5)},  # b + c <= 9: one-digit times table
    "fruit": {"a": range(2, 10), "b": range(2, 10), "c": range(2, 10), "d": range(2, 10)},
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


def sample_problem(rng: random.Random, scenarios: Sequence[str] | None = None) -> Problem:
    """A random problem of one of `scenarios` (default: any)."""
    scenario = rng.choice(list(scenarios or SCENARIOS))
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

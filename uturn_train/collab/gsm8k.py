"""Collaboration tasks from GSM8K's test problems, with the oracle's lines written from each reference solution.

`uturn collab --task gsm8k` (the test split from the hub, or `--data` a local file in GSM8K's format): what a user of a
real model runs, where the testbed's tasks (`uturn_train.testbed.collab`) need the testbed's world.

- **peer_check**: the reference solution, right, or (half the time) with one calculator step off by a small amount and
  the error carried through every later step that uses it, to a wrong final answer. A GSM8K solution marks each step's
  arithmetic as `<<48/2=24>>24`: the slip changes that step's result, then every later step's expression that holds a
  changed value is computed again. The answer the model reacts to is the solution without those marks, as the probe
  shows it (`tasks.gsm8k.to_example`).
- **info_gap**: the question with one of its numbers replaced by "some" (a number the solution computes with, written
  once, before a word: "lay 16 eggs" -> "lay some eggs"); the oracle's reveal is the question's own sentence that held
  it ("Janet's ducks lay 16 eggs per day."), and the word the number counted (`asks_for`: "eggs") is what an ask
  must name for a partner that reveals only to such a question (`OraclePartner(named=True)`, online RL).

Problems whose steps do not each hold exactly one mark that evaluates to its stated result are left out (278 of the
1,319 test problems), as are problems where no step can slip or no number can go. Never the training split: mining and
GRPO draw their prompts from it.
"""

import ast
import operator
import random
import re

from ..tasks import load_task

ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")
_MARK = re.compile(r"<<([^=<>]+)=([^<>]+)>>")
_NUMBER = re.compile(r"(?<![\d.])\d+(?:\.\d+)?(?![\d])")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
# "some" reads as English for a number that stands as a word (not "$5", "1/2", "€30") before a noun, not before
# these ("some times as many", "some years old", "some more").
_NOT_BEFORE = {"times", "years", "more", "less", "fewer", "percent", "of", "and", "or", "to", "per"}


def evaluate(expr: str) -> float:
    """The value of a calculator mark's expression: numbers, + - * /, parentheses. Raises `ValueError` on anything
    else (GSM8K's marks hold a few with `%`, `**` or units)."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError(f"not a calculator expression: {expr!r}")

    try:
        return walk(ast.parse(expr.replace(",", ""), mode="eval"))
    except (SyntaxError, ZeroDivisionError) as err:
        raise ValueError(f"not a calculator expression: {expr!r}") from err


def _show(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}".rstrip("0").rstrip(".")


def _result(line: str) -> str:
    """The result a step's mark states, as written in the text after it."""
    return _show(float(_MARK.search(line).group(2).replace(",", "")))


def _steps(solution: str) -> list[str] | None:
    """The solution's step lines (before `####`), or None when a line lacks exactly one mark that evaluates to the
    result it states."""
    lines = solution.rpartition("####")[0].strip().split("\n")
    for line in lines:
        marks = _MARK.findall(line)
        if len(marks) != 1:
            return None
        try:
            if abs(evaluate(marks[0][0]) - float(marks[0][1].replace(",", ""))) > 1e-6:
                return None
        except ValueError:
            return None
    return lines


def _unmark(text: str) -> str:
    return _MARK.sub("", text)


def _carry(lines: list[str], j: int, delta: int, avoid: set[str]) -> tuple[list[str], list[str]] | None:
    """The lines with step `j`'s result off by `delta` and every later step that uses a changed value computed
    again; and the changed values, in order. None when the slip is not a clean wrong answer (a value not positive, a
    whole number turned fractional, a wrong value among `avoid`, the final result unchanged)."""
    changed: dict[str, str] = {}  # old value -> new value, as written
    out = list(lines)
    for i in range(j, len(lines)):
        line = out[i]
        if i > j and changed:  # every changed value this line names, in its text and its mark, becomes the new one
            line = _NUMBER.sub(lambda m: changed.get(m.group(), m.group()), line)
        mark = _MARK.search(line)
        expr, stated = mark.groups()
        before = float(stated.replace(",", ""))
        value = evaluate(expr) + (delta if i == j else 0)
        if value <= 0 or (before.is_integer() and not float(value).is_integer()):
            return None
        new, shown, rest = _show(value), _show(before), line[mark.end():]
        if i == j or new != shown:
            if not rest.lstrip("$").startswith(shown) or new in avoid:
                # The result is not written right after its mark (no clean place to change it), or the wrong value is
                # one the problem already holds (a user naming it would point at the given, not the slip).
                return None
            rest = rest.replace(shown, new, 1)
            changed[shown] = new
        out[i] = line[: mark.start()] + f"<<{expr}={new}>>" + rest
    if _result(out[-1]) == _result(lines[-1]):
        return None
    return out, [*(v for v in changed.values() if v != _result(out[-1])), _result(out[-1])]  # the final answer last


def peer_check_task(example, name: str, rng: random.Random, wrong: bool) -> dict | None:
    lines = _steps(example.meta["solution"])
    if lines is None:
        return None
    right = _unmark("\n".join(lines)) + f"\n#### {example.gold}"
    oracle, shown = {"wrong_step": None, "solution": right}, right
    if wrong:
        if _result(lines[-1]) != example.gold:  # the last step does not compute the final answer: no slip reaches it
            return None
        question_numbers = set(_NUMBER.findall(example.query.replace(",", "")))
        results = {_result(line) for line in lines}
        options = []
        for j in range(min(len(lines), len(ORDINALS))):
            if _result(lines[j]) in question_numbers:  # also a given: carrying it would change the given too
                continue
            for delta in (-10, -2, -1, 1, 2, 10):
                if (carried := _carry(lines, j, delta, question_numbers | results)) is not None:
                    options.append((j, carried))
        if not options:
            return None
        j, (slipped, values) = rng.choice(options)
        expr = _MARK.search(lines[j]).group(1)
        shown = _unmark("\n".join(slipped)) + f"\n#### {values[-1]}"
        oracle.update(
            wrong_step=j, values=values, operands=_NUMBER.findall(expr.replace(",", "")), ordinal=ORDINALS[j],
            fix=f"Let me redo the {ORDINALS[j]} step: {expr} = {_show(evaluate(expr))}, not {_result(slipped[j])}. "
                f"I made a mistake there. The correct solution:\n{right}")
    return {"id": f"{name}-peer_check", "family": "peer_check", "gold": example.gold, "answer_right": not wrong,
            "messages": [{"role": "user", "content": example.query}, {"role": "assistant", "content": shown}],
            "oracle": oracle}


def _sentences(text: str) -> list[tuple[int, int]]:
    bounds = [0, *(m.end() for m in _SENTENCE.finditer(text)), len(text)]
    return list(zip(bounds, bounds[1:]))


def _gap(question: str, solution: str, rng: random.Random) -> tuple[str, str, str] | None:
    """The question with one number left out, the sentence that held it and the word the number counted ("16 eggs":
    "eggs", the missing quantity's name); None if no number can go."""
    used = {n for expr, _ in _MARK.findall(solution) for n in _NUMBER.findall(expr.replace(",", ""))}
    options = []
    for first, last in _sentences(question):
        sentence = question[first:last].rstrip()
        if sentence.endswith("?"):  # the question asked: without its number it asks something else
            continue
        for m in _NUMBER.finditer(question, first, first + len(sentence)):
            value, (start, end) = m.group(), m.span()
            after = question[end:].split(maxsplit=1)
            once = len(re.findall(rf"(?<![\d.,]){re.escape(value)}(?!\d|[.,]\d)", question)) == 1
            word = question[start - 1: start] in ("", " ") and not question[:start].endswith("another ")
            if (value in used and once and word and question[end:end + 1] == " " and after[0].isalpha()
                    and after[0].lower() not in _NOT_BEFORE):
                options.append((question[:start] + "some" + question[end:], sentence.strip(), after[0]))
    return rng.choice(options) if options else None


def info_gap_task(example, name: str, rng: random.Random) -> dict | None:
    if _steps(example.meta["solution"]) is None:
        return None
    gap = _gap(example.query, example.meta["solution"], rng)
    if gap is None:
        return None
    question, reveal, counted = gap
    brief = (f"You are a user who needs help with a math problem. The whole problem is: {example.query} "
             f"You only wrote: {question} If the assistant asks for what is missing, tell it ({reveal}) in one short "
             "sentence. Never solve the problem yourself.")
    return {"id": f"{name}-info_gap", "family": "info_gap", "gold": example.gold,
            "messages": [{"role": "user", "content": question}], "brief": brief,
            "oracle": {"reveal": reveal, "asks_for": counted}}


def gsm8k_collab_tasks(data: str | None = None, seed: int = 0, wrong_share: float = 0.5, split: str = "test",
                       limit: int | None = None, option: str = "--data") -> list[dict]:
    """Per GSM8K problem (the hub's `split`, or `data`, a local file in its format; the first `limit`) an info_gap
    task and a peer_check task where each can be made; seeded, so every model meets the same tasks. Online RL takes
    `split="train"` (ids `gsm8k-train-<i>-<family>`): the test split is what `uturn collab` measures."""
    rng = random.Random(seed)
    prefix = "gsm8k" if split == "test" else f"gsm8k-{split}"
    rows = []
    for index, example in enumerate(load_task("gsm8k", data, limit=limit, split=split, data_option=option)):
        if (task := info_gap_task(example, f"{prefix}-{index}", rng)) is not None:
            rows.append(task)
        if (task := peer_check_task(example, f"{prefix}-{index}", rng, wrong=rng.random() < wrong_share)) is not None:
            rows.append(task)
    if not rows:
        raise ValueError(f"{option} {data}: no problem gave a collaboration task (each needs a solution with "
                         "`<<expr=result>>` calculator marks on every step, as GSM8K's)")
    return rows

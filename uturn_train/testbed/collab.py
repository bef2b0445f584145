"""Collaboration tasks from the testbed's world: the held-out problems, posed so that interaction pays.

Two families (`uturn collab`, [`~uturn_train.collab`]):

- **info_gap**: the question lacks one number ("Mia buys some notebooks that cost $4 each. ..."); the model under test
  is the assistant, the partner the user who holds the number. Asking for it, then solving, is how to succeed.
- **peer_check**: another agent has answered, right or (half the time) with one arithmetic slip carried through; the
  model under test is the *user*. A reaction that questions the wrong step (or pushes back) makes the partner redo the
  step and fix the answer; thanks, a new problem or a question that misses the mistake leave it wrong.

Every line the oracle partner may say is written here, from the world's own solution, so the oracle in the core
([`~uturn_train.collab.partners.OraclePartner`]) needs no world: it reveals `reveal`, or replies `fix`, or goes over
the answer again.
The problems are the build's held-out ones, never trained on (their keys are kept out of every training conversation);
the testbed saw incomplete problems in its mixture (`turns.info_gap_conversation`: asking is latent, as follow-ups are)
but never a wrong answer (docs/collab.md: what it must learn).
"""

import json
import random
from pathlib import Path

from ..io import read_jsonl, write_jsonl
from .build import make_heldout
from .turns import ORDINAL, gap_question, reveal_line
from .world import Problem, Step, sample_problem

COLLAB_FILE = "collab.jsonl"
_OPS = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "/": int.__floordiv__}


def heldout_problems(testbed: Path) -> list[Problem]:
    """The build's held-out problems, drawn again from its seed; checked against its `heldout.jsonl`."""
    card = json.loads((testbed / "card.json").read_text())
    problems = [r["problem"] for r in make_heldout(random.Random(card["seed"]), card["config"]["n_heldout"])]
    questions = [r["question"] for r in read_jsonl(testbed / "heldout.jsonl", ("question",))]
    if questions != [p.question for p in problems]:
        raise ValueError(f"{testbed}/heldout.jsonl is not what its card's seed draws (built by another version?): "
                         "rebuild it with `uturn testbed build --force`")
    return problems


def info_gap_task(problem: Problem, index: int, rng: random.Random) -> dict | None:
    gap = gap_question(problem, rng)
    if gap is None:
        return None
    question, knob, _ = gap
    reveal = reveal_line(problem, knob)
    brief = (f"You are a user who needs help with a math problem. The whole problem is: {problem.question} "
             f"You only wrote: {question} If the assistant asks for what is missing, tell it ({reveal}) in one short "
             "sentence. Never solve the problem yourself.")
    return {"id": f"testbed-{index}-info_gap", "family": "info_gap", "gold": str(problem.answer),
            "messages": [{"role": "user", "content": question}], "brief": brief,
            "oracle": {"reveal": reveal, "asks_for": problem.knobs[knob]}}


def _slip(problem: Problem, rng: random.Random) -> tuple[int, list[Step]]:
    """One step computed wrong by a small amount (`j`), the error carried into the later steps."""
    while True:
        j, delta = rng.randrange(len(problem.steps)), rng.choice([-10, -2, -1, 1, 2, 10])
        steps = list(problem.steps)
        for i in range(j, len(steps)):
            s, left, right = steps[i], steps[i].left, steps[i].right
            if i > j:  # the previous step's value is one operand (the left one in every scenario that has both)
                before, now = problem.steps[i - 1].value, steps[i - 1].value
                left, right = (now, right) if left == before else (left, now)
            value = _OPS[s.op](left, right) + (delta if i == j else 0)
            steps[i] = Step(left, s.op, right, value, s.text.replace(f"{s.expr} = {s.value}",
                                                                     f"{left} {s.op} {right} = {value}"),
                            s.what, s.why, s.unit)
            if steps[i].value <= 0:  # the slip made no sense (nothing left, or a negative count): draw again
                break
        else:
            return j, steps


def _solution(steps: list[Step]) -> str:
    return "\n".join(s.text for s in steps) + f"\n#### {steps[-1].value}"


def peer_check_task(problem: Problem, index: int, rng: random.Random, wrong: bool) -> dict:
    j, steps = _slip(problem, rng) if wrong else (None, problem.steps)
    oracle = {"wrong_step": j, "solution": problem.solution}
    if wrong:
        s, right = steps[j], problem.steps[j]
        oracle.update(
            # What a user may name to question the slip: a value it changed, the two numbers of the wrong step, or
            # that step by its ordinal.
            values=[str(x.value) for x in steps[j:]], operands=[str(s.left), str(s.right)], ordinal=ORDINAL[j],
            fix=f"Let me redo the {ORDINAL[j]} step: {s.expr} = {right.value}, not {s.value}. "
                f"I made a mistake there. The correct solution:\n{problem.solution}")
    return {"id": f"testbed-{index}-peer_check", "family": "peer_check", "gold": str(problem.answer),
            "answer_right": not wrong,
            "messages": [{"role": "user", "content": problem.question},
                         {"role": "assistant", "content": _solution(steps)}],
            "oracle": oracle}


def collab_tasks(problems: list[Problem], seed: int = 0, wrong_share: float = 0.5) -> list[dict]:
    """Per problem an info_gap task (when a number can be left out) and a peer_check task, wrong `wrong_share` of
    the time; seeded, so every model meets the same tasks."""
    rng = random.Random(seed)
    rows = []
    for index, problem in enumerate(problems):
        if (task := info_gap_task(problem, index, rng)) is not None:
            rows.append(task)
        rows.append(peer_check_task(problem, index, rng, wrong=rng.random() < wrong_share))
    return rows


def training_collab_tasks(testbed: Path, n: int, seed: int = 0, wrong_share: float = 0.5) -> list[dict]:
    """Collaboration tasks for online RL (`recipes/collab_grpo.py`, `objective: collab`) from `n` problems of the
    world drawn with `seed`, none of the build's held-out ones (their keys), so that what `uturn collab` and the
    callback measure stays unseen; ids `testbed-train-<i>-<family>`."""
    rng = random.Random(seed)
    avoid = {p.key for p in heldout_problems(testbed)}
    problems = []
    while len(problems) < n:
        if (problem := sample_problem(rng)).key not in avoid:
            problems.append(problem)
    rows = collab_tasks(problems, seed, wrong_share)
    for row in rows:
        row["id"] = row["id"].replace("testbed-", "testbed-train-", 1)
    return rows


def ensure_collab_tasks(testbed: Path) -> Path:
    """The testbed's `collab.jsonl`, (re)written (0.07 s) when missing or not what this version draws: a file
    from an older version would otherwise score every model on tasks the docs no longer describe."""
    path = testbed / COLLAB_FILE
    rows = [json.dumps(r, ensure_ascii=False) for r in collab_tasks(heldout_problems(testbed))]
    if not path.exists() or path.read_text(encoding="utf-8").splitlines() != rows:
        write_jsonl(path, map(json.loads, rows))
    return path

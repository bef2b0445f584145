"""User turns and assistant replies of the testbed's world, and the conversations built from them.

After an answer, a user in a real chat log does one of three things: reacts to the answer (asks about a step or a
number, pushes back, tries a variant with changed numbers, asks for a simpler explanation, or answers a question the
assistant asked), says thanks, or moves on to a new problem, usually announced ("Next question: ..."). Each kind has
many phrasings, so that a model trained on them learns a distribution of user turns rather than a few strings. Every
reply is computed from the problem, so the assistant is always right, also when the user pushes back.
"""

import random
import re

from .world import Problem, Step, draw_number, sample_problem

_VERB = {"*": ("multiply", "multiplied", "multiplying", "by"), "+": ("add", "added", "adding", "to"),
         "-": ("subtract", "subtracted", "subtracting", "from"), "/": ("divide", "divided", "dividing", "by")}
ORDINAL = ["first", "second", "third"]


def _operands(step: Step) -> tuple[int, int]:
    # "subtract 15 from 48" names the operands in the other order.
    return (step.right, step.left) if step.op in "-+" else (step.left, step.right)


def _fill(template: str, problem: Problem, step: Step) -> str:
    x, y = _operands(step)
    verb, past, ing, prep = _VERB[step.op]
    return template.format(x=x, y=y, verb=verb, past=past, ing=ing, prep=prep, v=step.value, expr=step.expr,
                           what=step.what, unit=step.unit, ans=problem.answer, units=problem.steps[-1].unit,
                           nth=ORDINAL[problem.steps.index(step)], name=problem.words["name"])


# ---------------------------------------------------------------------------------------------------------------------
# Follow-ups: they react to this answer, and most of them name a number, a step or a thing from it.
ASK_STEP = [
    "Why did you {verb} {x} {prep} {y}?", "why {expr}?", "Where do the {v} {unit} come from?",
    "How did you get {v} {unit}?", "What are the {v} {unit} in your answer?",
    "I don't understand the step {expr} = {v}.",
    "Wait, why {ing} {x} {prep} {y}?", "Can you explain why the {unit} are {expr}?", "what does {v} mean here?",
    "Where did you get {y} from?", "So {v} is {what}?", "Why do you {verb} in the {nth} step?",
    "how is {expr} equal to {v}?", "I don't get the {nth} line. Why {expr}?", "What does the {nth} step do?",
    "Why {v} {unit}?", "Hold on, where did {v} {unit} come from?", "Can you explain the {nth} step?",
    "why did you {verb} the {unit} there?", "Is {v} {what}?", "why do we need {expr} for the {unit}?",
    "How do you know to {verb} {x} {prep} {y}?", "Why are there {v} {unit}?", "what is {what}?",
]
PUSHBACK = [
    "I think that's wrong. Shouldn't it be {wrong} {units}?", "Are you sure? I got {wrong} {units}.",
    "Hmm, is {expr} really {v}?", "That doesn't look right, I got {wrong} {units}.",
    "My teacher says the answer is {wrong} {units}.", "I don't think {ans} {units} is right.",
    "Isn't it {wrong} {units} though?", "the answer should be {wrong} {units}, not {ans}",
    "Can you double check {expr} for the {unit}? I get {wrong}.", "Wrong, it's {wrong} {units}.",
    "Are you sure about the {v} {unit}?",
    "I got {wrong} {units} when I did it. Who is right?", "no, {expr} is not {v}",
    "Hmm, I'm not sure {ans} is correct. Can you check it?",
    "That can't be right. Does {name} really end up with {ans} {units}?",
]
WHAT_IF = [
    "What if {phrase} was {x} instead of {old}?", "And if {phrase} were {x}?", "What happens if {phrase} is {x}?",
    "Now try it with {x} instead of {old}.", "ok, what about {x} instead of {old}?", "what if it was {x}?",
    "Same problem but {phrase} is {x}. What's the answer then?", "Could you redo it with {phrase} at {x}?",
    "How would the answer change if {phrase} was {x}?", "What if {phrase} changed to {x}?",
    "Let's say {phrase} is {x}. How many then?", "and with {x} instead of {old}?",
]
SIMPLER = [
    "Can you explain that more simply?", "I don't get it. Can you explain it in simpler words?",
    "Can you explain it like I'm 10?", "That's confusing, can you break it down for me?",
    "Could you go over it again more slowly?", "I'm lost. What is the idea behind it?",
    "I still don't understand how you got {ans} {units}.", "Why is the answer {ans}? Please explain it simply.",
    "Explain it in words please.", "can you say that in plain words?", "What does all of this mean? I'm confused.",
    "Could you explain the steps again?", "Why do we need two steps for the {units}?",
]
THANKS_AND = ["Thanks! ", "Thank you. ", "Thanks, ", "Great, thanks. ", "ok thanks. "]
# Questions an answer may end with, and how a user answers each.
ASSISTANT_QUESTIONS = {
    "check": ["Do you want me to check it another way?", "Should I double-check the result?"],
    "step": ["Is any step unclear?", "Do you want me to explain one of the steps?"],
    "variant": ["Do you want to see how it changes with different numbers?"],
}
ANSWERS_TO = {
    "check": ["Yes please, check it.", "Yes, please check it.", "yes, check it", "Yes, please do.", "sure, check it"],
    "step": ["Yes, the {nth} one.", "Yes, why {expr}?", "the {nth} step please", "Yes, how did you get {v} {unit}?",
             "Yes. Why did you {verb} {x} {prep} {y}?"],
    "variant": ["Yes, try it with {x} instead of {old}.", "Sure, what if {phrase} was {x}?",
                "yes, use {x} for {phrase}", "Yes please, make {phrase} {x}."],
}
# Acknowledgements only thank or close.
ACKS = [
    "Thanks!", "Thank you!", "thanks", "Thanks, that makes sense.", "Great, thanks a lot.", "Perfect, thank you!",
    "ok got it", "Got it, thanks.", "That helps, thank you.", "Awesome, thanks!", "Makes sense now. Thanks!",
    "Cool, thank you so much.", "I see. Thanks.", "Thank you, that was clear.", "ok thanks",
]
ACK_REPLIES = ["You're welcome!", "Glad it helped!", "Happy to help!", "Any time!", "You're welcome. Good luck!"]
# New problems mostly share one lead-in, as users pasting a worksheet do; the rest vary.
LEAD_INS = ["Next question: "] * 10 + ["Next one: ", "Q2: ", "New problem: ", "Question: ", "", ""]
# A third of new problems are bare calculations, most of them phrased alike: after the lead-in, greedy decoding then
# writes one of those rather than a word problem that might happen to share this conversation's names or scenario.
QUICK_SHARE = 0.35
QUICK = ["What is {x} {op} {y}?"] * 5 + ["How much is {x} {opw} {y}?", "Quick one: {x} {op} {y}?",
                                         "Calculate {x} {op} {y}.", "what's {x} {opw} {y}?"]

_REPLY_STEP = ["Because {why}. So {expr} = {v} is {what}.", "{v} is {what}: {why}, so {expr} = {v}.",
               "In that step we find {what}. {Why}, so we {verb} {x} {prep} {y}: {expr} = {v}."]


def capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


def _explain_step(rng, problem: Problem, step: Step) -> str:
    template = rng.choice(_REPLY_STEP)
    return _fill(template.replace("{why}", step.why).replace("{Why}", capitalize(step.why)), problem, step)


def _recheck(problem: Problem, claim: int | None) -> str:
    lines = ", and ".join(f"{s.expr} = {s.value}" for s in problem.steps)
    tail = f"The answer is still {problem.answer}, not {claim}." if claim else f"So {problem.answer} is correct."
    return f"Let me check it again: {lines}. {tail}"


def _simpler(problem: Problem) -> str:
    parts = [f"First we find {problem.steps[0].what}: {problem.steps[0].why}, so {problem.steps[0].expr} = "
             f"{problem.steps[0].value}."]
    parts += [f"Then we find {s.what}: {s.expr} = {s.value}." for s in problem.steps[1:]]
    return "Sure. " + " ".join(parts) + f" So the answer is {problem.answer}."


def _variant(rng, problem: Problem) -> tuple[str, int, int, Problem]:
    """A knob, its new value and the re-solved problem (same names and wording, one input changed)."""
    while True:
        knob = rng.choice(sorted(problem.knobs))
        new = draw_number(rng, problem.scenario, knob)
        if new != problem.numbers[knob] and (changed := problem.with_number(knob, new)) is not None:
            return knob, problem.numbers[knob], new, changed


def _what_if_reply(problem: Problem, knob: str, new: int, changed: Problem) -> str:
    return f"If {problem.knobs[knob]} is {new}:\n{changed.solution}"


def _wrong(rng, problem: Problem) -> int:
    return max(1, problem.answer + rng.choice([-10, -2, -1, 1, 2, 10]))


def followup(rng: random.Random, problem: Problem, asked: str | None = None) -> tuple[str, str, str, Problem | None]:
    """A grounded follow-up to the answer of `problem` and the assistant's reply: `(kind, user_turn, reply, variant)`.

    `asked` is the kind of question the answer ended with, if any; the user then usually answers it. `variant` is the
    changed problem the reply solves, for a what-if.
    """
    step = rng.choice(problem.steps)
    if asked and rng.random() < 0.7:
        turn = rng.choice(ANSWERS_TO[asked])
        if asked == "check":
            last = problem.steps[-1]
            back = {"+": "-", "-": "+", "*": "/", "/": "*"}[last.op]
            reply = (f"Sure. Working backwards: {last.value} {back} {last.right} = {last.left}, which matches. "
                     f"So {problem.answer} is right.")
            return "answers_question", turn, reply, None
        if asked == "step":
            return "answers_question", _fill(turn, problem, step), _explain_step(rng, problem, step), None
        knob, old, new, changed = _variant(rng, problem)
        turn = turn.format(x=new, old=old, phrase=problem.knobs[knob])
        return "answers_question", turn, _what_if_reply(problem, knob, new, changed), changed

    kind = rng.choices(["ask_step", "pushback", "what_if", "simpler"], weights=[4, 2, 3, 2])[0]
    changed = None
    if kind == "ask_step":
        turn, reply = _fill(rng.choice(ASK_STEP), problem, step), _explain_step(rng, problem, step)
    elif kind == "pushback":
        wrong = _wrong(rng, problem)
        turn = _fill(rng.choice(PUSHBACK).replace("{wrong}", str(wrong)), problem, step)
        reply = _recheck(problem, wrong if str(wrong) in turn else None)
    elif kind == "what_if":
        knob, old, new, changed = _variant(rng, problem)
        turn = rng.choice(WHAT_IF).format(x=new, old=old, phrase=problem.knobs[knob])
        reply = _what_if_reply(problem, knob, new, changed)
    else:
        turn, reply = _fill(rng.choice(SIMPLER), problem, step), _simpler(problem)
    if kind != "pushback" and rng.random() < 0.15:  # thanks, and asks for more: still a follow-up
        turn = rng.choice(THANKS_AND) + (turn if turn[:2] == "I " else turn[:1].lower() + turn[1:])
    return kind, turn, reply, changed


def acknowledgement(rng: random.Random) -> tuple[str, str]:
    return rng.choice(ACKS), rng.choice(ACK_REPLIES)


def quick_problem(rng: random.Random) -> Problem:
    """A bare sum or difference ("What is 48 + 7?"), as users also ask between word problems."""
    op, x, y = rng.choice("+-"), rng.randint(10, 99), rng.randint(2, 9)
    value = x + y if op == "+" else x - y
    question = rng.choice(QUICK).format(x=x, y=y, op=op, opw={"+": "plus", "-": "minus"}[op])
    step = Step(x, op, y, value, f"{x} {op} {y} = {value}.", "the result", f"we need {x} {op} {y}", "")
    return Problem("quick", {}, {"x": x, "y": y, "op": op}, question, [step])


def new_problem(rng: random.Random) -> tuple[str, Problem]:
    """An unrelated problem: a bare calculation, or a word problem drawn independently of the one before.

    Not made to avoid the previous problem's scenario or names: a tiny model then learns that words seen in the
    context are *not* written next, and stops copying names and numbers from the question into its answer.
    """
    problem = quick_problem(rng) if rng.random() < QUICK_SHARE else sample_problem(rng)
    return rng.choice(LEAD_INS) + problem.question, problem


def answer(rng: random.Random, problem: Problem, ask_rate: float) -> tuple[str, str | None]:
    """The assistant's answer: the worked solution, sometimes ending with a question to the user."""
    if rng.random() >= ask_rate:
        return problem.solution, None
    asked = rng.choice(sorted(ASSISTANT_QUESTIONS))
    return f"{problem.solution}\n\n{rng.choice(ASSISTANT_QUESTIONS[asked])}", asked


# ---------------------------------------------------------------------------------------------------------------------
# Information gaps: a problem posed without one of its numbers, the assistant asking for it, the user's number, the
# solution. At a small share of the mixture, so that asking is there to sample (T=1.0) but not what greedy decoding
# does after an incomplete question, as with follow-ups; `uturn collab`'s info_gap family measures it and the
# collaboration objective trains it. (Answers that assume a value instead were tried: they put numbers the question
# never says into the answer, and the build's accuracy fell from 0.37 to 0.06, the model no longer copying its
# question's numbers; measured 2026-12-06, AVX512.) The assistant restates the sentence with the gap before it asks, so
# that the cue is in the words it has just copied (docs/collab.md has the designs and shares measured).
# A number can be left out where "some" reads as English: before a noun, not after `$` ("$some each") or "another".
_NOT_BEFORE = {"times", "years"}
# After the restated sentence and ", but how many?". Asked at once ("What is the miles per day?"), the ask stayed out of
# reach of a 4-layer model even at T=1.0: it must notice "some" before its first word.
RESTATED_ASK = ["I need {phrase} to solve it.", "What is {phrase}?", "Could you tell me {phrase}?",
                "The problem does not say {phrase}."]
GIVE_GAP = ["{reveal}"] * 4 + ["It's {v}.", "{v}", "Oh sorry, {phrase} is {v}.", "{phrase} is {v}"]


def reveal_line(problem: Problem, knob: str) -> str:
    """How the user states the missing number (the collaboration oracle says exactly this)."""
    return f"{capitalize(problem.knobs[knob])} is {problem.numbers[knob]}."


def gap_sentence(question: str, start: int) -> str:
    """The sentence of `question` that holds the gap at `start`, without its final punctuation."""
    begin = max(question.rfind(". ", 0, start), question.rfind("? ", 0, start))
    begin = 0 if begin < 0 else begin + 2
    ends = [i for i in (question.find(". ", start), question.find("?", start)) if i >= 0]
    end = min(ends) if ends else len(question.rstrip(". "))
    return capitalize(question[begin:end].strip())


def gap_question(problem: Problem, rng: random.Random) -> tuple[str, str, int] | None:
    """The question with one number left out, the knob left out and where "some" stands in for it; None if no number
    can go."""
    options = []
    for knob, value in problem.numbers.items():
        # Every spot of the number, "$3" too: a number that stands twice (3 candles at $3) is two knobs' value, and
        # leaving one out would name the wrong one in the reveal.
        spots = [m for m in re.finditer(rf"(?<!\d){value}(?!\d)", problem.question)]
        if len(spots) != 1 or list(problem.numbers.values()).count(value) != 1:
            continue
        start, end = spots[0].span()
        after = problem.question[end:].split(maxsplit=1)
        if problem.question[end:end + 1] == " " and after and after[0].isalpha() and after[0] not in _NOT_BEFORE \
                and not problem.question[:start].endswith(("another ", "$")):
            options.append((knob, problem.question[:start] + "some" + problem.question[end:], start))
    if not options:
        return None
    knob, question, start = rng.choice(options)
    return question, knob, start


def info_gap_conversation(rng: random.Random, problem: Problem) -> tuple[list[dict], str, list] | None:
    """The problem posed without one number, the assistant asking for it, the user giving it, the solution; None if
    no number can be left out."""
    if (gap := gap_question(problem, rng)) is None:
        return None
    question, knob, start = gap
    phrase, value = problem.knobs[knob], problem.numbers[knob]
    give = rng.choice(GIVE_GAP).format(reveal=reveal_line(problem, knob), v=value, phrase=phrase)
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": f"{gap_sentence(question, start)}, but how many? "
                                             f"{rng.choice(RESTATED_ASK).format(phrase=phrase)}"},
            {"role": "user", "content": capitalize(give)},
            {"role": "assistant", "content": problem.solution}], "info_gap", [problem]


def conversation(rng: random.Random, second_turn: dict[str, float], ask_rate: float) -> tuple[list[dict], str, list]:
    """A conversation, the kind of its second user turn (`single` when it has none) and the problems it solves.

    Args:
        second_turn (`dict[str, float]`): weights of `single`, `new_problem`, `followup`, `acknowledgement` and
            `info_gap` (the first question lacks a number: `info_gap_conversation`).
        ask_rate (`float`): share of answers that end with a question to the user.
    """
    problem = sample_problem(rng)
    kind = rng.choices(list(second_turn), weights=list(second_turn.values()))[0]
    while kind == "info_gap":
        if (gap := info_gap_conversation(rng, problem)) is not None:
            return gap
        problem = sample_problem(rng)  # no number of this one can be left out
    text, asked = answer(rng, problem, ask_rate)
    messages = [{"role": "user", "content": problem.question}, {"role": "assistant", "content": text}]
    problems = [problem]
    if kind == "new_problem":
        turn, other = new_problem(rng)
        reply = answer(rng, other, ask_rate)[0]
        problems.append(other)
    elif kind == "followup":
        kind, turn, reply, variant = followup(rng, problem, asked)
        problems += [variant] if variant else []
    elif kind == "acknowledgement":
        turn, reply = acknowledgement(rng)
    if kind != "single":
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": reply}]
    return messages, kind, problems

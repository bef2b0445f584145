"""Grounded follow-ups: a reaction to *this* conversation, not a question that would fit any answer.

A follow-up rate counts every follow-up-shaped turn, and a model can max it out with one memorised question ("Why do
you multiply in the first step?"). The grounded follow-up rate counts only the turns that react to their own
conversation. The definition, in code in `is_grounded` and nowhere else:

> A user turn is a **grounded follow-up** when (1) `classify_turn` labels it `followup` after its own query and
> answer, (2) it does not ask where a number came from that its own conversation never mentions, (3) after a word
> problem (the query states numbers and asks for a quantity), it takes something specific from its answer that the
> query does not say (the control that keeps the query and drops the answer lacks it), or asks the assistant about a
> step it took with its answer's numbers ("Why did you divide 48 by 2?"), and (4) it would not be a
> fitting follow-up of an unrelated conversation: classified after a *mismatched context* (another prompt's query and
> answer from the same task, paired by a seeded derangement), it is not a follow-up there, or it shares something
> specific with its own context that the mismatched one lacks.

*Something specific* is a number other than the small ones that recur by chance (below 13, without decimals), a name,
or content words of the query or the answer: one of the query or of the answer's opening, which say what the
conversation is about, or two from further in the answer. Function words, words too generic to point anywhere
("explain", "example", "step", "answer"; `cues.GENERIC`) and words that name a method rather than a subject
("multiply", "calculate", "formula") never count.

"How did you get 24?" is a follow-up after any worked answer ("how did you" points back), but 24 is in its own answer
only: grounded. "What if it was 8 apples instead of 5?" is a follow-up too, but it would follow any answer to its
query, so it does not react to this one (3); nor does "Why did he go to the market?". Condition (3) is tested after
word problems only: after an open-ended answer, words cannot tell a turn that reacts to it from one that does not
(see `_reacts_to_answer`). "How did you get 63 years?" after an answer that never says 63 reacts to nothing in it
(2): a policy trained with GRPO on this decision learned that template and filled in numbers of its own. "Can you tell
me more about that?", "Is that right?" or, on arithmetic, "Why do you multiply in the first step?" fit any answer and
share nothing specific with theirs: not grounded.

```python
>>> query, answer = "Tom has 5 apples and buys 19 more. How many now?", "5 + 19 = 24. Tom has 24 apples."
>>> other = ("A train travels 60 km in 2 hours. What is its speed?", "60 / 2 = 30, so 30 km per hour.")
>>> is_grounded(query, answer, "How did you get 24?", *other).grounded
True
>>> is_grounded(query, answer, "Could you explain the steps again?", *other).grounded
False
```
"""

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import cues
from .classify import Verdict, classify_turn
from .text import content, context, padded, stem, words

# Words that name how an answer was worked out, not what it is about: they fit every problem of a task.
METHOD = frozenset(
    map(
        stem,
        ["multiply", "multiplied", "multiplication", "divide", "divided", "division", "add", "added", "addition",
         "subtract", "subtracted", "subtraction", "sum", "product", "difference", "quotient", "remainder", "calculate",
         "calculated", "calculation", "compute", "computed", "computation", "equation", "formula", "plus", "minus",
         "times", "result", "solve", "solved", "solving", "solution", "method", "reason", "reasoning", "logic",
         "operation", "adding", "dividing"],
    )
)
_PUNCTUATION = re.compile(r"[\W_]+")


@dataclass(frozen=True)
class Grounding:
    """Whether a user turn is a grounded follow-up (see the module docstring).

    Args:
        grounded (`bool`):
            A follow-up in its own conversation that would not fit the mismatched one and, after a word problem,
            takes something specific from its answer.
        mismatch_label (`str`):
            The turn's label after the mismatched context (one of `LABELS`).
        reason (`str`):
            A short human-readable why, e.g. `"shares '24' with its own conversation, not with the other"`.
    """

    grounded: bool
    mismatch_label: str
    reason: str


def derangement(n: int, seed: int) -> list[int]:
    """A seeded permutation of `range(n)` with no fixed point: item `i` is paired with item `result[i] != i`.

    Sattolo's shuffle, which draws a single cycle: every item is someone's mismatched context exactly once.

    Raises:
        ValueError: when `n < 2`, where no item has another to be paired with (the grounded rate is undefined).
    """
    if n < 2:
        raise ValueError(f"a mismatched context needs at least 2 distinct contexts, got {n}")
    order = list(range(n))
    rng = random.Random(seed)
    for i in range(n - 1, 0, -1):
        j = rng.randrange(i)  # j < i (not <= i): no item stays in place
        order[i], order[j] = order[j], order[i]
    return order


def normalize_turn(text: str) -> str:
    """The text of a turn for counting distinct follow-ups: markup dropped, casefolded, punctuation and whitespace
    collapsed ("Why 24?<|im_end|>" and "why  24" are one text)."""
    return _PUNCTUATION.sub(" ", cues.MARKUP.sub(" ", text).casefold()).strip()


def _small(number: str) -> bool:
    return number.isdigit() and int(number) < 13


# A question that presupposes the answer said a number: "How did you get 24?", "Where does the 8 come from?", "Why 63?".
_NUMBER = r"\$?(\d[\d,]*(?:\.\d+)?)"
_ASKS_ABOUT_NUMBER = re.compile(
    rf"\b(?:how|where)\s+(?:did|do|does|can|could)\s+(?:you|we|they|it|i)\s+(?:get|got|find|come up with|arrive at|"
    rf"calculate|compute)\b[^.?!\n]{{0,20}}?{_NUMBER}"
    rf"|\bwhere\s+(?:does|do|did)\s+(?:the\s+|that\s+|this\s+)?{_NUMBER}[^.?!\n]{{0,30}}?\bcome\s+from"
    rf"|\bwhy\s+(?:is\s+it\s+|are\s+there\s+)?{_NUMBER}(?![\d.,]*\s*[-+*/x×])"
)


def _missing_number(user_turn: str, query: str, answer: str) -> str | None:
    """The number a turn asks about as if the conversation had said it, when it did not."""
    own = context(query, answer).content
    for match in _ASKS_ABOUT_NUMBER.finditer(user_turn.lower()):
        number = next(g for g in match.groups() if g).rstrip(".,").replace(",", "")
        if number not in own:
            return number
    return None


def _specific(query: str, answer: str, user_turn: str, other_query: str, other_answer: str) -> list[str]:
    """What the turn shares with its own context and not with the other, if it is enough to be specific (else [])."""
    own, other = context(query, answer), context(other_query, other_answer)
    shared = (content(set(words(user_turn))) & own.content) - other.content - METHOD
    if not shared:
        return []
    names = {stem(name.lower()) for name in cues.NAME.findall(user_turn)}
    weight = 0
    for item in shared:
        if item[0].isdigit():
            weight += 0 if _small(item) else 2
        else:
            weight += 2 if item in own.topic or item in names else 1
    return sorted(shared) if weight >= 2 else []


def _reacts_to_answer(query: str, answer: str, user_turn: str) -> str | None:
    """After a word problem: what the turn takes from its answer, judged against the control that keeps the query and
    drops the answer (something specific of the answer that the query does not say: "24" in "How did you get 24?"),
    or a number of the answer asked about as the assistant's own step ("Why did you divide 48 by 2?"), or None. A
    question about the problem's own quantities ("What if it was 8 apples instead of 5?") would follow any answer to
    its query: it does not react to this one.

    After an open-ended answer the control is not applied (the turn passes): measured on real OASST follow-ups, only
    0.44 to 0.60 of them take a specific word from their answer or point at it in words (`cues.REFERENCE_WITHIN`),
    though nearly all react to it; telling those apart needs more than words (issue 17)."""
    if not answer.strip():
        return None  # no answer, nothing to react to
    if not context(query, answer).arithmetic:
        return "an open-ended answer (no answer control)"
    shared = _specific(query, answer, user_turn, query, "")
    if shared:
        return f"takes {', '.join(map(repr, shared[:3]))} from its answer"
    # "Why did you divide 48 by 2?": the query's numbers, but as a step the assistant took, asked of the assistant.
    turn_words = words(cues.MARKUP.sub(" ", user_turn))
    sure = cues.POINTS_BACK.search(padded(turn_words))
    used = {w for w in turn_words if w[0].isdigit()} & context("", answer).content
    return f"asks {sure.group(0).strip()!r} about {', '.join(sorted(used))} of its answer" if sure and used else None


def is_grounded(
    query: str,
    answer: str,
    user_turn: str,
    other_query: str,
    other_answer: str,
    *,
    verdict: Verdict | None = None,
    finish_reason: str | None = None,
    reacts: bool = True,
) -> Grounding:
    """Decide whether `user_turn` is a grounded follow-up of `(query, answer)`, with `(other_query, other_answer)` as
    the mismatched context (see the module docstring for the definition).

    Args:
        query (`str`), answer (`str`), user_turn (`str`):
            The turn and its own conversation, as for `classify_turn`.
        other_query (`str`), other_answer (`str`):
            Another prompt's query and answer from the same task (e.g. paired by `derangement`).
        verdict (`Verdict`, *optional*):
            The turn's verdict in its own conversation, when already computed.
        finish_reason (`str`, *optional*):
            Passed on to `classify_turn`.
        reacts (`bool`, *optional*, defaults to `True`):
            Whether the turn must react to its answer (condition 3). False gives the weaker decision of before issue
            17, a follow-up specific to its conversation (the query's story included), which GRPO's reward pays in
            part as a step towards the full one (`rewards.LABEL_REWARD`); the probe never uses it.

    Returns:
        [`Grounding`]

    Raises:
        ValueError: when the mismatched context is the turn's own, which controls for nothing.
    """
    if (other_query, other_answer) == (query, answer):
        raise ValueError("the mismatched context is the turn's own conversation; pair it with another one")
    if verdict is None:
        verdict = classify_turn(query, answer, user_turn, finish_reason=finish_reason)
    mismatch = classify_turn(other_query, other_answer, user_turn, finish_reason=finish_reason).label
    if not verdict.is_followup:
        return Grounding(False, mismatch, f"not a follow-up in its own conversation ({verdict.label})")
    missing = _missing_number(user_turn, query, answer)
    if missing:
        return Grounding(False, mismatch, f"asks about {missing}, which its conversation never says")
    reacts = _reacts_to_answer(query, answer, user_turn) if reacts else "specific to its conversation"
    if not reacts:
        return Grounding(False, mismatch, "would follow any answer to its query: takes nothing from its own answer")
    if mismatch != "followup":
        return Grounding(True, mismatch, f"a follow-up here, not after another conversation ({mismatch}); {reacts}")
    shared = _specific(query, answer, user_turn, other_query, other_answer)
    if shared:
        items = ", ".join(map(repr, shared[:3]))
        return Grounding(True, mismatch, f"fits another conversation too, but shares {items} with its own only")
    return Grounding(False, mismatch, "fits another conversation as well and shares nothing specific with its own")


# Mismatched contexts that training (DPO's chosen turns, GRPO's reward) asks a turn to be grounded against. The probe
# measures with one; but a turn specific to a kind of problem and not to this one ("Why do we need two steps for the
# years?" after an age problem) passes one control in three of the testbed's four scenarios, and both DPO and GRPO
# settled on one such question per kind. Three controls leave the turns about a problem's own numbers and things.
# They come from three seeded derangements, which may give a prompt the same context twice (then it has fewer).
CONTROLS = 3


def mismatched_contexts(contexts: Sequence, seed: int) -> list[list]:
    """Per item of `contexts`, the mismatched contexts training grounds it against: its partners in `CONTROLS` seeded
    derangements, less any equal to its own; none for anyone when there are fewer than 2 items."""
    if len(contexts) < 2:
        return [[] for _ in contexts]
    cycles = [derangement(len(contexts), seed + c) for c in range(CONTROLS)]
    return [[contexts[cycle[i]] for cycle in cycles if contexts[cycle[i]] != contexts[i]] for i in range(len(contexts))]


def grounded_in(query: str, answer: str, turn: str, controls: list[tuple[str, str]],
                verdict: Verdict | None = None, reacts: bool = True) -> bool:
    """Whether `turn` is a grounded follow-up of (query, answer) against every mismatched context of `controls`;
    `verdict`, the turn's verdict in its own conversation when already computed, saves classifying it per control;
    `reacts` as for `is_grounded`."""
    if verdict is None:
        verdict = classify_turn(query, answer, turn)
    return bool(controls) and all(is_grounded(query, answer, turn, *c, verdict=verdict, reacts=reacts).grounded
                                  for c in controls)


def ground_rows(rows: Sequence[Mapping], seed: int = 0, verdicts: Sequence[Verdict] | None = None,
                scorer=None) -> list[Grounding]:
    """`is_grounded` for every row (`query`, `answer`, `user_turn`, optional `finish_reason`) of a file or a probe.

    The rows' distinct `(query, answer)` contexts are paired by `derangement(n, seed)`: every turn of one context is
    controlled with the same other context from the rows.

    Args:
        rows (`Sequence[Mapping]`):
            The labelled turns.
        seed (`int`, *optional*, defaults to 0):
            Seed of the pairing.
        verdicts (`Sequence[Verdict]`, *optional*):
            The rows' verdicts in their own conversations, when already computed.
        scorer ([`~uturn_train.probe.labelers.scorer.AnswerScorer`], *optional*):
            Must confirm each grounded turn against the same query with its mismatched context's answer.

    Raises:
        ValueError: when the rows hold fewer than 2 distinct contexts (the grounded decision is undefined).
    """
    contexts = list(dict.fromkeys((row["query"], row["answer"]) for row in rows))
    if len(contexts) < 2:
        raise ValueError(
            f"grounded needs turns from at least 2 distinct (query, answer) contexts to pair them; got {len(contexts)}"
        )
    index = {context: i for i, context in enumerate(contexts)}
    other = derangement(len(contexts), seed)
    groundings = []
    for i, row in enumerate(rows):
        query, answer, turn = row["query"], row["answer"], row["user_turn"]
        other_query, other_answer = contexts[other[index[query, answer]]]
        g = is_grounded(query, answer, turn, other_query, other_answer,
                        verdict=verdicts[i] if verdicts is not None else None, finish_reason=row.get("finish_reason"))
        if g.grounded and scorer is not None:
            _, rejected = scorer.check(query, answer, turn, other_answer)
            g = Grounding(False, g.mismatch_label, rejected) if rejected else g
        groundings.append(g)
    return groundings

"""After an arithmetic word problem: what a user turn must do to react to the answer rather than to the problem.

A real chat model under the user role, shown a word problem and its worked answer, mostly writes the problem again
("How much does Kylar need to pay for 16 glasses?"), another problem of the same story ("How many miles does John
drive in 120 minutes?") or a new task behind a prefix ("What is the answer to this riddle: ..."). Each shares names
and numbers with the conversation, so shared words alone called them follow-ups; none reacts to the answer. These
cues let `classify_turn` tell them apart (issue 17, measured on SmolLM2-135M-Instruct's turns,
`tests/data/smollm2_turns.jsonl`).
"""

import re

from .cues import phrases

_QUANTITY = r"(?:total|sum|number|amount|cost|price|average|difference|percentage|age|distance|speed|value|profit)"
# The question of an arithmetic word problem: it asks for a quantity ("What is the total ...?", and with the verb
# last, "What will Tara's age be 7 years from now?": the testbed's age problems, which were taken for open-ended
# answers, so any follow-up naming the story passed as grounded). 68 of GSM8K's 1,319 test questions still are
# ("what's her annual salary?": a quantity this list does not name).
QUANTITY_QUESTION = phrases(
    rf"how (?:many|much|far|long|old|fast)|what(?:'s| is| was| are| were| will be) (?:the |their |his |her |its )?"
    rf"(?:[a-z]+ )?{_QUANTITY}|what (?:will|would|is|was) (?:the )?[a-z']+ (?:[a-z]+ )?{_QUANTITY} be\b|"
    rf"what percent(?:age)?|calculate|find the (?:total|number|amount|value|cost|price|sum|difference|average|"
    rf"area|perimeter)"
)

# A new task behind a prefix ("What is the answer to this riddle: ...", "Solve this problem: "): real models put the
# next problem of a worksheet behind it, and no user asks that of an answer already given.
PRESENTS_TASK = re.compile(
    r"\W*(?:what(?:'s| is) the (?:answer|solution) to (?=why|how|what|who|when|where|which)|"
    r"(?:what(?:'s| is) the (?:answer|solution) (?:to|of)|(?:can you |please )?(?:solve|answer))\s+"
    r"(?:this|the|that|the following|a|another)\s+(?:[a-z]+\s+){0,3}?(?:question|riddle|problem|puzzle|equation|"
    r"exercise)\b\s*(?:[:\"'“‘-]|\n)|(?:what(?:'s| is) the answer to|solve)\s*:)"
)

# What a question must have to be about the answer rather than about the problem's story: the assistant addressed
# ("how did you", "your answer"), the answer or a step named, a challenge ("really", "wrong", "Shouldn't it be"), a
# variant of the solved problem ("what if", "instead", "redo"), or a plea to explain. "How many miles does John drive
# in 120 minutes?" has none.
BACK_AT_ANSWER = phrases(
    r"you|your|yours|you're|what if|what about|how about|instead|else|otherwise|answers?|solutions?|"
    r"(?:the|this|that|first|second|third|fourth|last|next|\d+(?:st|nd|rd|th)?) (?:step|line)|(?:step|line) \d+|"
    r"calculations?|results?|explain|explanation|understand|confus(?:ed|ing)|lost|why|how come|really|sure|right|"
    r"correct|wrong|mistake|error|check|double|mean|means|meant|again|same|redo|rework|rewrite|simpler|simply|"
    r"come from|came from|shouldn't|isn't|wasn't|aren't|doesn't|don't|didn't|can't|here|then|let's say|suppose|"
    r"changed?|swap|thanks|thank",
    r"(?<=^ )(?:so|and|but|or|ok|okay|hmm|wait|hold on)",
)

_SENTENCE_END = re.compile(r"[.!?\n](?!\d)")  # not the point of "3.5"


def last_question(text: str) -> str:
    """The query's last question, without its question mark ("" when it asks none)."""
    end = text.rfind("?")
    if end < 0:
        return ""
    return text[max((m.end() for m in _SENTENCE_END.finditer(text, 0, end)), default=0) : end]


def restates(new: set, question: frozenset, shared: set) -> bool:
    """A turn that asks what the query asked: it shares most (60%) of the query question's content words and brings
    nothing `new` but small numbers ("How much does Kylar need to pay for 16 glasses?" after the Kylar problem)."""
    new = {w for w in new if not (w[0].isdigit() and len(w) <= 2)}
    return len(question) >= 2 and not new and len(question & shared) >= 0.6 * len(question)

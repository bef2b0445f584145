"""Classify a generated user turn: is it a follow-up to the answer, or something else?

The probe shows a chat model `[query; answer]` and lets it write the next *user* turn. This module labels that turn
with fast, deterministic rules (stdlib only, tens of thousands of turns per second on one core); the English cues it
reads are in `cues.py`.

```python
>>> classify_turn("What is 3 + 4?", "3 + 4 = 7.", "Thanks! Can you also show it for 5 + 9?").label
'followup'
>>> classify_turn("What is 3 + 4?", "3 + 4 = 7.", "Sure! Here's how to add 3 and 4: start at 3, count on 4.").label
'identity_drift'
```

Checks run from the most to the least certain: empty, degenerate (loops, gibberish), an assistant role header,
repetition of an earlier turn, the assistant's phrases and voice, a turn that announces the next question ("Next
question: ...", "Q2:") or poses a problem of its own (two sentences that state numbers, then a question; or a word
problem about someone new with three quantities) without pointing back, thanks only, and last a user-style turn,
which is a follow-up when it is grounded in the conversation and a new topic when it brings a subject of its own.
What a turn brings is its *load*: its content words the conversation does not have, plus one for each new name
("Japan").

- *Shared words* ground it: one topic word (in the query, or in the answer's opening words), or two words the answer
  says further on; a long turn must share about one content word in eight.
- *References back* ground it without a shared word, as far as its load allows. Always: "you said", "rewrite your
  explanation", "do the same for", "Are you sure?". With a load of at most 5: "this algorithm", "these suggestions",
  "the above code", "Are they free?", "caused by this?", "Do I have to?", "which is best?", "make it shorter",
  "translate it", "explain more simply", "in more detail", "what about ...", a turn that opens with "But" or "And",
  a rework under a new constraint ("Now write it as a limerick", "Make one about spring", "Try again but this
  time ...", "How would your assessment change ...").
  At most 3: "the first one", "step 2", "the code", "again", "instead", "... there?". At most 2: "it", "they",
  "also", "another", "a faster way". At most 1: an edit verb ("Can you add comments?"), "should I", "I don't
  understand", or one word from further in the answer. A pronoun after an opening sentence of the user's own ("I
  want to make games. Which tools are there for that?") stands for that sentence, not for the answer.
- *Generic requests* bring nothing ("Can you explain that more simply?", "Why?", "Thanks, can you give an example?"):
  they fit any answer and are follow-ups whatever the conversation. The rule for a short request after an unrelated
  conversation follows: only its generic form is a follow-up; with a subject of its own ("Can you explain quantum
  entanglement more simply?", "Translate 'good morning' into French") it is a new topic. Questions about the
  assistant itself ("What is your name?", "What can you do?") are a new topic unless the query was about it too.
- A statement is the user's reply when the assistant asked something ("Which language?" -> "Python, please.";
  "Please provide the text" -> "Yes, here's the abstract: ..."), or when the answer did not know or needed more ("I
  am unaware of ..." -> the user tells it). After an answer that declines, a request that presses it ("Just pretend
  you are a critic.", "It's for a school project.") is a follow-up.
- The voice of a request that pastes material after a colon ("Please format this text: ...") is the request's.

Whether a follow-up is *grounded* in this conversation rather than fitting any is decided in `grounding.py`.
"""

import functools
import itertools
import re
from dataclasses import dataclass

from . import cues, word_problem
from .degenerate import compression, degenerate

LABELS = ("followup", "acknowledgement", "identity_drift", "repetition", "new_topic", "empty", "degenerate")


@dataclass(frozen=True)
class Verdict:
    """The label of one generated user turn.

    Args:
        label (`str`):
            One of `LABELS`.
        reason (`str`):
            A short human-readable why, e.g. `"asks about it; refers to '4' from the conversation"`.
    """

    label: str
    reason: str

    @property
    def is_followup(self) -> bool:
        return self.label == "followup"


def _stem(word: str) -> str:
    # Crude but fast: "extensions" ~ "extension", "gravitational" ~ "gravitation", "developing" ~ "development",
    # "entities" ~ "entity".
    if word.endswith("'s"):
        word = word[:-2]
    elif len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return word[:6]


_GENERIC_STEMS = frozenset(map(_stem, cues.GENERIC))
_SMALL = frozenset(map(str, range(13)))  # numbers that recur by chance
_STEMS: dict[str, str | None] = {}  # word -> stem of a content word, a number as written, or None


def _content(distinct: set[str]) -> set[str]:
    """Stems of the content words among `distinct` words, and its numbers (without thousands separators)."""
    if len(_STEMS) > 1 << 18:
        _STEMS.clear()
    for word in distinct.difference(_STEMS):  # a plain dict, so that `map` below looks words up in C
        stem = _stem(word) if len(word) > 2 and word not in cues.STOPWORDS else None
        _STEMS[word] = word.replace(",", "") if word[0].isdigit() else None if stem in _GENERIC_STEMS else stem
    stems = set(map(_STEMS.__getitem__, distinct))
    stems.discard(None)
    return stems


@dataclass(frozen=True)
class _Context:
    query_words: tuple
    answer_words: tuple
    query_pairs: frozenset
    answer_pairs: frozenset
    vocabulary: frozenset
    content: frozenset
    topic: frozenset  # content of the query and the answer's opening words: what the conversation is about
    asks_user: bool  # the answer ends by asking the user something
    lacks: bool  # ... or it does not know or follow, or needs more from the user
    declines: bool  # ... or it declines the request
    wants_material: bool  # ... for a text, code or data to work on
    about_assistant: bool  # the query asks about the assistant itself
    arithmetic: bool  # the query states numbers and asks for a quantity (a word problem), and was answered
    question: frozenset  # content of the query's last question: what it asks
    query_content: frozenset


@functools.lru_cache(maxsize=4096)
def _context(query: str, answer: str) -> _Context:
    # A probe classifies many turns against one context: compute its features once.
    query_words = cues.WORD.findall(query.lower().replace("’", "'"))
    answer_words = cues.WORD.findall(answer.lower().replace("’", "'"))
    query_content = _content(set(query_words))
    answer_content = _content(set(answer_words))
    opening = _content(set(answer_words[:20]))
    tail = f" {' '.join(answer_words[-50:])} "
    ends = f" {' '.join(answer_words[:40])} {tail}" if len(answer_words) > 90 else f" {' '.join(answer_words)} "
    return _Context(
        query_words=tuple(query_words),
        answer_words=tuple(answer_words),
        query_pairs=frozenset(itertools.pairwise(query_words)),
        answer_pairs=frozenset(itertools.pairwise(answer_words)),
        vocabulary=frozenset(query_words) | frozenset(answer_words),
        content=frozenset(query_content | answer_content),
        topic=frozenset(query_content | opening),
        asks_user="?" in answer[-300:] or bool(cues.ASKS_USER.search(tail)),
        lacks=bool(cues.LACKS.search(ends)),
        declines=bool(cues.DECLINES.search(ends)),
        wants_material=bool(cues.WANTS_MATERIAL.search(tail)),
        about_assistant=bool(cues.ABOUT_ASSISTANT.search(f" {' '.join(query_words)} ")),
        arithmetic=bool(answer_words) and sum(w[0].isdigit() or w in cues.NUMBER_WORDS for w in set(query_words)) >= 2
        and bool(word_problem.QUANTITY_QUESTION.search(f" {' '.join(query_words[-40:])} ")),
        question=frozenset(_content(set(cues.WORD.findall(word_problem.last_question(query).lower())))),
        query_content=frozenset(query_content),
    )


def _repetition(words: list[str], distinct: set, ctx: _Context) -> str | None:
    for name, source in (("the query", ctx.query_words), ("the answer", ctx.answer_words)):
        if len(words) == len(source) and tuple(words) == source:
            return f"repeats {name} word for word"
    # Each word new to the conversation breaks a word pair: with 30% of the words new, 70% of the pairs cannot be
    # copies (and the pairs need not be built).
    if len(words) < 4 or len(distinct - ctx.vocabulary) > 0.3 * len(words):
        return None
    pairs = set(itertools.pairwise(words))
    if (words[0], words[1]) not in ctx.query_pairs | ctx.answer_pairs and cues.RESTATES.match(" ".join(words[:5])):
        return None  # "I actually wanted you to ..." says it restates
    # A short question may borrow a phrase of a long answer ("Why does it determine the energy levels?"): a turn of
    # fewer than 12 words copies a long answer only when it opens with the answer's words too.
    for name, source in (("the query", ctx.query_pairs), ("the answer", ctx.answer_pairs)):
        if name == "the answer" and len(words) < 12 and len(source) >= 8 and (words[0], words[1]) not in source:
            continue
        shared = len(pairs & source) / len(pairs)
        if shared >= 0.7:
            return f"repeats {name} ({shared:.0%} of its word pairs)"
    return None


def _names(text: str, n_words: int, vocabulary: frozenset) -> tuple[int, int]:
    """How many names the turn repeats from the conversation, and how many it brings: a name is a subject ("... in
    Japan?"), so it grounds like a topic word or weighs like a new word more. Not when Every Word Is Capitalised."""
    names = cues.NAME.findall(text)
    if not names or 3 * len(names) >= n_words:
        return 0, 0
    names = [name for name in map(str.lower, names) if name not in cues.STOPWORDS]
    new = sum(1 for name in names if name not in vocabulary)
    return len(names) - new, new


def _refers(shared: list[str]) -> str:
    return f"refers to {', '.join(map(repr, sorted(shared)[:3]))} from the conversation"


def _anaphor(rest: str) -> re.Match | None:
    """A pronoun that stands for something said before: "caused by this?", "Is that still a thing?", "They are too
    long." Not after an opening sentence of the user's own, where it stands for that ("I want to make games. What
    tools are there for that?")."""
    for pronoun in cues.PRONOUN.finditer(rest):
        start = pronoun.start()
        if start and rest[start - 1].isalpha():
            continue
        head = rest[:start].rstrip()
        if (
            (pronoun.group() != "they" and cues.CLAUSE_END.match(rest, pronoun.end()))
            or cues.ASKED_ABOUT.search(rest, max(0, start - 24), start)
            or ((not head or head[-1] in ".?!;") and cues.SUBJECT_OF.match(rest, pronoun.end()))
        ):
            setup = cues.OWN_SETUP.match(rest)
            return None if setup and setup.end() <= start else pronoun
    return None


def _reference(joined: str, rest: str, load: int, grounding: int) -> str | None:
    """The words by which a request that shares no topic word refers back, if they carry its `load` of new words."""
    load -= grounding  # a word from further in the answer is half a match: it carries one new word
    limit = 2 if load <= 2 else 3 if load <= 3 else 5 if load <= 5 else None
    cue = (cues.REFERENCE_WITHIN[limit] if limit else cues.POINTS_BACK).search(joined)
    if cue and " your " in cue.group(0) and cues.CREATES.search(joined, 0, cue.start()):
        cue = None  # "Implement a heap and explain your code": the code it asks for, not an earlier one
    if not cue and limit:
        cue = _anaphor(rest)
        if not cue and (" to " in joined or " which " in joined):
            cue = cues.CLIPPED.search(rest)
    if not cue and load <= 1:
        if grounding:
            return "a word of the answer"
        cue = cues.LEANS_ON.match(rest) or cues.NEXT_STEP.search(joined)
    return repr(cue.group(0).strip(" .,;:!?")) if cue else None


def classify_turn(query: str, answer: str, user_turn: str, finish_reason: str | None = None) -> Verdict:
    """Label one generated user turn against the conversation it follows.

    Args:
        query (`str`):
            The user's first message.
        answer (`str`):
            The assistant's answer to it.
        user_turn (`str`):
            The generated next user turn, as decoded (chat-template markup may be left in).
        finish_reason (`str`, *optional*):
            `"stop"` or `"length"`; `"length"` lets a loop cut off at the token limit count as degenerate.

    Returns:
        [`Verdict`]: the label (one of `LABELS`) and a short reason.
    """
    markup = "<" in user_turn or "[" in user_turn
    header = cues.ASSISTANT_HEADER.search(user_turn) if markup or "ssistant" in user_turn.lower() else None
    text = (cues.MARKUP.sub(" ", user_turn) if markup else user_turn).strip()
    if not text:
        return Verdict("empty", "nothing but whitespace or special tokens")
    # A user turn of 256 tokens is about 1,500 characters: longer text is judged on its start, and its end is only
    # checked for a loop.
    if len(text) > 2000:
        if compression(text[-1000:]) < 0.15:
            return Verdict("degenerate", "loops: the same span repeats many times")
        text = text[:2000]
    lower = text.lower().replace("’", "'")
    words = cues.WORD.findall(lower)
    joined, distinct = f" {' '.join(words)} ", set(words)
    reason = degenerate(text, words, distinct, joined, finish_reason)
    if reason:
        return Verdict("degenerate", reason)
    if header:
        return Verdict("identity_drift", f"opens an assistant header {header.group(0).strip()!r}")
    ctx = _context(query, answer)
    reason = _repetition(words, distinct, ctx)
    if reason:
        return Verdict("repetition", reason)

    helper = cues.HELPER.search(joined) or cues.HELPER_OPENING.match(lower)
    if helper:
        return Verdict("identity_drift", f"talks as the assistant: {helper.group(0).strip()!r}")
    if "\\boxed" in lower or "####" in lower:
        return Verdict("identity_drift", "marks a final answer like a solution")
    announced = cues.NEW_TASK.match(lower) or word_problem.PRESENTS_TASK.match(lower)
    if announced and not cues.POINTS_BACK.search(joined):
        return Verdict("new_topic", f"announces the next question: {announced.group(0).strip(' :.!?,;-')!r}")
    given = cues.GIVEN.findall(cues.LIST_MARKER.sub("", lower) if "\n" in lower else lower) if "?" in lower else ()
    # A word problem about someone new ("Dana can run four times faster than ... in six hours?") states three
    # quantities, two of them new to the conversation: a problem of its own, not a variant of this one.
    if (
        len(words) >= 20
        and len(given) < 2
        and text[0].isupper()
        and "=" not in lower
        and words[0] not in ctx.vocabulary
        and cues.STOPWORDS.isdisjoint(words[:1])
        and cues.PERSON.isdisjoint(distinct)
        and not cues.ASK_OPENING.match(lower)
        and ("?" in lower or cues.ASK_LATER.search(lower))
    ):
        numbers = {w for w in distinct if w[0].isdigit() or w in cues.NUMBER_WORDS}
        given = numbers if len(numbers) >= 3 and len(numbers - ctx.vocabulary) >= 2 else ()
    if len(given) >= 2 and not cues.REFERENCE_WITHIN[5].search(joined):
        return Verdict("new_topic", "poses a problem of its own: states its own numbers, then asks")

    # Thanks set aside, does the turn ask for anything? And does it explain, advise, list or solve like an answer?
    thanked = None
    if "thank" in lower or "thx" in lower or "apprecia" in lower or "grateful" in lower:
        thanked = cues.THANKS.search(lower)
    rest = cues.THANKS.sub(" ", lower) if thanked else lower
    questions = min(rest.count("?") + rest.count("？"), 3)
    opening = 2 * bool(cues.ASK_OPENING.match(rest))
    n_words = len(words)
    # A request that pastes material to work on ("Format this text for me:\n..."): the voice is the request's, whatever
    # the material says.
    voice, voice_joined = lower, joined
    material = cues.MATERIAL.search(lower, 8) if ":" in lower else None
    if material:
        head = lower[: material.start()]
        head_joined = f" {' '.join(cues.WORD.findall(head))} "
        # The user's own words ("please", "can you", "my"): "Run the following command:" is the assistant's.
        if "?" in head or cues.ASK_PHRASE.search(head_joined) or cues.FIRST_PERSON.search(head_joined):
            voice, voice_joined = head, head_joined
    explains = cues.EXPLAINS.findall(voice_joined)
    if explains and " you " in voice_joined and cues.INSTRUCTS.search(voice_joined):
        explains = [phrase for phrase in explains if not phrase.startswith(" you")]  # instructions, not advice
    assistant = (
        len(explains)
        + (min(len(cues.YOUR_THING.findall(voice_joined)), 2) if " your " in voice_joined else 0)
        + voice.count("however,")
        + 2 * bool(cues.ANSWER_OPENING.match(voice))
        + (min(len(cues.STRUCTURE.findall(voice)), 3) if "\n" in voice else 0)
        + (min(len(cues.EQUATION.findall(voice)), 3) if "=" in voice or "<<" in voice else 0)
        + (n_words if voice is lower else voice_joined.count(" ") - 1) // 80  # users rarely write at length
    )
    # The costlier user cues are only looked for when the cheap ones do not settle the voice.
    later = phrases = first_person = 0
    if assistant >= questions + opening or not (questions or opening):
        later = bool(cues.ASK_LATER.search(rest))
        phrases = min(len(cues.ASK_PHRASE.findall(joined)), 2)
        first_person = bool(cues.FIRST_PERSON.search(joined))
    asks = questions or opening or later or phrases
    if (
        not asks
        and n_words <= 60
        and (thanked or not cues.CLOSER.sub(" ", joined).strip())
        and not cues.PUSHBACK.search(f" {' '.join(cues.WORD.findall(rest))} ")  # "Thanks, but that's wrong" is not
    ):
        return Verdict("acknowledgement", "only thanks or closes")
    # The assistant asked for something and the turn hands it over: long, maybe answer-like, but the user's.
    if ctx.wants_material and cues.SUPPLIES.match(lower):
        return Verdict("followup", "gives what the assistant asked for")
    user = questions + opening + later + phrases + first_person
    if assistant > user:
        return Verdict("identity_drift", "explains or solves like the assistant")

    content = _content(distinct)
    shared = content & ctx.content
    load = len(content) - len(shared)  # the new words a turn brings of its own
    # Small numbers recur by chance (a new word problem shares its 2s and 10s with the last one): they do not ground,
    # though they are not new either. A topic word grounds a short turn, a word from further in the answer half as
    # much; a long turn must share about one word in eight.
    shared = [w for w in shared if len(w) > 2 or not w[0].isdigit()]
    grounding = len(shared) + len(ctx.topic.intersection(shared))
    grounded = grounding >= max(2, 0.24 * len(content))
    if not grounded:
        said, new = _names(text, n_words, ctx.vocabulary)
        grounding += min(said, 2)
        grounded = grounding >= max(2, 0.24 * len(content))
        load += min(new, 3)

    # After an answer that does not know or needs more, the user tells it what it lacked, in the user's voice.
    informs = ctx.lacks and assistant == 0
    if not asks:
        if informs and n_words <= 150 and (grounded or ctx.topic.intersection(shared)):
            return Verdict("followup", "tells the assistant what it lacked; " + _refers(shared))
        if n_words > 60:
            return Verdict("identity_drift", "a long statement that asks nothing, written like an answer")
        reacts = user or cues.REACTS.search(joined)
        if grounded:
            if (reacts and n_words <= 30) or (ctx.asks_user and n_words <= 15 and cues.REPLY_OPENING.match(lower)):
                return Verdict("followup", "reacts to the answer; " + _refers(shared))
            return Verdict("identity_drift", "restates instead of asking; " + _refers(shared))
        if (ctx.asks_user and n_words <= 40) or ((informs or ctx.asks_user and first_person) and n_words <= 60):
            return Verdict("followup", "answers the assistant's question or tells it what it lacked")
        if not (reacts or cues.PUSHBACK.search(joined)):
            return Verdict("identity_drift", "states facts like an answer, asks nothing")
        reference = "the answer" if load <= 2 else _reference(joined, rest, load, grounding)
        if reference:
            return Verdict("followup", f"reacts to {reference}")
        return Verdict("new_topic", "a statement unrelated to the conversation")

    if (
        ctx.arithmetic
        and shared
        and not ctx.asks_user
        and not any(w[0].isdigit() and w not in ctx.query_content and w not in _SMALL for w in content & ctx.content)
        and not word_problem.BACK_AT_ANSWER.search(joined)
    ):
        # After a word problem, a question about its story that names no number of the answer and does not point
        # back at it is that problem again or another one of the same story ("How many miles does John drive in 120
        # minutes?"), not a reaction (issue 17).
        if word_problem.restates(content - ctx.content, ctx.question, set(shared)):
            return Verdict("repetition", "asks the query's question again")
        return Verdict("new_topic", "asks about the problem's story, not about the answer")
    if grounded:
        return Verdict("followup", "asks about it; " + _refers(shared))
    if (ctx.asks_user or ctx.lacks) and not (questions or opening or later) and (first_person or n_words <= 12):
        return Verdict("followup", "answers the assistant's question")
    if (ctx.declines or ctx.lacks) and load <= 5 and cues.INSISTS.search(joined):
        return Verdict("followup", "presses the request the assistant declined")
    meta = " you" in joined and not ctx.about_assistant and cues.ABOUT_ASSISTANT.search(joined)
    if meta:
        return Verdict("new_topic", f"asks about the assistant, not the answer: {meta.group(0).strip()!r}")
    if load == 0:
        return Verdict("followup", "a generic follow-up request")
    reference = _reference(joined, rest, load, grounding)
    if reference:
        return Verdict("followup", f"asks about {reference} in context")
    return Verdict("new_topic", "asks something unrelated to the conversation")

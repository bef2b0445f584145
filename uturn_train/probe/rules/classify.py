"""Classify a generated user turn: is it a follow-up to the answer, or something else?

The probe shows a chat model `[query; answer]` and lets it write the next *user* turn. This module labels that turn
with fast, deterministic rules (stdlib only, tens of thousands of turns per second on one core); the English cues it
reads are in `cues.py`, the words and features it reads them in are `text.py`'s.

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

import itertools
from dataclasses import dataclass

from . import cues, word_problem
from .degenerate import compression, degenerate
from .references import refers_back
from .text import SMALL, Context, content, context, padded, words

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


@dataclass(frozen=True)
class _Turn:
    """A turn as the stages read it: markup dropped, at most 2,000 characters."""

    text: str
    lower: str
    words: list
    joined: str  # `padded(words)`
    distinct: set


@dataclass(frozen=True)
class _Voice:
    """Whose voice a turn has, and whether it asks for anything (thanks set aside)."""

    rest: str  # the lowercased turn without its thanks
    questions: int
    opening: int  # 2 when it opens like a request ("Can you ...")
    later: int
    phrases: int
    first_person: int
    assistant: int  # how much it explains, lists or solves like an answer

    @property
    def asks(self) -> bool:
        return bool(self.questions or self.opening or self.later or self.phrases)

    @property
    def user(self) -> int:
        return self.questions + self.opening + self.later + self.phrases + self.first_person


@dataclass(frozen=True)
class _Overlap:
    """What a turn shares with its conversation, and what it brings of its own."""

    content: set  # the turn's content words and numbers
    shared: list  # those the conversation has too, but numbers of one or two digits (they recur by chance)
    load: int  # the new words a turn brings of its own, plus its new names
    grounding: int
    grounded: bool


def _repetition(words: list[str], distinct: set, ctx: Context) -> str | None:
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


def _read(user_turn: str, finish_reason: str | None) -> _Turn | Verdict:
    """The turn's words, or its verdict when its surface settles it: empty, degenerate, or an assistant header."""
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
    turn_words = words(text)
    turn = _Turn(text, lower, turn_words, padded(turn_words), set(turn_words))
    reason = degenerate(text, turn.words, turn.distinct, turn.joined, finish_reason)
    if reason:
        return Verdict("degenerate", reason)
    if header:
        return Verdict("identity_drift", f"opens an assistant header {header.group(0).strip()!r}")
    return turn


def _poses_problem(turn: _Turn, ctx: Context) -> bool:
    """Two sentences that state numbers, then a question; or a word problem about someone new ("Dana can run four
    times faster than ... in six hours?") that states three quantities, two of them new to the conversation: a problem
    of its own, not a variant of this one."""
    lower, words_ = turn.lower, turn.words
    given = cues.GIVEN.findall(cues.LIST_MARKER.sub("", lower) if "\n" in lower else lower) if "?" in lower else ()
    if (
        len(words_) >= 20
        and len(given) < 2
        and turn.text[0].isupper()
        and "=" not in lower
        and words_[0] not in ctx.vocabulary
        and cues.STOPWORDS.isdisjoint(words_[:1])
        and cues.PERSON.isdisjoint(turn.distinct)
        and not cues.ASK_OPENING.match(lower)
        and ("?" in lower or cues.ASK_LATER.search(lower))
    ):
        numbers = {w for w in turn.distinct if w[0].isdigit() or w in cues.NUMBER_WORDS}
        given = numbers if len(numbers) >= 3 and len(numbers - ctx.vocabulary) >= 2 else ()
    return len(given) >= 2 and not cues.REFERENCE_WITHIN[5].search(turn.joined)


def _no_reply(turn: _Turn, ctx: Context) -> Verdict | None:
    """A turn that is no reply to the answer, whatever its voice: a copy, the assistant's own phrases, a new task."""
    reason = _repetition(turn.words, turn.distinct, ctx)
    if reason:
        return Verdict("repetition", reason)
    helper = cues.HELPER.search(turn.joined) or cues.HELPER_OPENING.match(turn.lower)
    if helper:
        return Verdict("identity_drift", f"talks as the assistant: {helper.group(0).strip()!r}")
    if "\\boxed" in turn.lower or "####" in turn.lower:
        return Verdict("identity_drift", "marks a final answer like a solution")
    announced = cues.NEW_TASK.match(turn.lower) or word_problem.PRESENTS_TASK.match(turn.lower)
    if announced and not cues.POINTS_BACK.search(turn.joined):
        return Verdict("new_topic", f"announces the next question: {announced.group(0).strip(' :.!?,;-')!r}")
    if _poses_problem(turn, ctx):
        return Verdict("new_topic", "poses a problem of its own: states its own numbers, then asks")
    return None


def _voice(turn: _Turn, ctx: Context) -> _Voice | Verdict:
    """Thanks set aside, does the turn ask for anything? And does it explain, advise, list or solve like an answer?
    Settles thanks alone, material the assistant asked for, and a turn in the assistant's voice."""
    lower, joined = turn.lower, turn.joined
    thanked = None
    if "thank" in lower or "thx" in lower or "apprecia" in lower or "grateful" in lower:
        thanked = cues.THANKS.search(lower)
    rest = cues.THANKS.sub(" ", lower) if thanked else lower
    questions = min(rest.count("?") + rest.count("？"), 3)
    opening = 2 * bool(cues.ASK_OPENING.match(rest))
    n_words = len(turn.words)
    # A request that pastes material to work on ("Format this text for me:\n..."): the voice is the request's, whatever
    # the material says.
    voice, voice_joined = lower, joined
    material = cues.MATERIAL.search(lower, 8) if ":" in lower else None
    if material:
        head = lower[: material.start()]
        head_joined = padded(words(head))
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
    result = _Voice(rest, questions, opening, later, phrases, first_person, assistant)
    if (
        not result.asks
        and n_words <= 60
        and (thanked or not cues.CLOSER.sub(" ", joined).strip())
        and not cues.PUSHBACK.search(padded(words(rest)))  # "Thanks, but that's wrong" is not
    ):
        return Verdict("acknowledgement", "only thanks or closes")
    # The assistant asked for something and the turn hands it over: long, maybe answer-like, but the user's.
    if ctx.wants_material and cues.SUPPLIES.match(lower):
        return Verdict("followup", "gives what the assistant asked for")
    if assistant > result.user:
        return Verdict("identity_drift", "explains or solves like the assistant")
    return result


def _overlap(turn: _Turn, ctx: Context) -> _Overlap:
    """Small numbers recur by chance (a new word problem shares its 2s and 10s with the last one): they do not ground,
    though they are not new either. A topic word grounds a short turn, a word from further in the answer half as much;
    a long turn must share about one word in eight."""
    own = content(turn.distinct)
    shared = own & ctx.content
    load = len(own) - len(shared)  # the new words a turn brings of its own
    shared = [w for w in shared if len(w) > 2 or not w[0].isdigit()]
    grounding = len(shared) + len(ctx.topic.intersection(shared))
    grounded = grounding >= max(2, 0.24 * len(own))
    if not grounded:
        said, new = _names(turn.text, len(turn.words), ctx.vocabulary)
        grounding += min(said, 2)
        grounded = grounding >= max(2, 0.24 * len(own))
        load += min(new, 3)
    return _Overlap(own, shared, load, grounding, grounded)


def _statement(turn: _Turn, ctx: Context, voice: _Voice, overlap: _Overlap) -> Verdict:
    """A turn that asks nothing: a reply, information the assistant lacked, a reaction, or an answer-like text."""
    n_words, shared = len(turn.words), overlap.shared
    # After an answer that does not know or needs more, the user tells it what it lacked, in the user's voice.
    informs = ctx.lacks and voice.assistant == 0
    if informs and n_words <= 150 and (overlap.grounded or ctx.topic.intersection(shared)):
        return Verdict("followup", "tells the assistant what it lacked; " + _refers(shared))
    if n_words > 60:
        return Verdict("identity_drift", "a long statement that asks nothing, written like an answer")
    reacts = voice.user or cues.REACTS.search(turn.joined)
    if overlap.grounded:
        if (reacts and n_words <= 30) or (ctx.asks_user and n_words <= 15 and cues.REPLY_OPENING.match(turn.lower)):
            return Verdict("followup", "reacts to the answer; " + _refers(shared))
        return Verdict("identity_drift", "restates instead of asking; " + _refers(shared))
    if (ctx.asks_user and n_words <= 40) or ((informs or ctx.asks_user and voice.first_person) and n_words <= 60):
        return Verdict("followup", "answers the assistant's question or tells it what it lacked")
    if not (reacts or cues.PUSHBACK.search(turn.joined)):
        return Verdict("identity_drift", "states facts like an answer, asks nothing")
    load = overlap.load
    cue = "the answer" if load <= 2 else refers_back(turn.joined, voice.rest, load, overlap.grounding)
    if cue:
        return Verdict("followup", f"reacts to {cue}")
    return Verdict("new_topic", "a statement unrelated to the conversation")


def _request(turn: _Turn, ctx: Context, voice: _Voice, overlap: _Overlap) -> Verdict:
    """A turn that asks for something: a follow-up when grounded in the conversation or pointing back at it, a new
    topic when it brings a subject of its own."""
    joined, shared, load = turn.joined, overlap.shared, overlap.load
    if (
        ctx.arithmetic
        and shared
        and not ctx.asks_user
        and not any(w[0].isdigit() and w not in ctx.query_content and w not in SMALL for w in overlap.content
                    & ctx.content)
        and not word_problem.BACK_AT_ANSWER.search(joined)
    ):
        # After a word problem, a question about its story that names no number of the answer and does not point
        # back at it is that problem again or another one of the same story ("How many miles does John drive in 120
        # minutes?"), not a reaction (issue 17).
        if word_problem.restates(overlap.content - ctx.content, ctx.question, set(shared)):
            return Verdict("repetition", "asks the query's question again")
        return Verdict("new_topic", "asks about the problem's story, not about the answer")
    if overlap.grounded:
        return Verdict("followup", "asks about it; " + _refers(shared))
    n_words = len(turn.words)
    if (ctx.asks_user or ctx.lacks) and not (voice.questions or voice.opening or voice.later) and (
            voice.first_person or n_words <= 12):
        return Verdict("followup", "answers the assistant's question")
    if (ctx.declines or ctx.lacks) and load <= 5 and cues.INSISTS.search(joined):
        return Verdict("followup", "presses the request the assistant declined")
    meta = " you" in joined and not ctx.about_assistant and cues.ABOUT_ASSISTANT.search(joined)
    if meta:
        return Verdict("new_topic", f"asks about the assistant, not the answer: {meta.group(0).strip()!r}")
    if load == 0:
        return Verdict("followup", "a generic follow-up request")
    cue = refers_back(joined, voice.rest, load, overlap.grounding)
    if cue:
        return Verdict("followup", f"asks about {cue} in context")
    return Verdict("new_topic", "asks something unrelated to the conversation")


def classify_turn(query: str, answer: str, user_turn: str, finish_reason: str | None = None) -> Verdict:
    """Label one generated user turn against the conversation it follows, stage by stage (the module docstring):
    its surface, whether it is a reply at all, its voice, then what it shares with the conversation.

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
    turn = _read(user_turn, finish_reason)
    if isinstance(turn, Verdict):
        return turn
    ctx = context(query, answer)
    verdict = _no_reply(turn, ctx)
    if verdict is not None:
        return verdict
    voice = _voice(turn, ctx)
    if isinstance(voice, Verdict):
        return voice
    overlap = _overlap(turn, ctx)
    return _request(turn, ctx, voice, overlap) if voice.asks else _statement(turn, ctx, voice, overlap)

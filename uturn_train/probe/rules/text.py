"""Words, stems and a conversation's features: what the classifier (`classify.py`) and the grounded decision
(`grounding.py`) read from text, computed one way for both.

```python
>>> words("Why did you multiply by 4 in step 2?")
['why', 'did', 'you', 'multiply', 'by', '4', 'in', 'step', '2']
>>> padded(["show", "it", "for", "5"])
' show it for 5 '
>>> sorted(content({"extensions", "the", "24", "example"}))
['24', 'extens']
```
"""

import functools
import itertools
from dataclasses import dataclass

from . import cues, word_problem

SMALL = frozenset(map(str, range(13)))  # numbers that recur by chance


def words(text: str) -> list[str]:
    """The words of `text`, lowercased, a curly apostrophe read as a straight one (`cues.WORD`)."""
    return cues.WORD.findall(text.lower().replace("’", "'"))


def padded(word_list) -> str:
    """Words joined by single spaces with a space at each end: what the phrases of `cues.phrases` match."""
    return f" {' '.join(word_list)} "


def stem(word: str) -> str:
    """Crude but fast: "extensions" ~ "extension", "gravitational" ~ "gravitation", "developing" ~ "development",
    "entities" ~ "entity"."""
    if word.endswith("'s"):
        word = word[:-2]
    elif len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return word[:6]


_GENERIC_STEMS = frozenset(map(stem, cues.GENERIC))
_STEMS: dict[str, str | None] = {}  # word -> stem of a content word, a number as written, or None


def content(distinct: set[str]) -> set[str]:
    """Stems of the content words among `distinct` words, and its numbers (without thousands separators)."""
    if len(_STEMS) > 1 << 18:
        _STEMS.clear()
    for word in distinct.difference(_STEMS):  # a plain dict, so that `map` below looks words up in C
        s = stem(word) if len(word) > 2 and word not in cues.STOPWORDS else None
        _STEMS[word] = word.replace(",", "") if word[0].isdigit() else None if s in _GENERIC_STEMS else s
    stems = set(map(_STEMS.__getitem__, distinct))
    stems.discard(None)
    return stems


@dataclass(frozen=True)
class Context:
    """What a turn is read against: the features of one (query, answer) conversation."""

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
def context(query: str, answer: str) -> Context:
    """The [`Context`] of (query, answer); a probe classifies many turns against one, so it is computed once."""
    query_words = words(query)
    answer_words = words(answer)
    query_content = content(set(query_words))
    answer_content = content(set(answer_words))
    opening = content(set(answer_words[:20]))
    tail = padded(answer_words[-50:])
    ends = f" {' '.join(answer_words[:40])} {tail}" if len(answer_words) > 90 else padded(answer_words)
    return Context(
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
        about_assistant=bool(cues.ABOUT_ASSISTANT.search(padded(query_words))),
        arithmetic=bool(answer_words) and sum(w[0].isdigit() or w in cues.NUMBER_WORDS for w in set(query_words)) >= 2
        and bool(word_problem.QUANTITY_QUESTION.search(padded(query_words[-40:]))),
        question=frozenset(content(set(words(word_problem.last_question(query))))),
        query_content=frozenset(query_content),
    )

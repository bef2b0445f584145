"""The words by which a request that shares no topic word with its conversation refers back to it ("this algorithm",
"make it shorter", "the first one", a pronoun), as far as the new words it brings allow (`classify.py`'s module
docstring lists them by load)."""

import re

from . import cues


def anaphor(rest: str) -> re.Match | None:
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


def refers_back(joined: str, rest: str, load: int, grounding: int) -> str | None:
    """The words by which a request that shares no topic word refers back, if they carry its `load` of new words."""
    load -= grounding  # a word from further in the answer is half a match: it carries one new word
    limit = 2 if load <= 2 else 3 if load <= 3 else 5 if load <= 5 else None
    cue = (cues.REFERENCE_WITHIN[limit] if limit else cues.POINTS_BACK).search(joined)
    if cue and " your " in cue.group(0) and cues.CREATES.search(joined, 0, cue.start()):
        cue = None  # "Implement a heap and explain your code": the code it asks for, not an earlier one
    if not cue and limit:
        cue = anaphor(rest)
        if not cue and (" to " in joined or " which " in joined):
            cue = cues.CLIPPED.search(rest)
    if not cue and load <= 1:
        if grounding:
            return "a word of the answer"
        cue = cues.LEANS_ON.match(rest) or cues.NEXT_STEP.search(joined)
    return repr(cue.group(0).strip(" .,;:!?")) if cue else None

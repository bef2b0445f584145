"""Classify a generated user turn: is it a grounded follow-up to the answer, or something else?

The probe shows a chat model `[query; answer]` and lets it write the next *user* turn. This module labels that turn
with fast, deterministic rules (stdlib only, tens of thousands of turns per second):

```python
>>> classify_turn("What is 3 + 4?", "3 + 4 = 7.", "Thanks! Can you also show it for 5 + 9?").label
'followup'
>>> classify_turn("What is 3 + 4?", "3 + 4 = 7.", "Sure! Here's how to add 3 and 4: ...").label
'identity_drift'
```

The checks run from the most to the least certain: empty, degenerate (loops, gibberish), an assistant role header,
repetition of an earlier turn, assistant voice, thanks only, and last a user-style turn that is a follow-up when it
refers to the conversation (shared content words or numbers, or a pronoun that only makes sense in context) and a new
topic when it does not.
"""

import functools
import re
import zlib
from dataclasses import dataclass


LABELS = ("followup", "acknowledgement", "identity_drift", "repetition", "new_topic", "empty", "degenerate")


@dataclass(frozen=True)
class Verdict:
    """The label of one generated user turn.

    Args:
        label (`str`):
            One of `LABELS`.
        reason (`str`):
            A short human-readable why, e.g. `"asks about '4' from the answer"`.
    """

    label: str
    reason: str

    @property
    def is_followup(self) -> bool:
        return self.label == "followup"


# ---------------------------------------------------------------------------------------------------------------------
# Chat-template markup. Special tokens look alike across templates (`<|im_start|>`, `<|eot_id|>`, `<｜Assistant｜>`,
# `<start_of_turn>`, `</s>`, `[INST]`), so they are matched by shape, and a role header is such a token next to a role.
_TOKEN = r"(?:<[|｜][^<>\n]{0,40}?[|｜]>|</?(?:s|eos|bos|pad|unk|think|[a-z]+(?:_[a-z]+)+)>|\[/?INST\])"
_ASSISTANT_ROLE = r"(?:assistant|model|bot|chatbot|gpt|ai)"
_ASSISTANT_HEADER = re.compile(
    rf"{_TOKEN}[ \t]*\n?[ \t]*{_ASSISTANT_ROLE}\b"  # <|im_start|>assistant, <start_of_turn>model
    rf"|<[|｜]\s*{_ASSISTANT_ROLE}\s*[|｜]>"  # <|assistant|>, <｜Assistant｜>
    r"|\[/INST\]"  # Llama-2/Mistral: what follows [/INST] is the assistant's
    r"|^[ \t]*(?:#+[ \t]*)?(?:\*\*)?(?:ai[ \t]+)?assistant(?:\*\*)?[ \t]*:",  # "Assistant:" / "### Assistant:"
    re.IGNORECASE | re.MULTILINE,
)
_MARKUP = re.compile(rf"{_TOKEN}(?:[ \t]*(?:user|human|prompter|system)\b)?", re.IGNORECASE)

# ---------------------------------------------------------------------------------------------------------------------
# Words. Content words drop function words and words too generic to show that a turn refers to *this* conversation.
_WORD = re.compile(r"[a-z]+(?:['’][a-z]+)*|\d+(?:[.,]\d+)*")
_STOPWORDS = frozenset(
    """a about above after again against all also am an and any are aren't as at be because been before being below
    between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down during each else
    even ever every few for from further had hadn't has hasn't have haven't having he he'd he'll he's her here here's
    hers herself him himself his how how's however i i'd i'll i'm i've if in into is isn't it it's its itself just
    let let's may me might more most much must mustn't my myself no nor not now of off on once only or other ought our
    ours ourselves out over own same shall shan't she she'd she'll she's should shouldn't so some such than that
    that's the their theirs them themselves then there there's these they they'd they'll they're they've this those
    though through to too under until up upon us very was wasn't we we'd we'll we're we've were weren't what what's
    when when's where where's whether which while who who's whom whose why why's will with won't would wouldn't yet
    you you'd you'll you're you've your yours yourself yourselves im dont doesnt didnt cant wont isnt thats whats
    ok okay yes yeah yep no nope oh hi hello hey please pls thanks thank thx
    """.split()
)
_GENERIC = frozenset(
    """question questions problem problems answer answers answered explain explained explanation example examples
    help helpful tell told know known think thought mean means meant want wanted need needs like liked good great
    best better bad sure really actually thing things way ways use used using make made get got give gave show shown
    write written say said see look looking find found try tried go going come take lot lots kind sort new different
    another many something anything everything nothing someone anyone one two first second third last next also
    still well right wrong true false correct simple simpler simply detail details detailed information info more
    less part step steps point points idea ideas work works working time times again instead now maybe please able
    possible specific general certain basically exactly kinda stuff whole bit little long short able would could
    following above below previous response reply text list describe description provide suggest suggestion
    recommend understand understanding clarify elaborate expand continue rewrite give case cases option options
    word words sentence sentences way""".split()
)
# Words that point back into the conversation. A pronoun only does so in a short turn; the others do in any turn.
_PRONOUN = re.compile(r"\b(?:it|that|this|these|those|they|them|he|she|him|her|its|their)\b(?!\s+[a-z]{4,})", re.I)
_DEICTIC = re.compile(
    r"\byou(?:r)?\s+(?:said|say|mentioned|wrote|gave|suggested|listed|used|did|made|forgot|missed|meant|answer|"
    r"response|reply|explanation|example|solution|code|list|script|last|first|previous|method|approach|version)"
    r"|\b(?:step|point|option|item|line|part|number)\s+\d+\b"
    r"|\bthe\s+(?:first|second|third|fourth|fifth|last|previous|above|same|other|next|final|latter|former)\b"
    r"|\b(?:above|aforementioned|mentioned)\b|\b(?:what|how)\s+about\b|\bwhat\s+if\b|\binstead\b|\bagain\b"
    r"|^\W*(?:and|but|so|then|also|now)\b",
    re.IGNORECASE,
)

# ---------------------------------------------------------------------------------------------------------------------
# Voice. A user asks, requests, corrects or thanks; an assistant offers, explains and signs off.
_HELPER = re.compile(
    r"\bi\s+hope\s+(?:this|that|it|my|the)\b[^.?!\n]{0,40}\b(?:help|clarif|answer|useful|assist)"
    r"|\bhope\s+(?:this|that)\s+helps\b|\blet\s+me\s+know\s+if\b|\bfeel\s+free\s+to\b"
    r"|\banything\s+else\s+(?:i|we)\s+can\b|\b(?:how|what)\s+(?:else\s+)?(?:can|may)\s+i\s+(?:help|assist|do\s+for)"
    r"|\b(?:can|may)\s+i\s+(?:help|assist)\s+you\b|\bwould\s+you\s+like\s+(?:me\s+to|to\s+know|more|any|a)\b"
    r"|\bdo\s+you\s+have\s+any\s+(?:other\s+|more\s+|further\s+)?questions\b"
    r"|\bas\s+an\s+ai\b|\bi(?:'m|\s+am)\s+(?:just\s+)?an\s+ai\b|\bas\s+a\s+(?:large\s+)?language\s+model\b"
    r"|\b(?:i'd|i\s+would|i'm|i\s+am)\s+(?:be\s+)?(?:happy|glad|delighted)\s+to\s+(?:help|assist|explain|provide)"
    r"|\b(?:happy|glad)\s+(?:i\s+could\s+|to\s+)help\b|\byou(?:'re|\s+are)\s+(?:very\s+|most\s+)?welcome\b"
    r"|\b(?:great|good|excellent|interesting)\s+question\b"
    r"|\bthanks?\s+(?:you\s+)?for\s+(?:your\s+question|asking|reaching\s+out|the\s+question|contacting)"
    r"|\bthe\s+user\s+(?:is\s+asking|asked|asks|wants|has\s+asked|is\s+requesting|is\s+looking)"
    r"|\bfinal\s+answer\b|\\boxed|^\s*####|\bi\s+apologi[sz]e\s+for\b"
    r"|\bin\s+(?:summary|conclusion)\b|\bto\s+summarize\b|\blet's\s+(?:break|calculate|solve|compute|denote|"
    r"think\s+step|work\s+through|go\s+through|figure|find|start\s+by)",
    re.IGNORECASE | re.MULTILINE,
)
_HELPER_OPENER = re.compile(
    r"^\W*(?:(?:sure|certainly|of\s+course|absolutely|great|yes)\b[!,.]?\s*(?:thing[!,.]?\s*)?"
    r"(?:here(?:'s|\s+is|\s+are)\b|i(?:'ll|\s+will|'d|\s+would|\s+can)\b|let(?:'s|\s+me)\b)"
    r"|(?:sure|certainly|of\s+course|absolutely)[!.]"
    r"|here(?:'s|\s+is|\s+are)\s+(?:a|an|the|some|how|what|why|\d+|several|few|more)\b)",
    re.IGNORECASE,
)
_QUESTION_START = re.compile(
    r"(?:^|[.!?\n]\s*)(?:(?:and|but|so|ok|okay|then|also|now|well|thanks|wait|hmm)[,.!]?\s+)?"
    r"(?:what|why|how|when|where|which|who|whom|whose|is|are|was|were|do|does|did|can|could|would|will|should|shall|"
    r"have|has|any|isn't|aren't|doesn't|don't|didn't|won't|wouldn't|couldn't|shouldn't)\b",
    re.IGNORECASE,
)
_REQUEST = re.compile(
    r"(?:^|[.!?:\n]\s*)(?:(?:and|but|so|ok|okay|then|also|now|well|thanks|great|cool|nice|perfect|yes|no|please|"
    r"pls|ah|oh)[,.!]?\s+)*"
    r"(?:add|adjust|alter|answer|apply|break|calculate|change|check|clarify|compare|compose|compute|consider|continue|"
    r"convert|correct|count|create|define|describe|design|determine|dive|do|double|draft|draw|edit|elaborate|"
    r"estimate|evaluate|expand|explain|express|find|finish|fix|focus|format|generate|give|go|help|identify|imagine|"
    r"implement|improve|include|input|keep|let's|list|make|modify|name|offer|outline|paraphrase|pick|plot|pretend|"
    r"prove|provide|put|recommend|redo|reformulate|remove|rephrase|replace|repeat|rewrite|revise|say|shorten|show|"
    r"simplify|solve|sort|specify|spell|start|suggest|summari[sz]e|take|teach|tell|translate|try|turn|update|use|"
    r"verify|walk|write)\b"
    r"|\b(?:please|pls|plz|can\s+you|could\s+you|would\s+you|will\s+you|can\s+we|could\s+we|help\s+me|tell\s+me|"
    r"give\s+me|show\s+me|i\s+(?:would|'d)\s+like|i\s+(?:want|wanted|need|needed|wish)\s+(?!to\s+thank)|"
    r"i(?:'m|\s+am)\s+(?:looking|trying|asking|wondering|curious|interested|confused|not\s+sure)|i\s+was\s+"
    r"(?:wondering|hoping|asking|thinking)|i\s+(?:don't|do\s+not|didn't|still\s+don't)\s+(?:understand|get|see|"
    r"mean|think|know|like|want)|i\s+meant|i\s+have\s+(?:a|another|one\s+more)\s+(?:question|problem|issue)|"
    r"what\s+about|how\s+about|what\s+if|and\s+(?:for|in|with|if)\b|instead)\b",
    re.IGNORECASE,
)
# The user pushes back on the answer: a short reaction counts as a follow-up even without a question.
_CHALLENGE = re.compile(
    r"\b(?:not|no|wrong|incorrect|mistake|error|doesn't|does\s+not|didn't|did\s+not|isn't|wasn't|don't|never|"
    r"actually|but|however|though|really|sure|seems?|you|your|you're)\b|n't\b",
    re.IGNORECASE,
)
_THANKS = re.compile(
    r"\b(?:i\s+(?:want|wanted|would\s+like|'d\s+like)\s+to\s+)?(?:thanks?|thx|ty|appreciate[sd]?|grateful)\b"
    r"(?:\s+(?:you|u|so\s+much|a\s+lot|very\s+much|again|a\s+bunch|a\s+ton|for\s+[^.?!\n]{0,60}))*",
    re.IGNORECASE,
)
_CLOSER = re.compile(
    r"\b(?:that's\s+all|that\s+is\s+all|bye|goodbye|good\s+night|have\s+a\s+(?:nice|good|great)\s+\w+|take\s+care|"
    r"got\s+it|makes\s+sense|that\s+(?:helps|helped|works|worked)|(?:this|that|it)\s+(?:is|was|'s)\s+(?:very\s+|"
    r"really\s+|so\s+)?(?:great|helpful|perfect|awesome|useful|clear|amazing|good|nice|interesting)|"
    r"i\s+(?:see|understand)\s*[.!]|(?:perfect|great|awesome|cool|nice|wonderful|excellent|amazing|ok|okay|alright|"
    r"wow|brilliant|fantastic|good|lovely)\b[!.]?|no\s+more\s+questions|i(?:'ll|\s+will)\s+(?:try|give|do)\s+"
    r"(?:it|that|this)(?:\s+a\s+try)?)",
    re.IGNORECASE,
)
_EQUATION = re.compile(r"\d\s*[-+*/×x÷]\s*\$?\d[\d.,]*\s*=\s*\$?\d|<<[^<>]*>>")
_STRUCTURE = re.compile(r"^[ \t]*(?:[-*•]|\d+[.)]|#{1,4}|```|step\s+\d+)[ \t]", re.IGNORECASE | re.MULTILINE)

# ---------------------------------------------------------------------------------------------------------------------
# Degenerate text.
_LATIN_WORD = re.compile(r"[a-z]+(?:['’][a-z]+)?", re.IGNORECASE)
# A whitespace token that reads as a word, number or CJK run, with ordinary punctuation around it.
_CLEAN_TOKEN = re.compile(
    r"(?<!\S)[\"'“‘(\[*_`]*(?:[A-Za-z\u00C0-\u024F]+(?:['’\-./][A-Za-z\u00C0-\u024F]+)*|[$€£]?\d+(?:[.,:/\-]\d+)*%?|"
    r"[^\W\d_A-Za-z]+)[\"'”’)\].,;:!?*_`]*(?!\S)"
)
_VOWELLESS = re.compile(r"\b[b-df-hj-np-tv-xz]{5,}\b|\b\w*[b-df-hj-np-tv-xz]{6,}\w*\b", re.IGNORECASE)
_SYMBOL = re.compile(r"[^\w\s]")
_SCRIPTS = {
    "latin": re.compile(r"[A-Za-z]"),
    "cyrillic": re.compile(r"[\u0400-\u04FF]"),
    "greek": re.compile(r"[\u0370-\u03FF]"),
    "arabic": re.compile(r"[\u0600-\u06FF]"),
    "hebrew": re.compile(r"[\u0590-\u05FF]"),
    "indic": re.compile(r"[\u0900-\u0DFF]"),
    "thai": re.compile(r"[\u0E00-\u0E7F]"),
    "cjk": re.compile(r"[\u3040-\u30FF\u4E00-\u9FFF]"),
    "hangul": re.compile(r"[\uAC00-\uD7AF]"),
}


def _loop_ratio(text: str) -> float:
    """Compressed size over raw size: about 0.4-0.6 for prose, under 0.15 for a span repeated many times."""
    data = text.encode()
    return len(zlib.compress(data)) / len(data)


def _degenerate(text: str, words: list[str], finish_reason: str | None) -> str | None:
    n = len(words)
    if n >= 8 and len(set(words)) <= max(2, n // 8):
        return f"loops over {len(set(words))} distinct words"
    if len(text) >= 200 and _loop_ratio(text) < 0.12:
        return "loops: the same span repeated many times"
    if finish_reason == "length" and len(text) >= 120 and _loop_ratio(text[-len(text) // 2 :]) < 0.2:
        return "cut off at the token limit mid-loop"
    tokens = text.split()
    if len(tokens) >= 5:
        clean = len(_CLEAN_TOKEN.findall(text))
        if clean < 0.6 * len(tokens):
            return f"gibberish: {len(tokens) - clean} of {len(tokens)} tokens are not words"
        latin = _LATIN_WORD.findall(text)
        if len(latin) >= 5 and len(_VOWELLESS.findall(text)) >= 0.3 * len(latin):
            return "gibberish: mostly unpronounceable letter strings"
        scripts = sum(1 for pattern in _SCRIPTS.values() if pattern.search(text))
        if scripts >= 4:
            return f"gibberish: mixes {scripts} writing systems"
        if len(latin) >= 15 and sum(w.lower() in _STOPWORDS for w in latin) < 0.08 * len(latin) and clean < 0.85 * len(tokens):
            return "gibberish: token salad"
    nonspace = len(text) - text.count(" ") - text.count("\n")
    if nonspace >= 20 and len(_SYMBOL.findall(text)) > 0.5 * nonspace:
        return "gibberish: mostly symbols"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Grounding.
def _stem(word: str) -> str:
    # Crude but fast: "extensions" ~ "extension", "gravitational" ~ "gravitation", "developing" ~ "development".
    if word.endswith(("'s", "’s")):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return word[:6]


def _content(words: list[str]) -> set[str]:
    out = set()
    for w in words:
        if w[0].isdigit():
            out.add(w.replace(",", ""))
        elif len(w) > 2 and w not in _STOPWORDS and w not in _GENERIC and w.rstrip("s") not in _GENERIC:
            out.add(_stem(w))
    return out


def _bigrams(words: list[str]) -> set[tuple[str, str]]:
    return set(zip(words, words[1:]))


@dataclass(frozen=True)
class _Context:
    query_words: tuple
    query_bigrams: frozenset
    answer_bigrams: frozenset
    content: frozenset
    asks_user: bool  # the answer ends by asking the user something


@functools.lru_cache(maxsize=4096)
def _context(query: str, answer: str) -> _Context:
    # A probe classifies many turns against one context: compute its features once.
    query_words = _WORD.findall(query.lower())
    answer_words = _WORD.findall(answer.lower())
    return _Context(
        query_words=tuple(query_words),
        query_bigrams=frozenset(_bigrams(query_words)),
        answer_bigrams=frozenset(_bigrams(answer_words)),
        content=frozenset(_content(query_words) | _content(answer_words)),
        asks_user="?" in answer[-300:],
    )


def _repetition(words: list[str], ctx: _Context) -> str | None:
    if len(words) < 4:
        return "repeats the query" if tuple(words) == ctx.query_words and words else None
    bigrams = _bigrams(words)
    for name, source in (("the query", ctx.query_bigrams), ("the answer", ctx.answer_bigrams)):
        shared = len(bigrams & source) / len(bigrams)
        if shared >= 0.7:
            return f"repeats {name} ({shared:.0%} of its word pairs)"
    return None


# ---------------------------------------------------------------------------------------------------------------------
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
    header = _ASSISTANT_HEADER.search(user_turn)
    text = _MARKUP.sub(" ", user_turn).strip()
    if not text:
        return Verdict("empty", "nothing but whitespace or special tokens")
    lower = text.lower()
    words = _WORD.findall(lower)
    reason = _degenerate(text, words, finish_reason)
    if reason:
        return Verdict("degenerate", reason)
    if header:
        return Verdict("identity_drift", f"opens an assistant header {header.group(0).strip()!r}")

    ctx = _context(query, answer)
    reason = _repetition(words, ctx)
    if reason:
        return Verdict("repetition", reason)

    helper = _HELPER_OPENER.search(text) or _HELPER.search(text)
    if helper:
        return Verdict("identity_drift", f"talks as the assistant: {helper.group(0).strip()!r}")

    # What is left once thanks are set aside decides between asking and only thanking.
    thanked = _THANKS.search(text)
    rest = _THANKS.sub(" ", text)
    asks = "?" in rest or "？" in rest or _QUESTION_START.search(rest) or _REQUEST.search(rest)
    n_words = len(words)
    if not asks:
        closer = _CLOSER.sub(" ", rest)
        if thanked or not _WORD.search(closer):
            if n_words <= 60:
                return Verdict("acknowledgement", "only thanks or closes")

    content = _content(words)
    shared = content & ctx.content
    new = len(content) - len(shared)
    grounded = shared and len(shared) >= 0.2 * len(content)
    why = f"refers to {', '.join(repr(w) for w in sorted(shared)[:3])} from the conversation" if shared else ""
    deictic = (_DEICTIC.search(text) if new <= 6 else None) or (_PRONOUN.search(text) if new <= 2 else None)

    if not asks:
        solves = _EQUATION.search(text) or len(_STRUCTURE.findall(text)) >= 2
        if solves or n_words > 60:
            if grounded or solves:
                return Verdict("identity_drift", "answers or restates instead of asking" + (f"; {why}" if why else ""))
            return Verdict("new_topic", "a long statement unrelated to the conversation")
        if grounded:
            return Verdict("followup", f"reacts to the answer; {why}")
        if ctx.asks_user and n_words <= 40:
            return Verdict("followup", "answers the assistant's question")
        if new <= 2 and (deictic or _CHALLENGE.search(text)):
            return Verdict("followup", "reacts to the answer")
        return Verdict("new_topic", "a statement unrelated to the conversation")

    if grounded:
        return Verdict("followup", f"asks about it; {why}")
    if deictic:
        return Verdict("followup", f"asks about {deictic.group(0).strip()!r} in context")
    if new == 0:
        return Verdict("followup", "a generic follow-up request")
    return Verdict("new_topic", "asks something unrelated to the conversation")

"""Classify a generated user turn: is it a grounded follow-up to the answer, or something else?

The probe shows a chat model `[query; answer]` and lets it write the next *user* turn. This module labels that turn
with fast, deterministic rules (stdlib only, tens of thousands of turns per second on one core):

```python
>>> classify_turn("What is 3 + 4?", "3 + 4 = 7.", "Thanks! Can you also show it for 5 + 9?").label
'followup'
>>> classify_turn("What is 3 + 4?", "3 + 4 = 7.", "Sure! Here's how to add 3 and 4: start at 3, count on 4.").label
'identity_drift'
```

Checks run from the most to the least certain: empty, degenerate (loops, gibberish), an assistant role header,
repetition of an earlier turn, the assistant's phrases and voice, thanks only, and last a user-style turn: a follow-up
when it refers to the conversation (shared content words, or "it", "your last answer" in a short request), a new topic
when not. Phrases are matched on the turn's words joined by single spaces (`" show it for 5 "`), as Python's `re`
finds a pattern that starts with a plain space far faster than one that starts with `\\b`.
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
            A short human-readable why, e.g. `"asks about it; refers to '4' from the conversation"`.
    """

    label: str
    reason: str

    @property
    def is_followup(self) -> bool:
        return self.label == "followup"


def _phrases(*alternatives: str) -> re.Pattern:  # any of them, as whole words of a space-joined word string
    return re.compile(" (?:" + "|".join(alternatives) + ")(?= )")


# Chat-template markup. Special tokens look alike across templates (`<|im_start|>`, `<|eot_id|>`, `<｜Assistant｜>`,
# `<start_of_turn>`, `</s>`, `[INST]`), so they are matched by shape; a role header is such a token next to a role.
_TOKEN = r"(?:<[|｜][^<>\n]{0,40}?[|｜]>|</?(?:s|eos|bos|pad|unk|think|[a-z]+(?:_[a-z]+)+)>|\[/?INST\])"
_ASSISTANT_ROLE = r"(?:assistant|model|bot|chatbot|gpt|ai)"
_ASSISTANT_HEADER = re.compile(
    rf"{_TOKEN}[ \t]*\n?[ \t]*{_ASSISTANT_ROLE}\b"  # <|im_start|>assistant, <start_of_turn>model
    rf"|<[|｜]\s*{_ASSISTANT_ROLE}\s*[|｜]>"  # <|assistant|>, <｜Assistant｜>
    r"|\[/INST\]"  # Llama-2 and Mistral: what follows [/INST] is the assistant's
    r"|^[ \t]*(?:#+[ \t]*)?(?:\*\*)?(?:ai[ \t]+)?assistant(?:\*\*)?[ \t]*:",  # "Assistant:", "### Assistant:"
    re.IGNORECASE | re.MULTILINE,
)
_MARKUP = re.compile(rf"{_TOKEN}(?:[ \t]*(?:user|human|prompter|system)\b)?", re.IGNORECASE)

# Words. Content words leave out function words and words too generic to show that a turn refers to *this* exchange.
_WORD = re.compile(r"[a-z0-9]+(?:[.,'][a-z0-9]+)?")
_STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before being below between
    both but by can cannot could did do does doing down during each else even ever every few for from further had has
    have having he her here hers herself him himself his how however i if in into is it its itself just let me might
    more most much must my myself no nor not now of off on once only or other ought our ours ourselves out over own
    same shall she should so some such than that the their theirs them themselves then there these they this those
    though through to too under until up upon us very was we were what when where whether which while who whom whose
    why will with would yet you your yours yourself yourselves ok okay yes yeah yep nope oh hi hello hey please pls
    thanks thank thx wow can't don't doesn't didn't isn't aren't wasn't won't wouldn't couldn't shouldn't i'm i've
    i'd i'll it's that's what's there's you're you've you'd you'll let's dont doesnt didnt cant im without within
    along across toward towards among via etc since""".split()
)
_GENERIC = """question problem answer explain explanation example help helpful tell know think thought mean meant want
    need like good great best better bad sure really actually thing way use used using make made get got give show
    write say said see look looking find try going come take lot kind sort new different another many something
    anything everything nothing someone anyone one two first second third last next still well right wrong true false
    correct simple simpler simply detail detailed information info less part step point idea work time instead maybe
    possible specific general certain basically exactly stuff whole bit little long short able following previous
    response reply text list describe description provide suggest suggestion recommend understand clarify elaborate
    expand continue rewrite case option word sentence per total half twice amount number left advice tip topic enough
    change start begin add create done found trying other others making getting having things ways include ask
    important""".split()


def _stem(word: str) -> str:
    # Crude but fast: "extensions" ~ "extension", "gravitational" ~ "gravitation", "developing" ~ "development".
    if word.endswith("'s"):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return word[:6]


_GENERIC_STEMS = frozenset(map(_stem, _GENERIC))
_STEMS: dict[str, str | None] = {}  # word -> stem of a content word, a number as written, or None


def _content(distinct: set[str]) -> set[str]:
    """Stems of the content words among `distinct` words, and its numbers (without thousands separators)."""
    if len(_STEMS) > 1 << 18:
        _STEMS.clear()
    for word in distinct.difference(_STEMS):  # a plain dict, so that `map` below looks words up in C
        stem = _stem(word) if len(word) > 2 and word not in _STOPWORDS else None
        _STEMS[word] = word.replace(",", "") if word[0].isdigit() else None if stem in _GENERIC_STEMS else stem
    stems = set(map(_STEMS.__getitem__, distinct))
    stems.discard(None)
    return stems


# The assistant's voice. Stock phrases (offers, sign-offs, self-description, solution markers) settle it.
_HELPER = _phrases(
    r"i hope (?:this|that|it|my|the)(?: [a-z']+){0,6}? (?:helps?|clarifies|answers|is useful|assists)",
    r"hope (?:this|that) helps|let me know (?:if|and)|feel free to|here to help|don't hesitate to",
    r"anything else (?:i|we|you'd|you would|you|that you)? ?(?:can|could|might|may|like|need)",
    r"(?:how|what) (?:else )?(?:can|may) i (?:help|assist|do for)|(?:can|may) i (?:help|assist) you",
    r"would you (?:like|want) me to|you(?:'d| would) like me to|would you like (?:to know|more|any|a)",
    r"what (?:else )?would you like to (?:know|do|discuss|talk about|learn)|can i (?:provide|help with) anything",
    r"do you have (?:any )?(?:other |more |further )?questions|i(?:'ve| have| was| am) (?:been )?trained (?:on|by)",
    r"as an? (?:text based )?ai|as a (?:large )?language model",
    r"i(?:'m| am) (?:just )?an? (?:ai|artificial|open source|language model|virtual|chatbot|assistant)",
    r"i (?:cannot|can't|am unable to|am not able to) (?:help you|assist you|browse|access the internet|access real)",
    r"(?:i'd|i would|i'm|i am) (?:be )?(?:happy|glad|delighted) to (?:help|assist|explain|provide)",
    r"(?:happy|glad) (?:i could |to )help|you(?:'re| are) (?:very |most |quite |so )?welcome",
    r"thanks? (?:you )?for (?:your question|asking|reaching out|the question|contacting)",
    r"the user (?:is asking|has asked|asked (?:me|about|for|how|what|whether)|wants (?:to know|me to)|is requesting)",
    r"final answer is|let's (?:break (?:it|this) down|calculate|solve|compute|denote|think step by step|work through)",
    r"(?<=^ )(?:great|good|excellent|interesting) question|that's a (?:great|good|excellent|interesting) question",
)
_HELPER_OPENING = re.compile(
    r"\W*(?:sure|certainly|of course|absolutely)\b[!,.]?\s*(?:thing[!,.]?\s*)?(?:here(?:'s| is| are)\b|"
    r"i(?:'ll| will|'d| would| can)\b|let(?:'s| me)\b)"
)
# Other cues only weigh in. Openings an answer has, but a user's may too ("Here is my code: ...").
_ANSWER_OPENING = re.compile(
    r"\W*(?:(?:sure|certainly|of course|absolutely)\b[!.,]\s*\S|here(?:'s| is| are) (?:a|an|the|some|how|what|why|"
    r"\d+|several|few|more)\b)"
)
# Explaining and advising: "you can ...", "if you ...", "here are", "additionally".
_EXPLAINS = _phrases(
    r"you(?:'ll|'d| will| can| could| should| might| may| must| need| have to| want to| would)",
    r"(?<! as )if you|keep in mind|note that|it(?:'s| is) (?:important|recommended|advisable|best|a good idea)",
    r"here (?:are|is)|there are (?:many|several|a few|some|various|two|three|a number)|depend(?:s|ing)? on",
    r"additionally|in addition|furthermore|moreover|overall|in other words|this is because",
    r"(?:this|which) (?:means|allows|helps|ensures)|based on (?:your|the information)|in summary|in conclusion",
    r"to summarize|i apologi[sz]e|i(?:'m| am) sorry (?:for|about|but|if)",  # a user may apologize too
)
# Talking about the user's things ("your eyes", "your app"), where a user talks about the assistant's ("your answer").
_YOUR_THING = _phrases(
    r"your (?!(?:answer|response|reply|explanation|example|solution|code|list|script|suggestion|approach|method|"
    r"version|story|poem|essay|joke|text|thought|opinion|view|name|training|knowledge|creator|developer|logo|own|"
    r"previous|last|first|second|third|earlier|original|above|help|advice|recommendation|idea|point|output|program|"
    r"source|data|model|capabilit|abilit|limitation|favou?rite|perspective|context|memory|purpose|instruction|rule|"
    r"strateg|work|input|feedback)[a-z]*(?= ))[a-z0-9']+",
)
_STRUCTURE = re.compile(r"^[ \t]*(?:[-*•]|\d+[.)]|#{1,4}|```|step \d+)[ \t]", re.MULTILINE)
_EQUATION = re.compile(r"\d(?: ?[a-z/%]+){0,2} ?[-+*/×x÷] ?\$?\.?\d[\d.,]*(?: ?[a-z/%]+){0,2} ?= ?\$?\d|<<[^<>]*>>")

# The user's voice. Verbs a request opens with; not the ones an answer advises with ("try", "use", "consider").
_REQUEST_VERB = (
    r"(?:add|adjust|alter|amend|answer|calculate|change|clarify|come up|compare|compose|compute|continue|convert|"
    r"correct|count|craft|create|define|describe|design|determine|dive|double|draft|draw|edit|elaborate|embed|"
    r"estimate|evaluate|expand|explain|express|extend|find|finish|fix|format|generate|give|help|identify|imagine|"
    r"implement|improve|include|incorporate|let's|list|make(?! sure)|modify|name|outline|paraphrase|pick|plot|pretend|"
    r"prove|provide|recommend|redo|reformulate|remove|rephrase|replace|repeat|reword|rework|rewrite|revise|say|"
    r"shorten|show|simplify|solve|sort|specify|suggest|summari[sz]e|take|teach|tell|translate|update|verify|walk|"
    r"write)\b"
)
# How a user turn opens when it asks without a question mark ("what is contour lines", "Explain it line by line").
_ASK_OPENING = re.compile(
    r"\W*(?:(?:and|but|so|ok|okay|then|also|now|well|great|cool|nice|perfect|yes|no|wait|hmm|please|ah|oh|thanks|"
    r"thank you)[,.!]?\s+)*(?:(?:what|why|how|when|where)(?:'s|\s+(?:is|are|was|were|do|does|did|can|could|would|will|"
    r"should|to|about|many|much|long|often|if|else|kind|type|sort|exactly))\b|(?:which|who|whom|whose|is|are|was|"
    rf"were|do|does|did|can|could|would|will|should|shall|any|now)\b|{_REQUEST_VERB})"
)
# A request further in, after some context: "... If there were 20 helmets, calculate the total."
_ASK_LATER = re.compile(rf"[.!?:;,\n]\s*(?:now |please )?{_REQUEST_VERB}")
_ASK_PHRASE = _phrases(
    r"please|pls|plz|(?:can|could|would|will) (?:you|u|we)|help me|tell me|give me|show me",
    r"i(?: would|'d) like|(?<! all )i (?:want|wanted|need|needed|wish)(?! to thank)",
    r"i(?:'m| am) (?:looking|trying|asking|wondering|curious|interested|confused|not sure)",
    r"i was (?:wondering|hoping|asking)|i meant|i have (?:a|another|one more) (?:question|problem|issue)",
    r"i (?:don't|do not|didn't|still don't) (?:understand|get|see|mean|think|know|like|want)",
    r"what about|how about|what if|and (?:for|in|with|if)|instead",
)
_FIRST_PERSON = _phrases(r"i|i'm|i've|i'd|me|my")
# A short statement still reads as the user's when it reacts: to the assistant, or to "that" ("Yes, that's correct"
# is not among them: an answer opens that way too). Pushing back does as well, unless the statement restates the
# answer, which may well say "not" itself.
_REACTS = _phrases(
    r"you|your|you're|wrong|incorrect|mistake|hmm|lol|haha|(?<=^ )(?:wait|oh)",
    r"(?:that|this|it)(?:'s| is| was| isn't| doesn't| does) (?:not|wrong|incorrect|false|untrue|bad|terrible|useless|"
    r"confusing|unclear|weird|strange|funny|boring|disappointing)",
)
_PUSHBACK = _phrases(r"no|nope|not|never|but|however|though|actually|wrong|incorrect|mistake|[a-z]+n't")
_THANKS = re.compile(
    r"\b(?:i (?:want|wanted|would like|'d like) to |no )?(?:thanks?|thx|appreciate[sd]?|grateful)\b"
    r"(?: (?:you|u|so much|a lot|very much|again|a bunch|a ton|for [^.?!\n]{0,60}))*"
)
_CLOSER = _phrases(
    r"(?:that's|that is) all(?: i (?:need|needed|wanted))?|bye|goodbye|good night|have a (?:nice|good|great) [a-z]+",
    r"take care|got it|makes sense|that (?:helps|helped|works|worked)|i (?:see|understand)|no more questions",
    r"(?:(?:this|that|it)(?:'s| is| was) (?:very |really |so )?)?(?:great|helpful|perfect|awesome|useful|clear|amazing|"
    r"good|nice|interesting|cool|wonderful|excellent|ok|okay|alright|wow|brilliant|fantastic|lovely)",
    r"i(?:'ll| will) (?:try|give|do) (?:it|that|this)(?: a try)?",
)
# Words that point back at the answer. The first kind can point nowhere else; the second does in a request that brings
# few new words of its own (in a long one "the above", "step 2" or "your answer" point into the request itself), and a
# bare pronoun does in a still shorter one.
_POINTS_BACK = _phrases(
    r"your (?:previous|earlier|last|first|second|third|above|own|original|\d+ ?(?:st|nd|rd|th))",
    r"you (?:just |have |had )?(?:(?!(?:n|f|s|sp|bl|br|proc|succ|exc|ind)eed )[a-z]+ed|said|wrote|gave|made|did|got|"
    r"put|chose|took|meant|left|found|thought|forgot|told|showed|brought|ran|set|went)",
    r"(?:why|how|where) did you|did you (?:mean|say)|(?:what|how) about|what if|(?:do|the) same (?:for|with|but|thing)",
    # "your answer" is the last one when it is reworked or judged, not when it is the next ("give your answer in ...")
    r"(?:(?:explain|rewrite|revise|change|clarify|rephrase|simplify|shorten|expand|improve|fix|correct|check|modify|"
    r"edit|update|reformulate|about|on|from) your (?:answer|response|reply|explanation|solution|suggestion|approach|"
    r"code|example|list|story|poem|essay)|your (?:answer|response|reply|explanation|solution|suggestion|approach|code)"
    r" (?:(?:is|was) (?:wrong|incorrect|not|too|confusing|unclear|missing)|isn't|wasn't|doesn't|didn't|seems|sounds|"
    r"says|said|mentions|mentioned|changes?|would change))",
)
_DEICTIC = _phrases(
    r"(?:the|this|that|these|those|your) (?:answer|response|reply|explanation|examples?|solution|code|list|script|"
    r"program|function|method|approach|version|suggestions?|story|poem|essay|article|outline|text|task|sections?|"
    r"paragraphs?|sentences?|steps?|points?|options?|ideas?|ones?)",
    r"the (?:first|second|third|fourth|fifth|last|previous|same|other|next|final|latter|former|\d+ ?(?:st|nd|rd|th))",
    r"(?:step|point|option|item|line|part|number|paragraph|example) \d+|above|aforementioned|instead|again|similar",
    r"(?<=^ )(?:and|but|so|then|also|now)",
)
_PRONOUN = _phrases(r"it|that|this|these|those|they|them|he|she|him|her|its|their")

# Degenerate text. A token reads as a word, number or run of another script, with ordinary punctuation around it.
_CLEAN_TOKEN = re.compile(
    r"(?<!\S)[\"'“‘(\[*_`]*(?:[A-Za-z\u00C0-\u024F]+(?:['’\-./][A-Za-z\u00C0-\u024F]+)*|[$€£]?\d+(?:[.,:/\-]\d+)*%?|"
    r"[^\W\d_A-Za-z]+)[\"'”’)\].,;:!?*_`]*(?!\S)"
)
_NUMBER_TOKEN = re.compile(r"(?<!\S)[$€£(]*\d+(?:[.,:/\-]\d+)*[%)]?[.,;:!?]?(?!\S)")
_NUMBER_WORD = re.compile(r" \d")
_UNPRONOUNCEABLE = re.compile(r"[b-df-hj-np-tv-xz]{5}| [b-df-hj-np-tv-xz]{4,}(?= )")
_SYMBOL = re.compile(r"[^\w\s]")
# Writing systems: Latin, Greek, Cyrillic, Hebrew, Arabic, Indic, Thai, kana and CJK, Hangul.
_SCRIPTS = [
    re.compile(f"[{r}]")
    for r in "a-zA-Z \u0370-\u03ff \u0400-\u04ff \u0590-\u05ff \u0600-\u06ff \u0900-\u0dff \u0e00-\u0e7f "
    "\u3040-\u30ff\u4e00-\u9fff \uac00-\ud7af".split()
]


def _compression(text: str) -> float:
    """Compressed over raw size: about 0.5 for prose and 0.3 for code, under 0.2 when a span repeats many times."""
    data = text.encode()
    return len(zlib.compress(data)) / len(data)


def _degenerate(text: str, words: list[str], distinct: set, joined: str, finish_reason: str | None) -> str | None:
    n_words = len(words)
    if n_words >= 8 and len(distinct) <= n_words // 8:
        return f"loops over {len(distinct)} distinct word(s)"
    # Compressing is the costly check: only for text with many repeated words (loops repeat all of theirs), or few
    # words for its length (scripts without spaces, symbols). A loop shows in the last 1000 characters.
    if len(text) >= 100 and (len(distinct) < 0.5 * n_words or n_words < len(text) / 12):
        tail = _compression(text[-min(len(text) // 2, 1000) :])
        if tail < 0.15 or _compression(text[-2000:]) < 0.22:
            return "loops: the same span repeats many times"
        if finish_reason == "length" and tail < 0.3:
            return "cut off at the token limit mid-loop"
    tokens = text.split()
    numbers = len(_NUMBER_WORD.findall(joined))
    if n_words >= 8 and numbers > 0.6 * len(tokens) and len(_NUMBER_TOKEN.findall(text)) > 0.6 * len(tokens):
        return "gibberish: a stream of numbers"
    if n_words - numbers >= 5 and _STOPWORDS.isdisjoint(words):
        if len(_UNPRONOUNCEABLE.findall(joined)) >= 0.1 * (n_words - numbers):
            return "gibberish: mostly letter strings that are not words"
    # Prose is nearly all ASCII words and spaces, one word per token: these checks only run on text that is not.
    nonspace = len(text) - text.count(" ") - text.count("\n")
    if len(joined) - n_words - 1 < 0.9 * nonspace or n_words > 1.3 * len(tokens):
        if nonspace >= 20 and len(_SYMBOL.findall(text)) > 0.5 * nonspace:
            return "gibberish: mostly symbols"
        # Token salad is a stream of fragments, or of word pieces without the function words every sentence has;
        # code and math, also full of odd tokens, come in lines or fenced blocks.
        if len(tokens) >= 15 and text.count("\n") < 0.1 * len(tokens) and "```" not in text:
            clean = len(_CLEAN_TOKEN.findall(text))
            if clean < 0.55 * len(tokens) or (clean < 0.8 * len(tokens) and _STOPWORDS.isdisjoint(words)):
                return "gibberish: token salad"
    if len(text.encode()) - len(text) >= 8 and sum(1 for script in _SCRIPTS if script.search(text)) >= 4:
        return "gibberish: mixes four or more writing systems"  # (the check runs on text with some non-ASCII)
    return None


@dataclass(frozen=True)
class _Context:
    query_words: tuple
    answer_words: tuple
    query_pairs: frozenset
    answer_pairs: frozenset
    vocabulary: frozenset
    content: frozenset
    asks_user: bool  # the answer ends by asking the user something


@functools.lru_cache(maxsize=4096)
def _context(query: str, answer: str) -> _Context:
    # A probe classifies many turns against one context: compute its features once.
    query_words = _WORD.findall(query.lower().replace("’", "'"))
    answer_words = _WORD.findall(answer.lower().replace("’", "'"))
    return _Context(
        query_words=tuple(query_words),
        answer_words=tuple(answer_words),
        query_pairs=frozenset(zip(query_words, query_words[1:])),
        answer_pairs=frozenset(zip(answer_words, answer_words[1:])),
        vocabulary=frozenset(query_words) | frozenset(answer_words),
        content=frozenset(_content(set(query_words)) | _content(set(answer_words))),
        asks_user="?" in answer[-300:],
    )


def _repetition(words: list[str], distinct: set, ctx: _Context) -> str | None:
    for name, source in (("the query", ctx.query_words), ("the answer", ctx.answer_words)):
        if len(words) == len(source) and tuple(words) == source:
            return f"repeats {name} word for word"
    # Each word new to the conversation breaks a word pair: with 30% of the words new, 70% of the pairs cannot be
    # copies (and the pairs need not be built).
    if len(words) < 4 or len(distinct - ctx.vocabulary) > 0.3 * len(words):
        return None
    pairs = set(zip(words, words[1:]))
    # A short question may borrow a phrase of a long answer ("Why does it determine the energy levels?"): only a turn
    # of 8 words or more, or a short answer, can be copied.
    sources = (("the query", ctx.query_pairs), ("the answer", ctx.answer_pairs))
    for name, source in sources if len(words) >= 8 or len(ctx.answer_pairs) < 8 else sources[:1]:
        shared = len(pairs & source) / len(pairs)
        if shared >= 0.7:
            return f"repeats {name} ({shared:.0%} of its word pairs)"
    return None


def _refers(shared: list[str]) -> str:
    return f"refers to {', '.join(map(repr, sorted(shared)[:3]))} from the conversation"


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
    header = _ASSISTANT_HEADER.search(user_turn) if markup or "ssistant" in user_turn.lower() else None
    text = (_MARKUP.sub(" ", user_turn) if markup else user_turn).strip()
    if not text:
        return Verdict("empty", "nothing but whitespace or special tokens")
    # A user turn of 256 tokens is about 1,500 characters: longer text is judged on its start, and its end is only
    # checked for a loop.
    if len(text) > 2000:
        if _compression(text[-1000:]) < 0.15:
            return Verdict("degenerate", "loops: the same span repeats many times")
        text = text[:2000]
    lower = text.lower().replace("’", "'")
    words = _WORD.findall(lower)
    joined, distinct = f" {' '.join(words)} ", set(words)
    reason = _degenerate(text, words, distinct, joined, finish_reason)
    if reason:
        return Verdict("degenerate", reason)
    if header:
        return Verdict("identity_drift", f"opens an assistant header {header.group(0).strip()!r}")
    ctx = _context(query, answer)
    reason = _repetition(words, distinct, ctx)
    if reason:
        return Verdict("repetition", reason)

    helper = _HELPER.search(joined) or _HELPER_OPENING.match(lower)
    if helper:
        return Verdict("identity_drift", f"talks as the assistant: {helper.group(0).strip()!r}")
    if "\\boxed" in lower or "####" in lower:
        return Verdict("identity_drift", "marks a final answer like a solution")

    # Thanks set aside, does the turn ask for anything? And does it explain, advise, list or solve like an answer?
    thanked = None
    if "thank" in lower or "thx" in lower or "apprecia" in lower or "grateful" in lower:
        thanked = _THANKS.search(lower)
    rest = _THANKS.sub(" ", lower) if thanked else lower
    questions = min(rest.count("?") + rest.count("？"), 3)
    opening = 2 * bool(_ASK_OPENING.match(rest))
    n_words = len(words)
    assistant = (
        len(_EXPLAINS.findall(joined))
        + (min(len(_YOUR_THING.findall(joined)), 2) if " your " in joined else 0)
        + lower.count("however,")
        + 2 * bool(_ANSWER_OPENING.match(lower))
        + (min(len(_STRUCTURE.findall(lower)), 3) if "\n" in lower else 0)
        + (min(len(_EQUATION.findall(lower)), 3) if "=" in lower or "<<" in lower else 0)
        + n_words // 80  # users rarely write at length; answers do
    )
    # The costlier user cues are only looked for when the cheap ones do not settle the voice.
    later = phrases = first_person = 0
    if assistant >= questions + opening or not (questions or opening):
        later = bool(_ASK_LATER.search(rest))
        phrases = min(len(_ASK_PHRASE.findall(joined)), 2)
        first_person = bool(_FIRST_PERSON.search(joined))
    asks = questions or opening or later or phrases
    if not asks and n_words <= 60 and (thanked or not _CLOSER.sub(" ", joined).strip()):
        if not _PUSHBACK.search(f" {' '.join(_WORD.findall(rest))} "):  # "Thanks, but that's wrong" is not
            return Verdict("acknowledgement", "only thanks or closes")
    user = questions + opening + later + phrases + first_person
    if assistant > user:
        return Verdict("identity_drift", "explains or solves like the assistant")

    content = _content(distinct)
    shared = content & ctx.content
    new = len(content) - len(shared)
    # Small numbers recur by chance (a new word problem shares its 2s and 10s with the last one): they do not ground,
    # though they are not new either. One shared word grounds a short turn; a long one must share one word in eight.
    shared = [w for w in shared if len(w) > 2 or not w[0].isdigit()]
    grounded = len(shared) >= max(1.0, 0.12 * len(content))

    if not asks:
        if n_words > 60:
            return Verdict("identity_drift", "a long statement that asks nothing, written like an answer")
        reacts = user or _REACTS.search(joined)
        if grounded:
            if reacts and n_words <= 30:
                return Verdict("followup", "reacts to the answer; " + _refers(shared))
            return Verdict("identity_drift", "restates instead of asking; " + _refers(shared))
        if ctx.asks_user and n_words <= 40:
            return Verdict("followup", "answers the assistant's question")
        if not (reacts or _PUSHBACK.search(joined)):
            return Verdict("identity_drift", "states facts like an answer, asks nothing")
        if new <= 2:
            return Verdict("followup", "reacts to the answer")
        return Verdict("new_topic", "a statement unrelated to the conversation")

    if grounded:
        return Verdict("followup", "asks about it; " + _refers(shared))
    deictic = _POINTS_BACK.search(joined) or new <= 3 and _DEICTIC.search(joined)
    deictic = deictic or new <= 2 and _PRONOUN.search(joined)
    if deictic:
        return Verdict("followup", f"asks about {deictic.group(0).strip()!r} in context")
    if new == 0:
        return Verdict("followup", "a generic follow-up request")
    return Verdict("new_topic", "asks something unrelated to the conversation")

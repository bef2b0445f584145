"""Degenerate text: loops, streams of numbers or symbols, token salad, mixed scripts (checked by `classify_turn`)."""

import re
import zlib

from .cues import STOPWORDS

# A token reads as a word, number or run of another script, with ordinary punctuation around it.
CLEAN_TOKEN = re.compile(
    r"(?<!\S)[\"'“‘(\[*_`]*(?:[A-Za-z\u00C0-\u024F]+(?:['’\-./][A-Za-z\u00C0-\u024F]+)*|[$€£]?\d+(?:[.,:/\-]\d+)*%?|"
    r"[^\W\d_A-Za-z]+)[\"'”’)\].,;:!?*_`]*(?!\S)"
)
FRAGMENT = re.compile(r"(?<!\S)[^\w\s]*([a-z]{1,2})[^\w\s]*(?!\S)")  # a token of one or two lowercase letters
NUMBER_TOKEN = re.compile(r"(?<!\S)[$€£(]*\d+(?:[.,:/\-]\d+)*[%)]?[.,;:!?]?(?!\S)")
NUMBER_WORD = re.compile(r" \d")
UNPRONOUNCEABLE = re.compile(r"[b-df-hj-np-tv-xz]{5}| [b-df-hj-np-tv-xz]{4,}(?= )")
SYMBOL = re.compile(r"[^\w\s]")
# Writing systems: Latin, Greek, Cyrillic, Hebrew, Arabic, Indic, Thai, kana and CJK, Hangul.
_RANGES = (
    "a-zA-Z", "\u0370-\u03ff", "\u0400-\u04ff", "\u0590-\u05ff", "\u0600-\u06ff", "\u0900-\u0dff", "\u0e00-\u0e7f",
    "\u3040-\u30ff\u4e00-\u9fff", "\uac00-\ud7af",
)
SCRIPTS = [re.compile(f"[{r}]") for r in _RANGES]


def compression(text: str) -> float:
    """Compressed over raw size: about 0.5 for prose and 0.3 for code, under 0.2 when a span repeats many times."""
    data = text.encode()
    # An 8 KiB window holds the 2,000 characters compressed at most: the default's result at half its cost.
    return len(zlib.compress(data, 6, 13)) / len(data)


def degenerate(text: str, words: list[str], distinct: set, joined: str, finish_reason: str | None) -> str | None:
    n_words = len(words)
    if n_words >= 8 and len(distinct) <= n_words // 8:
        return f"loops over {len(distinct)} distinct word(s)"
    # Compressing is the costly check: only for text with many repeated words (loops repeat all of theirs), or few
    # words for its length (scripts without spaces, symbols). A loop shows in the last 1000 characters.
    if len(text) >= 100 and (len(distinct) < 0.5 * n_words or n_words < len(text) / 12):
        tail = compression(text[-min(len(text) // 2, 1000) :])
        # A loop with a period too long to show in the tail shows in 2000 characters, and leaves a tail under 0.5.
        if tail < 0.15 or (tail < 0.5 and compression(text[-2000:]) < 0.22):
            return "loops: the same span repeats many times"
        if finish_reason == "length" and tail < 0.3:
            return "cut off at the token limit mid-loop"
    tokens = text.split()
    numbers = len(NUMBER_WORD.findall(joined))
    if n_words >= 8 and numbers > 0.6 * len(tokens) and len(NUMBER_TOKEN.findall(text)) > 0.6 * len(tokens):
        return "gibberish: a stream of numbers"
    if (
        n_words - numbers >= 5
        and STOPWORDS.isdisjoint(words)
        and len(UNPRONOUNCEABLE.findall(joined)) >= 0.1 * (n_words - numbers)
    ):
        return "gibberish: mostly letter strings that are not words"
    # Prose is nearly all ASCII words and spaces, one word per token: these checks only run on text that is not.
    nonspace = len(text) - text.count(" ") - text.count("\n")
    if len(joined) - n_words - 1 < 0.9 * nonspace or n_words > 1.3 * len(tokens):
        if nonspace >= 20 and len(SYMBOL.findall(text)) > 0.5 * nonspace:
            return "gibberish: mostly symbols"
        # Token salad is a stream of fragments, or of word pieces without the function words every sentence has;
        # code and math, also full of odd tokens, come in lines or fenced blocks.
        if len(tokens) >= 10 and text.count("\n") < 0.1 * len(tokens) and "```" not in text:
            clean = len(CLEAN_TOKEN.findall(text))
            if len(tokens) >= 15 and (
                clean < 0.55 * len(tokens) or (clean < 0.8 * len(tokens) and STOPWORDS.isdisjoint(words))
            ):
                return "gibberish: token salad"
            # Word pieces: in prose nearly every word of one or two letters is a function word ("a", "of", "it").
            pieces = [piece for piece in FRAGMENT.findall(text) if piece not in STOPWORDS]
            if len(pieces) >= 0.3 * len(tokens):
                return "gibberish: token salad of word pieces"
    if len(text.encode()) - len(text) >= 8 and sum(1 for script in SCRIPTS if script.search(text)) >= 4:
        return "gibberish: mixes four or more writing systems"  # (the check runs on text with some non-ASCII)
    return None

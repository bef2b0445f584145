"""GSM8K: grade-school math word problems with a numeric final answer (https://huggingface.co/datasets/openai/gsm8k).

Example problem:

    Question: Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for
    her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg.
    How much in dollars does she make every day at the farmers' market?
    Answer: Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.
    She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer's market.
    #### 18

`extract_answer` and `is_correct` score chat-model outputs (which rarely write `####`, and often `\\boxed{}`);
`strict_match` and `flexible_extract` reproduce lm-evaluation-harness's two GSM8K filters, so that numbers can be
set beside published ones.
"""

import re

from .base import Example
from .jsonl import BadRow, require

# A number as people write it: optional minus, thousands groups or plain digits, optional decimals. Not preceded by
# a word character, so "x2" and the "3" of "5-3" (a range, not a negative) stay apart.
_NUMBER = re.compile(r"(?<![\w.])(?:-(?=\d))?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
# The rest of the line after the marker, read in a lookahead so a later marker on the same line is found too.
_HASHES = re.compile(r"####(?=([^\n]*))")
_ANSWER_IS = re.compile(r"(?:final answer|answer is)(?=([^\n]*))", re.IGNORECASE)
_CALCULATOR = re.compile(r"<<[^>]*>>")


def _clean(text: str) -> str:
    # `$`, `%` and LaTeX spacing never change the value; `{,}` is LaTeX's thousands separator.
    for old, new in (("\\$", ""), ("$", ""), ("\\%", ""), ("%", ""), ("{,}", ","), ("\\!", ""), ("\\,", "")):
        text = text.replace(old, new)
    return text


def _number(text: str, last: bool = False) -> str | None:
    numbers = _NUMBER.findall(_clean(text))
    if not numbers:
        return None
    return (numbers[-1] if last else numbers[0]).replace(",", "")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start == -1:
        return None
    begin = start + len("\\boxed{")
    depth = 1
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
    return None  # unbalanced: the output was cut off inside the box


def extract_answer(text: str, *, last_number: bool = True) -> str | None:
    """The final answer of a model output, or `None` when it states none.

    By priority: the last `\\boxed{...}`, the last `#### N`, the last "answer is N" / "Final answer: N", then (unless
    `last_number=False`: an answer must be stated as one) the last number in the text. Think blocks are dropped
    first; `$`, `%`, thousands separators and a trailing period are dropped from the number.

    Args:
        text (`str`): the model output.

    Returns:
        `str` or `None`: the number as written (`"18.00"` stays `"18.00"`; compare with `is_correct`), or the
        boxed text when the box holds no number.
    """
    text = _THINK.sub("", text)
    # With thinking on, the template's prompt opens the think block, so the output holds only its end.
    text = text.rpartition("</think>")[2]
    # A think block never closed (cut off at the token limit) holds no final answer.
    text = text.partition("<think>")[0]

    boxed = _last_boxed(text)
    if boxed and boxed.strip():
        return _number(boxed, last=True) or boxed.strip()
    for pattern in (_HASHES, _ANSWER_IS):
        for tail in reversed(pattern.findall(text)):
            if (number := _number(tail)) is not None:
                return number
    return _number(text, last=True) if last_number else None


def _as_float(text: str) -> float | None:
    try:
        return float(_clean(text).replace(",", "").strip().rstrip("."))
    except ValueError:
        return None


def is_correct(output_text: str, gold: str) -> bool:
    """Whether the final answer of `output_text` equals `gold` as a number (`18 == 18.00`), else as a string.

    Args:
        output_text (`str`): the model output.
        gold (`str`): the gold final answer, e.g. `"18"` or `"1,000"`.
    """
    predicted = extract_answer(output_text)
    if predicted is None:
        return False
    a, b = _as_float(predicted), _as_float(gold)
    if a is not None and b is not None:
        return a == b
    return predicted.strip().lower() == gold.strip().lower()


# lm-evaluation-harness `gsm8k` (lm_eval/tasks/gsm8k/gsm8k.yaml): two regex filters, then `exact_match` with
# `ignore_case` after deleting these patterns from both sides. "18.00" is not "18" there.
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORE = [",", "\\$", "(?s).*#### ", "\\.$"]
_INVALID = "[invalid]"  # lm-eval's fallback when nothing matches; never equal to a gold number


def _lm_eval_exact_match(prediction: str, gold: str) -> bool:
    for pattern in _IGNORE:
        prediction, gold = re.sub(pattern, "", prediction), re.sub(pattern, "", gold)
    return prediction.lower() == gold.lower()


def strict_match(output_text: str, gold: str) -> bool:
    """lm-eval's GSM8K `strict-match`: the first `#### N`, compared as a string with `gold`."""
    match = _STRICT.search(output_text)
    return _lm_eval_exact_match(match.group(1).strip() if match else _INVALID, gold)


def flexible_extract(output_text: str, gold: str) -> bool:
    """lm-eval's GSM8K `flexible-extract`: the last number-like span, compared as a string with `gold`."""
    matches = _FLEXIBLE.findall(output_text)
    # Like lm-eval's RegexFilter with group_select=-1: the last match, and of its groups the first non-empty one.
    prediction = next((group for group in matches[-1] if group), _INVALID).strip() if matches else _INVALID
    return _lm_eval_exact_match(prediction, gold)


def score(outputs: list[str], golds: list[str]) -> dict[str, float]:
    """Mean accuracy of `outputs` against `golds`: ours (`accuracy`) and lm-eval's strict and flexible ones."""
    if len(outputs) != len(golds) or not outputs:
        raise ValueError(f"score needs as many outputs as golds, at least one (got {len(outputs)} and {len(golds)})")
    n = len(outputs)
    return {
        "accuracy": sum(map(is_correct, outputs, golds)) / n,
        "accuracy_strict": sum(map(strict_match, outputs, golds)) / n,
        "accuracy_flexible": sum(map(flexible_extract, outputs, golds)) / n,
    }


def to_example(row: dict, index: int, where: str, prefix: str = "gsm8k") -> Example:
    """One `{question, answer}` row, `answer` being the reference solution ending in `#### N`."""
    question = require(row, "question", where)
    solution = require(row, "answer", where)
    if "####" not in solution:
        raise BadRow(f"{where}: field 'answer' has no final '#### <number>' line (GSM8K solution format)")
    gold = solution.rpartition("####")[2].strip().replace(",", "")
    if not gold:
        raise BadRow(f"{where}: field 'answer' has nothing after '####'")
    return Example(
        id=f"{prefix}-{index}",
        query=question,
        # The `<<9*2=18>>` calculator annotations are tool markup, not text an assistant shows a user.
        answer=_CALCULATOR.sub("", solution),
        gold=gold,
        meta={"solution": solution},
    )

"""MT-Bench: 80 two-turn questions over 8 categories (FastChat `question.jsonl`, hub `HuggingFaceH4/mt_bench_prompts`).

Example: turn 1 "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural
experiences and must-see attractions.", turn 2 "Rewrite your previous response. Start every sentence with the
letter A." The probe asks turn 1; the benchmark's own turn 2 is kept as the reference follow-up.
"""

from .base import Example
from .jsonl import BadRow, require


def to_example(row: dict, where: str) -> Example:
    """One FastChat `{question_id, category, turns}` row, or a hub row, which names these `prompt_id` and `prompt`."""
    question_id = require(row, "prompt_id" if "prompt_id" in row else "question_id", where)
    field = "prompt" if "prompt" in row else "turns"
    turns = require(row, field, where)
    if not isinstance(turns, list) or not all(isinstance(turn, str) and turn.strip() for turn in turns):
        raise BadRow(f"{where}: field {field!r} must be a list of non-empty strings, one per user turn")
    return Example(
        id=f"mtbench-{question_id}",
        query=turns[0],
        reference_followup=turns[1] if len(turns) > 1 else None,
        meta={"category": require(row, "category", where)},
    )

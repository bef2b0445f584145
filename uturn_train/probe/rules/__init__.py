"""The rules: a fast, offline labeller of user turns (stdlib only).

`classify.py` labels a turn (`LABELS`), with its English cues in `cues.py`, word-problem cues in `word_problem.py`,
degenerate text in `degenerate.py` and references back in `references.py`; `grounding.py` is the one place the
grounded decision is defined; `text.py` holds the words and conversation features both read.
"""

from .classify import LABELS, Verdict, classify_turn
from .grounding import Grounding, derangement, ground_rows, is_grounded

__all__ = ["LABELS", "Grounding", "Verdict", "classify_turn", "derangement", "ground_rows", "is_grounded"]

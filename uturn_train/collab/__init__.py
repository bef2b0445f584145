"""Collaboration: multi-turn conversations between the model under test and a simulated partner, scored by success.

The probe asks whether a model writes a grounded follow-up; this asks whether that matters: does the model succeed
at tasks where interaction pays? Two families (`tasks.py`): **info_gap** (the model is the assistant, the question
lacks a number only the partner knows) and **peer_check** (the model is the *user* after another agent's answer,
right or wrong; a reaction that questions the wrong step gets it fixed). The partner (`partners.py`) is an oracle that
speaks lines written by the task's generator (the testbed's world, `uturn_train.testbed.collab`; GSM8K's reference
solutions, `gsm8k.py`), or a chat model (the model itself, another local model, or one behind an OpenAI-compatible
server). `dialogue.py` runs the turns in batches and scores each conversation; `uturn_train.commands.collab` is
`uturn collab`.

    uturn collab --model testbed --task testbed --limit 100 --out outputs/collab_testbed
    uturn collab --model smollm2-135m-instruct --task gsm8k --data ../shared/data/gsm8k/test.jsonl --limit 50
"""

from .dialogue import CollabRun, CollabSettings, run_collab
from .partners import ModelPartner, OraclePartner
from .tasks import FAMILIES, CollabTask, load_collab_tasks

__all__ = ["FAMILIES", "CollabRun", "CollabSettings", "CollabTask", "ModelPartner", "OraclePartner",
           "load_collab_tasks", "run_collab"]

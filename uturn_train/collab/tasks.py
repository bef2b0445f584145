"""Collaboration tasks: a jsonl of conversations to continue, with what the partner knows and the gold answer.

One row per task:

    {"id": "testbed-3-info_gap", "family": "info_gap", "gold": "5",
     "messages": [{"role": "user", "content": "Jonas buys some scarves that cost $9 each. ..."}],
     "brief": "You are a user who needs help ...",          # a model partner's instructions (info_gap)
     "oracle": {"reveal": "The number of scarves is 5.", "asks_for": "the number of scarves"}}
    {"id": "testbed-3-peer_check", "family": "peer_check", "gold": "5", "answer_right": false,
     "messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "... #### 6"}],
     "oracle": {"wrong_step": 1, "values": ["6"], "operands": ["50", "45"], "ordinal": "second",
                "fix": "Let me redo the second step: ... #### 5", "solution": "... #### 5"}}

`info_gap` opens with the user's question (the model answers as the assistant); `peer_check` opens with a question and
another agent's answer (the model writes the next *user* turn). `oracle` holds the oracle partner's lines
([`~uturn_train.collab.partners.OraclePartner`]); `wrong_step` is null when the answer is right, and then only
`solution` is needed; `asks_for` (info_gap, the missing quantity's name) only by a partner that reveals to a question
naming it (`OraclePartner(named=True)`, online RL).
"""

from dataclasses import dataclass
from pathlib import Path

from ..io import read_jsonl

FAMILIES = ("info_gap", "peer_check")
# Whose turns the model under test writes; the partner writes the others.
MODEL_ROLE = {"info_gap": "assistant", "peer_check": "user"}
_OPENS_WITH = {"info_gap": ["user"], "peer_check": ["user", "assistant"]}
_ORACLE_KEYS = {"info_gap": ("reveal",), "peer_check": ("wrong_step", "solution")}
_SLIP_KEYS = ("values", "operands", "ordinal", "fix")


@dataclass
class CollabTask:
    id: str
    family: str
    gold: str
    messages: list[dict]
    oracle: dict | None = None
    brief: str | None = None
    answer_right: bool | None = None

    @property
    def model_role(self) -> str:
        return MODEL_ROLE[self.family]


def _problem(row: dict) -> str | None:
    """Why a row is not a task, or None."""
    family = row.get("family")
    if family not in FAMILIES:
        return f"family {family!r} is not one of {', '.join(FAMILIES)}"
    for key in ("id", "gold"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            return f"`{key}` must be a non-empty string"
    messages = row.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                 for m in messages):
        return "`messages` must be a list of {role, content}"
    if [m.get("role") for m in messages] != _OPENS_WITH[family]:
        return f"a {family} task opens with the roles {_OPENS_WITH[family]}, got {[m.get('role') for m in messages]}"
    oracle = row.get("oracle")
    if oracle is not None:
        slip = family == "peer_check" and oracle.get("wrong_step") is not None
        missing = [k for k in _ORACLE_KEYS[family] + (_SLIP_KEYS if slip else ()) if k not in oracle]
        if missing:
            return f"`oracle` lacks {missing} (needed by the oracle partner for {family})"
    if family == "peer_check" and not isinstance(row.get("answer_right"), bool):
        return "a peer_check task needs `answer_right` (true or false)"
    return None


def load_collab_tasks(path: str | Path | list[dict], families: list[str] | tuple[str, ...] = FAMILIES,
                      limit: int | None = None, option: str = "--data", oracle: bool = False) -> list[CollabTask]:
    """The tasks of `families` in `path` (a jsonl, or rows already read), the first `limit` of each family, in file
    order; with `oracle`, each must hold the oracle partner's lines.

    Raises:
        `ValueError`: naming the file, line and field of a bad row, or `option` when the file is missing or holds no
            task of a requested family.
    """
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise ValueError(f"families {list(families)}: choose among {', '.join(FAMILIES)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 task per family, got {limit}")
    if isinstance(path, list):  # rows drawn in memory (`collab.gsm8k`)
        rows, path = path, f"the {len(path)} rows drawn"
        for i, row in enumerate(rows):
            if problem := _problem(row):
                raise ValueError(f"{option}: task {i}: {problem}")
    elif not Path(path).is_file():
        raise ValueError(f"{option} {path} is not a file: pass a collaboration jsonl (`--task testbed` writes the "
                         "testbed's)")
    else:
        rows = read_jsonl(path, check=_problem)
    seen, tasks, counts = set(), [], dict.fromkeys(families, 0)
    for row in rows:
        if row["id"] in seen:
            raise ValueError(f"{path}: duplicate task id {row['id']!r}")
        seen.add(row["id"])
        family = row["family"]
        if family in counts and (limit is None or counts[family] < limit):
            counts[family] += 1
            tasks.append(CollabTask(row["id"], family, row["gold"], row["messages"], row.get("oracle"),
                                    row.get("brief"), row.get("answer_right")))
    if oracle and (bare := next((t.id for t in tasks if t.oracle is None), None)):
        raise ValueError(f"{option} {path}: task {bare} has no `oracle` lines, which the oracle partner speaks; "
                         "pick a model partner (uturn collab --partner self or a model)")
    empty = [f for f, n in counts.items() if n == 0]
    if empty:
        raise ValueError(f"{option} {path} holds no {' or '.join(empty)} task: drop it from --families")
    return tasks

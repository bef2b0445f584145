"""Every user turn the project has labelled by reading, joined with its texts: what the trained judge learns from and
is measured on (`tests/data/README.md` has the rubric and each file's provenance).

- `smollm2_turns.jsonl`: SmolLM2-135M-Instruct's turns on GSM8K, OASST, MT-Bench and IFEval (480).
- `oasst_next_turn_labels.jsonl`: people's real next turns in the 100 OASST trees (380), keyed by message id.
- `read_turns.jsonl`: the turns read for the judge: SmolLM2 on every probe task, and on GSM8K and OASST before and
  after collaboration SFT and DPO, the testbed before and after training, MT-Bench's second turns after the model's
  own first answers, and hard cases built from real prompts (the query restated, another unknown of the story,
  requests that fit any answer, a follow-up placed after another answer to the same query).

Texts that come from `../shared/data` are never stored: a row names its prompt by `task` and `id`, and `query`,
`answer` (in the heldout setting; `answer_from` names another prompt whose answer it is) and `user_turn` (people's
turns) are joined from the data. Model-written and
constructed texts are stored in the row.

The split is by conversation, so that the turns after one context stay on one side: for OASST the parity of
`sha256(message_tree_id)` (the people's turns' split since issue 10), otherwise that of `sha256(task:id)`.
"""

import hashlib
import json
from collections import defaultdict
from pathlib import Path

from ...io import read_jsonl
from ...tasks import load_task
from ..rules.classify import LABELS

ROOT = Path(__file__).resolve().parents[3]  # the repository
DATA = ROOT / "tests" / "data"
FILES = ("smollm2_turns.jsonl", "oasst_next_turn_labels.jsonl", "read_turns.jsonl")
TASK_DATA = {"gsm8k": "gsm8k/test.jsonl", "oasst": "oasst/en_100_tree.jsonl", "mtbench": "mt_bench/question.jsonl",
             "ifeval": "ifeval/input_data.jsonl", "ifbench": "ifbench/IFBench_test.jsonl"}


def _half(key: str) -> str:
    return ("dev", "test")[hashlib.sha256(key.encode()).digest()[0] % 2]


def conversation_split(task: str, prompt_id: str, example=None) -> str:
    """`dev` or `test` by conversation (see the module docstring)."""
    if task == "oasst" and example is not None:
        return _half(example.meta["message_tree_id"])
    return _half(f"{task}:{prompt_id}")


def _rows(path: Path) -> list[dict]:
    rows = read_jsonl(path)  # by line, not str.splitlines(): model text may hold U+2028, which that also breaks at
    if path.name == "oasst_next_turn_labels.jsonl":  # people's turns: ids and labels only
        rows = [{"row": f"people:oasst-{r['message_id']}", "source": "people", "task": "oasst",
                 "id": f"oasst-{r['message_id']}", "setting": "heldout", "temperature": None, "label": r["label"],
                 "grounded": r.get("grounded"), "note": r.get("note", "")} for r in rows]
    for r in rows:
        r.setdefault("source", "smollm2")
        r["file"] = path.name
    return rows


def load_reading(shared_data: Path, files: tuple[str, ...] = FILES, data: Path = DATA) -> list[dict]:
    """The labelled rows of `files` (those present), each with `query`, `answer` and `user_turn` joined, `group` (the
    probe run it came from: source, task, temperature) and `split` by conversation.

    Raises:
        ValueError: a row with an unknown label, grounded on a non-follow-up, missing `grounded`, or naming a prompt the
            data lacks, with its file and row.
    """
    rows = [r for name in files if (data / name).exists() for r in _rows(data / name)]
    examples = {}
    for task in sorted({r["task"] for r in rows} & set(TASK_DATA)):
        examples[task] = {e.id: e for e in load_task(task, str(shared_data / TASK_DATA[task]))}
    for r in rows:
        where = f"{r['file']}: row {r['row']}"
        if r["label"] not in LABELS:
            raise ValueError(f"{where}: label {r['label']!r} is not one of {LABELS}")
        if r.get("grounded") is None:
            raise ValueError(f"{where}: no `grounded`; read the turn again and add it")
        if r["grounded"] and r["label"] != "followup":
            raise ValueError(f"{where}: grounded but labelled {r['label']}; only a follow-up can be grounded")
        example = examples.get(r["task"], {}).get(r["id"])
        if r["task"] in TASK_DATA and example is None:
            raise ValueError(f"{where}: no prompt {r['id']!r} in {shared_data / TASK_DATA[r['task']]}")
        if r.get("answer_from"):  # a real answer of another path of the conversation (a sibling of this turn's answer)
            source = examples[r["task"]].get(r["answer_from"])
            if source is None:
                raise ValueError(f"{where}: no prompt {r['answer_from']!r} (answer_from) in the data")
            r["answer"] = source.answer
        for key, joined in (("query", "query"), ("answer", "answer"), ("user_turn", "reference_followup")):
            if r.get(key) is None and example is not None:
                r[key] = getattr(example, joined)
        if not all(isinstance(r[k], str) for k in ("query", "answer", "user_turn")):
            raise ValueError(f"{where}: query, answer and user_turn must be stored or joined from the data")
        r["split"] = conversation_split(r["task"], r["id"], example)
        r["group"] = f"{r['source']}:{r['task']}:T{r['temperature']}"
    return rows


def pair_contexts(rows: list[dict]) -> None:
    """Adds `other_query` and `other_answer` to every row: the mismatched context of the grounded decision, another
    conversation of the same group: the next of the group's distinct contexts in the order of their sha256 (a
    derangement, as the probe pairs the prompts of one run, that moves only a few pairs when rows are added, so that
    cached features stay valid); a group of one context takes the next context of all rows."""
    def order(contexts):
        return sorted(contexts, key=lambda c: hashlib.sha256(json.dumps(c).encode()).hexdigest())

    groups = defaultdict(list)
    for r in rows:
        groups[r["group"]].append(r)
    everywhere = order(dict.fromkeys((r["query"], r["answer"]) for r in rows))
    for members in groups.values():
        contexts = order(dict.fromkeys((r["query"], r["answer"]) for r in members))
        ring = contexts if len(contexts) > 1 else everywhere
        other = {c: ring[(ring.index(c) + 1) % len(ring)] for c in contexts}
        for r in members:
            r["other_query"], r["other_answer"] = other[r["query"], r["answer"]]

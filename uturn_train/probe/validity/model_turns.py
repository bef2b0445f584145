"""How well the probe labels a real chat model's user turns, against labels given by reading them.

```bash
python eval/real_model_validity.py                 # per-source table, grounded precision/recall, rates by reading
python eval/real_model_validity.py --errors dev    # also list the dev split's mistakes (never the test split's)
```

The turns are SmolLM2-135M-Instruct's (`tests/data/smollm2_turns.jsonl`, rubric and split in `tests/data/README.md`):
GSM8K, MT-Bench and IFEval in the self setting, OASST in the heldout setting, greedy and T=1.0. Queries (and OASST's
real answers) are joined by id from `../shared/data`, never stored. The grounded decision runs as the probe runs it:
per task and temperature, each prompt's mismatched context another prompt's, paired with seed 0.
"""

import hashlib
from collections import defaultdict
from pathlib import Path

from ...io import read_jsonl
from ...tasks import load_task
from ..rules.classify import LABELS, classify_turn
from ..rules.grounding import ground_rows

ROOT = Path(__file__).resolve().parents[3]  # the repository
LABELS_FILE = ROOT / "tests" / "data" / "smollm2_turns.jsonl"
SHARED_DATA = ROOT.parent / "shared" / "data"
DATA = {"gsm8k": "gsm8k/test.jsonl", "oasst": "oasst/en_100_tree.jsonl", "mtbench": "mt_bench/question.jsonl",
        "ifeval": "ifeval/input_data.jsonl"}


def split_of(task: str, prompt_id: str) -> str:
    """`"dev"` or `"test"`, fixed by the prompt, so that the turns of one conversation stay together."""
    return ("dev", "test")[hashlib.sha256(f"{task}:{prompt_id}".encode()).digest()[0] % 2]


def load(shared_data: Path = SHARED_DATA, labels_file: Path = LABELS_FILE) -> list[dict]:
    """The labelled rows, each with its `query` (and a heldout row's `answer`) joined from `shared_data`."""
    rows = read_jsonl(labels_file)
    examples = {}
    for task in sorted({r["task"] for r in rows}):
        examples[task] = {e.id: e for e in load_task(task, str(shared_data / DATA[task]))}
    for i, row in enumerate(rows, 1):
        where = f"{labels_file}:{i} ({row.get('row')})"
        if row["label"] not in LABELS:
            raise ValueError(f"{where}: label {row['label']!r} is not one of {LABELS}")
        if row["grounded"] and row["label"] != "followup":
            raise ValueError(f"{where}: grounded but labelled {row['label']}; only a follow-up can be grounded")
        split = split_of(row["task"], row["id"])
        if row["split"] != split:
            raise ValueError(f"{where}: split {row['split']!r}, but its prompt belongs to {split}")
        example = examples[row["task"]].get(row["id"])
        if example is None:
            raise ValueError(f"{where}: no prompt {row['id']!r} in {shared_data / DATA[row['task']]}")
        row["query"] = example.query
        if row["setting"] == "heldout":
            row["answer"] = example.answer
    return rows


def predict(rows: list[dict], seed: int = 0, scorer=None) -> None:
    """Adds `predicted` (the classifier's label) and `predicted_grounded` (the grounded decision, confirmed by
    `scorer` when given) to every row."""
    groups = defaultdict(list)
    for row in rows:
        verdict = classify_turn(row["query"], row["answer"], row["user_turn"], row.get("finish_reason"))
        row["predicted"], row["reason"] = verdict.label, verdict.reason
        groups[row["task"], row["temperature"]].append(row)
    for group in groups.values():
        for row, g in zip(group, ground_rows(group, seed, scorer=scorer)):
            row["predicted_grounded"], row["grounded_reason"] = g.grounded, g.reason


def _prf(pairs: list[tuple[bool, bool]]) -> dict:
    tp = sum(g and p for g, p in pairs)
    predicted, gold = sum(p for _, p in pairs), sum(g for g, _ in pairs)
    precision = tp / predicted if predicted else None
    recall = tp / gold if gold else None
    f1 = 2 * precision * recall / (precision + recall) if precision and recall else None
    return {"precision": precision, "recall": recall, "f1": f1, "gold": gold, "predicted": predicted}


def scores(rows: list[dict]) -> dict[str, dict]:
    """Precision, recall and F1 of every label present, and of `grounded`."""
    out = {label: _prf([(r["label"] == label, r["predicted"] == label) for r in rows]) for label in LABELS}
    out = {label: s for label, s in out.items() if s["gold"] or s["predicted"]}
    out["grounded"] = _prf([(bool(r["grounded"]), bool(r["predicted_grounded"])) for r in rows])
    return out


def rates(rows: list[dict], split: str | None = None) -> dict[str, dict]:
    """Per task and temperature: follow-up and grounded rates by reading and by the probe (of one split, or all)."""
    out = {}
    rows = [r for r in rows if split in (None, r["split"])]
    for (task, t), group in sorted(_by(rows, lambda r: (r["task"], r["temperature"])).items()):
        n = len(group)
        out[f"{task} T={t:g}" + (f" ({split})" if split else "")] = {
            "n": n,
            "followup (read)": sum(r["label"] == "followup" for r in group) / n,
            "followup (probe)": sum(r["predicted"] == "followup" for r in group) / n,
            "grounded (read)": sum(bool(r["grounded"]) for r in group) / n,
            "grounded (probe)": sum(bool(r["predicted_grounded"]) for r in group) / n,
        }
    return out


def _by(rows, key):
    groups = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    return groups


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def table(rows: list[dict]) -> str:
    """Markdown: one line per source (task and split, then the pooled splits) and label."""
    lines = ["| source | label | precision | recall | F1 | gold turns | predicted |", "|---|---|---|---|---|---|---|"]
    by_source = _by(rows, lambda r: (r["task"], r["split"]))
    sources = {f"{task} {split}": group for (task, split), group in sorted(by_source.items())}
    sources |= {f"all {split}": group for split, group in sorted(_by(rows, lambda r: r["split"]).items())}
    for name, group in sources.items():
        for label, s in scores(group).items():
            lines.append(f"| {name} | {label} | {_f(s['precision'])} | {_f(s['recall'])} | {_f(s['f1'])} | {s['gold']} "
                         f"| {s['predicted']} |")
    return "\n".join(lines)

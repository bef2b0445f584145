"""How well `classify_turn` labels real users' next turns, per source: precision, recall and F1 of every label.

```bash
python eval/classifier_validity.py                      # the per-source table
python eval/classifier_validity.py --errors dev         # also list the dev half's mistakes (never the test half's)
```

Sources, all read from `../shared/data` (its README), never copied:
- **OASST dev / OASST test**: every real next user turn after a real assistant answer of the OASST trees, with the
  label a person gave it by reading it (`tests/data/oasst_next_turn_labels.jsonl`, rubric in `tests/data/README.md`).
  The trees are split in halves by a hash of their id: rules were changed looking at the dev half only.
- **MT-Bench**: the 80 expert-written second turns, follow-ups by construction, after turn 1 with no answer. Test only.
- **constructed dev / test**: negatives built by code from the same half's conversations: a sibling answer of the
  same query pasted as the user turn (identity_drift), the query or the answer repeated, verbatim or with small slips
  (repetition), another tree's opening query or the next GSM8K problem (new_topic), whitespace and special tokens
  (empty), loops, token salad, keyboard mash, symbol and number streams (degenerate).

*test* pools OASST test, MT-Bench and constructed test: the set the acceptance test (`tests/probe/test_classify.py`)
holds to F1 >= 0.90 on follow-ups and >= 0.85 on every other label with at least 20 gold turns.

A second table gives grounded follow-up rates (`uturn_train/probe/rules/grounding.py`): real users' follow-ups in
their own conversations, `GENERIC_QUESTIONS` after real conversations, and on arithmetic (GSM8K problems and their
worked solutions) questions that name the answer's own number or change the query's own quantity, next to generic ones.
"""

import hashlib
import itertools
import json
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from ...tasks import load_task
from ..rules import cues
from ..rules.classify import LABELS, classify_turn
from ..rules.grounding import ground_rows
from .perturbations import GENERIC_QUESTIONS  # one list, shared with `uturn validate`

ROOT = Path(__file__).resolve().parents[3]  # the repository
LABELS_FILE = ROOT / "tests" / "data" / "oasst_next_turn_labels.jsonl"
SHARED_DATA = ROOT.parent / "shared" / "data"


@dataclass(frozen=True)
class Item:
    query: str
    answer: str
    turn: str
    gold: str
    id: str = ""


def half(tree_id: str) -> str:
    """`"dev"` or `"test"`, fixed by the tree's id, so that the turns of one conversation tree stay together."""
    return ("dev", "test")[hashlib.sha256(tree_id.encode()).digest()[0] % 2]


def slightly_edited(text: str) -> str:
    """Drops every 12th word and changes every 15th, as a model copying a turn with small slips would."""
    words = text.split()
    return " ".join("very" if i % 15 == 7 else w for i, w in enumerate(words) if i % 12 != 5)


TOKENS = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>", "<end_of_turn>", "<|im_start|>", "[INST]", "<eos>"]
SYMBOLS = "!@#$%^&*()_+{}|:<>?~`-=[]\\;',./"


def _degenerate(rng: random.Random, e, kind: int) -> str:
    sentences = [s for s in e.answer.replace("\n", " ").split(". ") if len(s.split()) >= 4] or [e.query]
    if kind == 0:  # a sentence of the context in a loop
        return (rng.choice(sentences).strip() + ". ") * rng.randint(8, 30)
    if kind == 1:  # a short phrase of the user's turn looping
        words = e.reference_followup.split()[:4] or ["the"]
        return " ".join(words * rng.randint(12, 40))
    if kind == 2:  # token salad: word pieces of the answer, shuffled, with stray symbols
        text = e.answer.replace("\n", " ")
        pieces = [text[i : i + rng.randint(1, 5)] for i in range(0, min(len(text), 400), 3)]
        rng.shuffle(pieces)
        return " ".join(p.strip() + rng.choice(["", "", "(", "_", "'", ".)", "];", "-->"]) for p in pieces[:40])
    if kind == 3:  # keyboard mash
        return " ".join("".join(rng.choice("qwertyuiopasdfghjklzxcvbnm") for _ in range(rng.randint(3, 10)))
                        for _ in range(rng.randint(8, 20)))
    if kind == 4:  # a stream of numbers
        return " ".join(str(rng.randint(0, 999)) for _ in range(rng.randint(10, 40)))
    return "".join(rng.choice(SYMBOLS) for _ in range(rng.randint(30, 120)))  # symbols


def _copies(text: str, source: str) -> bool:
    """Whether half of the word pairs of `text` are in `source`."""
    pairs = [tuple(text.lower().split()[i : i + 2]) for i in range(len(text.split()) - 1)]
    source_words = source.lower().split()
    return sum(pair in set(itertools.pairwise(source_words)) for pair in pairs) >= 0.5 * len(pairs)


def _empty(rng: random.Random) -> str:
    parts = [rng.choice(TOKENS + [" ", "\n", "\t"]) for _ in range(rng.randint(0, 4))]
    return rng.choice(["", " ", "\n"]).join(parts)


def constructed(examples: list, others: list[str], gsm8k: list, seed: int) -> list[Item]:
    """One negative of each kind per distinct (query, answer) context of `examples`; `others` are opening queries
    of other trees, `gsm8k` GSM8K examples whose next problem is a new topic after them."""
    rng = random.Random(seed)
    contexts = list({(e.query, e.answer): e for e in examples}.values())
    siblings = defaultdict(list)  # the answers to one query, in order
    for e in contexts:
        siblings[e.meta["message_tree_id"], e.query].append(e.answer)
    items = []
    for i, e in enumerate(contexts):
        answers = siblings[e.meta["message_tree_id"], e.query]
        sibling = answers[(answers.index(e.answer) + 1) % len(answers)]
        # A short answer ("I think php") reads as well as a user's turn, and one that copies this answer repeats it:
        # neither is an answer-like text in the wrong voice.
        if len(sibling.split()) >= 20 and not _copies(sibling, e.answer):
            items.append(Item(e.query, e.answer, sibling, "identity_drift", e.id))
        copies = [e.query, e.answer, slightly_edited(e.query), slightly_edited(e.answer)]
        copy = copies[i % 4] if len(copies[i % 4].split()) >= 12 else copies[i % 2]
        items.append(Item(e.query, e.answer, copy, "repetition", e.id))
        other = others[(i * 7 + 3) % len(others)]
        if other != e.query:
            items.append(Item(e.query, e.answer, other, "new_topic", e.id))
        items.append(Item(e.query, e.answer, _empty(rng), "empty", e.id))
        items.append(Item(e.query, e.answer, _degenerate(rng, e, i % 6), "degenerate", e.id))
    for i, e in enumerate(gsm8k[:-1]):
        items.append(Item(e.query, e.answer, gsm8k[i + 1].query, "new_topic", e.id))
    return items


def sources(shared_data: Path = SHARED_DATA) -> dict[str, list[Item]]:
    """The labelled turns of every source, by name (see the module docstring)."""
    gold = {}
    with open(LABELS_FILE, encoding="utf-8") as f:
        for row in map(json.loads, f):
            if row["label"] not in LABELS:
                raise ValueError(f"{LABELS_FILE}: {row['message_id']} has label {row['label']!r}, not one of {LABELS}")
            gold[row["message_id"]] = row["label"]
    oasst = load_task("oasst", str(shared_data / "oasst" / "en_100_tree.jsonl"))
    missing = [e.id for e in oasst if e.id.removeprefix("oasst-") not in gold]
    if missing:
        raise ValueError(f"{LABELS_FILE} has no label for {len(missing)} OASST turn(s), e.g. {missing[0]}")
    gsm8k = load_task("gsm8k", str(shared_data / "gsm8k" / "test.jsonl"))
    mtbench = load_task("mtbench", str(shared_data / "mt_bench" / "question.jsonl"))
    out = {}
    for name, seed, problems in (("dev", 0, gsm8k[:101]), ("test", 1, gsm8k[101:202])):
        examples = [e for e in oasst if half(e.meta["message_tree_id"]) == name]
        out[f"OASST {name}"] = [
            Item(e.query, e.answer, e.reference_followup, gold[e.id.removeprefix("oasst-")], e.id) for e in examples
        ]
        # Opening queries with a subject ("hello!" and "Who are you?" have none to be new).
        openings = sorted({e.query for e in examples if not e.meta["history"] and len(e.query.split()) >= 5})
        out[f"constructed {name}"] = constructed(examples, openings, list(problems), seed)
    out["MT-Bench"] = [Item(e.query, "", e.reference_followup, "followup", e.id) for e in mtbench]
    out["test"] = out["OASST test"] + out["MT-Bench"] + out["constructed test"]
    return out


def _rate(rows: list[dict], seed: int, keep=None, scorer=None) -> float:
    groundings = ground_rows(rows, seed, scorer=scorer)
    kept = [g.grounded for i, g in enumerate(groundings) if keep is None or keep(i)]
    return sum(kept) / len(kept)


def grounded_rates(shared_data: Path = SHARED_DATA, seed: int = 0, problems: int = 400) -> dict[str, float]:
    """Grounded follow-up rates of real follow-ups, generic questions and arithmetic cases (module docstring)."""
    by_source = sources(shared_data)
    real = by_source["OASST dev"] + by_source["OASST test"]
    contexts = list(dict.fromkeys((item.query, item.answer) for item in real))
    gsm8k = load_task("gsm8k", str(shared_data / "gsm8k" / "test.jsonl"), limit=problems)
    arithmetic = [(e.query, e.answer) for e in gsm8k]
    rows = [{"query": item.query, "answer": item.answer, "user_turn": item.turn} for item in real]
    out = {"real follow-ups, own conversation (OASST)": _rate(rows, seed, lambda i: real[i].gold == "followup")}
    for name, pool in (("OASST", contexts), ("GSM8K", arithmetic)):
        rows = [{"query": q, "answer": a, "user_turn": turn} for q, a in pool for turn in GENERIC_QUESTIONS]
        out[f"generic questions after {name} conversations"] = _rate(rows, seed)
    for turn in ("Why do you multiply in the first step?", "Could you explain the steps again?"):
        out[f"{turn!r} (GSM8K)"] = _rate([{"query": q, "answer": a, "user_turn": turn} for q, a in arithmetic], seed)
    # The answer's own number, and the query's own quantity changed ("What if it was 8 apples instead of 5?").
    rows = [{"query": e.query, "answer": e.answer, "user_turn": f"How did you get {e.gold}?"}
            for e in gsm8k if e.gold.isdigit() and int(e.gold) >= 13]  # small numbers recur by chance: not specific
    out["'How did you get <its answer, 13 or more>?' (GSM8K)"] = _rate(rows, seed)
    rows = []
    for e in gsm8k:
        quantity = next((m for m in re.finditer(r"\b(\d+) ([a-z]{4,})\b", e.query)
                         if m[2] not in cues.STOPWORDS and m[2] not in cues.GENERIC), None)
        if quantity:
            number, noun = quantity.groups()
            turn = f"What if it was {int(number) + 3} {noun} instead of {number}?"
            rows.append({"query": e.query, "answer": e.answer, "user_turn": turn})
    out["'What if it was <n+3> <noun> instead of <n>?' (GSM8K)"] = _rate(rows, seed)
    return out


def scorer_rates(scorer, shared_data: Path = SHARED_DATA, seed: int = 0) -> dict[str, float]:
    """With `scorer` confirming grounded turns (`probe/labelers/scorer.py`): the rate of real users' OASST follow-ups
    and of generic questions after OASST conversations."""
    real = sources(shared_data)
    real = real["OASST dev"] + real["OASST test"]
    rows = [{"query": item.query, "answer": item.answer, "user_turn": item.turn} for item in real]
    out = {"real follow-ups, own conversation (OASST), with the scorer":
           _rate(rows, seed, lambda i: real[i].gold == "followup", scorer)}
    contexts = list(dict.fromkeys((item.query, item.answer) for item in real))
    rows = [{"query": q, "answer": a, "user_turn": turn} for q, a in contexts for turn in GENERIC_QUESTIONS]
    out["generic questions after OASST conversations, with the scorer"] = _rate(rows, seed, scorer=scorer)
    return out


def scores(items: list[Item]) -> dict[str, dict]:
    """Precision, recall, F1 and support of every label that is gold or predicted in `items`, plus `errors`."""
    pairs = [(item.gold, classify_turn(item.query, item.answer, item.turn).label) for item in items]
    gold, predicted, hits = Counter(g for g, _ in pairs), Counter(p for _, p in pairs), Counter()
    for g, p in pairs:
        hits[g] += g == p
    out = {}
    for label in LABELS:
        if gold[label] or predicted[label]:
            precision = hits[label] / predicted[label] if predicted[label] else 0.0
            recall = hits[label] / gold[label] if gold[label] else 0.0
            f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
            out[label] = {"precision": precision, "recall": recall, "f1": f1, "support": gold[label]}
    out["errors"] = [(item, p) for item, (g, p) in zip(items, pairs) if g != p]
    return out


def table(by_source: dict[str, list[Item]]) -> str:
    """A markdown table: one row per source and label, P / R / F1 and the number of gold turns."""
    lines = ["| source | label | precision | recall | F1 | gold turns |", "|---|---|---|---|---|---|"]
    for name, items in by_source.items():
        for label, s in scores(items).items():
            if label != "errors":
                lines.append(f"| {name} | {label} | {s['precision']:.3f} | {s['recall']:.3f} | {s['f1']:.3f} | "
                             f"{s['support']} |")
    return "\n".join(lines)

"""On-policy preference pairs for the **user** turn, plus accuracy anchors, for DPO (`uturn mine`, `collab_dpo.py`).

For each prompt the model answers greedily (the probe's self setting), writes the next user turn greedily and samples
`mine_samples` more at each temperature of `mine_temperatures` above 0; the classifier labels every turn
([`~uturn_train.probe.runner.run_probe`] does all of this). The chosen side of a pair is a follow-up *grounded*
(by the rules: against three mismatched contexts, `CONTROLS`; by the trained judge with `mine_labeler` `trained`, the
default off the testbed: its own decision), never one that fits any answer: such a question ("Can you explain it
like I'm 10?") is easy to learn and says nothing about this conversation, so a follow-up that is not grounded is a
rejected side, with identity drift, repetition, new topic, empty and degenerate turns. Each distinct rejected turn
(greedy first) is paired with one of the prompt's grounded follow-ups, in turn. Without a sampled one, and with
`mine_reference`, the data's real follow-up is chosen (`chosen_source: "reference"`), if it is a grounded follow-up
of the model's own answer too (one written for another answer may not be). Acknowledgements are neither side. The
chosen set is kept diverse: one (normalised) text is the chosen side of at most `mine_max_chosen_share` of the
follow-up pairs, so no single question dominates. Pairing every bad turn, not only the greedy one, matters: a model's
greedy turns tend to share one template, and DPO lowers such a rejected set cheaply by moving away from that
template's details while keeping its opening; diverse rejected turns share only the opening.

Anchor pairs keep accuracy from drifting while the user turn moves: on prompts with a gold answer (GSM8K format),
each wrong answer among the greedy and `mine_samples` sampled ones is rejected against a correct one (else, with
`mine_reference`, the reference solution), `anchor_ratio` anchor pairs per follow-up pair.

Pairs are in TRL's plain-text preference format: `prompt` is the exact text the model was given (the user-turn prompt
ends with the template's user header, the anchor prompt with the assistant header), `chosen`/`rejected` the completion
text without end-of-turn token: DPOTrainer appends eos (`<|im_end|>` for Qwen3.5), which ends both turns.

Mined by `collab_dpo.py` before training, or beforehand with `uturn mine` (`commands/mine.py`).
"""

import json
import logging
import math
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, replace
from itertools import cycle
from pathlib import Path

from ..distributed import gathered_if_zero3, map_sharded
from ..generation import generate
from ..io import atomic_dir, ensure_writable_dir, write_json
from ..probe.record import flat_figures
from ..probe.rules.grounding import grounded_in, mismatched_contexts, normalize_turn
from ..probe.settings import JUDGE_FIELDS, OFFLINE_LABELERS, labeler_for, prefixed
from ..tasks import gsm8k
from ..tasks.base import Example
from .data import check_source, prompt_examples

logger = logging.getLogger(__name__)

REJECTABLE = ("identity_drift", "repetition", "new_topic", "empty", "degenerate")
CARD = "mining_card.json"


@dataclass
class MiningArguments(prefixed("mine_", exclude=("setting", *JUDGE_FIELDS), max_new_tokens=64,
                               answer_max_new_tokens=256)):
    """Where the prompts come from and how pairs are made; `mine_*` decoding fields are [`ProbeSettings`]'s.

    Mining runs the probe's self setting: the model answers greedily, then writes a greedy user turn and
    `mine_samples` sampled ones at each temperature of `mine_temperatures` above 0.

    Args:
        mine_source (`str`, *optional*, defaults to `"testbed"`): where the prompts come from: `testbed` (the built
            testbed's `conversations.jsonl`, never the held-out probe problems; the recipes fill in `mine_data`),
            `gsm8k` (`mine_data` file, default the hub's train split), `oasst` (tree file, default the hub's validation
            split) or `conversations` (a `{"messages"}` jsonl: the first user turn is the query, the next assistant
            turn the reference answer, the user turn after it the reference follow-up).
        mine_max_chosen_share (`float`, *optional*, defaults to `0.02`): the largest share of the follow-up pairs whose
            chosen side is one and the same text (normalised; at least 2 pairs), so that no question dominates.
        anchor_ratio (`float`, *optional*, defaults to `0.25`): anchor pairs per follow-up pair; 0 disables them.
            Anchor answers are sampled at the highest of `mine_temperatures`, `mine_samples` per prompt.
        mine_labeler (`str`, *optional*, defaults to `"auto"`): who labels the mined turns and decides which are
            grounded: `rules`, `trained` (the trained judge) or `auto` (the rules on the testbed, the judge elsewhere).
    """

    mine_source: str = field(default="testbed", metadata={"help": "testbed, gsm8k, oasst or conversations."})
    mine_data: str | None = field(default=None, metadata={"help": "Data file; default per source."})
    mine_limit: int | None = field(default=256, metadata={"help": "Prompts to mine."})
    mine_reference: bool = field(default=True, metadata={"help": "Fall back on the data's follow-ups/solutions."})
    anchor_ratio: float = field(default=0.25, metadata={"help": "Anchor pairs per follow-up pair (0 = none)."})
    mine_max_chosen_share: float = field(default=0.02, metadata={"help": "Most pairs one chosen text may have."})
    mine_labeler: str = field(default="auto", metadata={
        "help": "auto (rules on the testbed, the trained judge elsewhere), rules or trained."})

    def __post_init__(self):
        super().__post_init__()
        check_source(self.mine_source, self.mine_data, option="mine")
        if self.anchor_ratio < 0:
            raise ValueError(f"anchor_ratio must be >= 0, got {self.anchor_ratio}")
        if self.mine_labeler not in OFFLINE_LABELERS:
            raise ValueError(f"mine_labeler {self.mine_labeler!r} is not one of {OFFLINE_LABELERS} (an LLM judge is "
                             "not offered for mining: every sampled turn would be a request)")
        if not 0 < self.mine_max_chosen_share <= 1:
            raise ValueError(f"mine_max_chosen_share must be in (0, 1], got {self.mine_max_chosen_share}")


def mining_examples(args: MiningArguments) -> list[Example]:
    return prompt_examples(args.mine_source, args.mine_data, args.mine_limit, option="mine")


def _pairs(ex: Example, kind: str, prompt: str, chosen: list[tuple], rejected: list[tuple]) -> list[dict]:
    """Every distinct rejected item against the chosen ones in turn; items are `(text, label, source)`."""
    if not chosen:
        return []
    first = {}
    for item in rejected:  # the first of identical texts (a sample may repeat the greedy turn)
        first.setdefault(item[0], item)
    rejected = list(first.values())
    return [{"id": ex.id, "kind": kind, "prompt": prompt, "chosen": c[0], "rejected": r[0], "chosen_label": c[1],
             "rejected_label": r[1], "chosen_source": c[2], "rejected_source": r[2]}
            for c, r in zip(cycle(chosen), rejected)]


def _source(row: dict) -> str:
    return "greedy" if row["temperature"] == 0 else "sample"


def followup_pairs(ex: Example, answer: str, turns: list[dict], controls: list[tuple[str, str]],
                   use_reference: bool, judged: bool = False) -> list[dict]:
    """The follow-up pairs of one prompt from its labelled user turns (greedy first, then the samples).

    `turns` carry `label` and `grounded` (see [`~uturn_train.probe.runner.run_probe`]). With `judged` (the trained
    judge labelled them) a follow-up is chosen if the judge called it grounded; else by the rules: `controls` are
    mismatched contexts (query, answer) of other prompts, and a follow-up is chosen if it is grounded against all of
    them. Other follow-ups are rejected. The reference follow-up is checked by the rules.
    """
    grounded = [r["label"] == "followup" and (r["grounded"] is True if judged else
                                              grounded_in(ex.query, answer, r["user_turn"], controls)) for r in turns]
    rejected = [(r["user_turn"], r["label"] if r["label"] != "followup" else "ungrounded_followup", _source(r))
                for r, g in zip(turns, grounded) if r["label"] in REJECTABLE or (r["label"] == "followup" and not g)]
    chosen = [(r["user_turn"], "grounded_followup", _source(r)) for r, g in zip(turns, grounded) if g]
    if (not chosen and rejected and use_reference and ex.reference_followup
            and grounded_in(ex.query, answer, ex.reference_followup, controls)):
        chosen = [(ex.reference_followup, "grounded_followup", "reference")]
    return _pairs(ex, "followup", turns[0]["user_prompt"], chosen, rejected) if turns else []


def diverse(pairs: list[dict], max_share: float) -> list[dict]:
    """`pairs` without those whose chosen text (normalised) already is the chosen side of `max_share` of them (at
    least 2), in order: no single follow-up may dominate what DPO is taught to prefer."""
    cap = max(2, math.floor(max_share * len(pairs)))
    seen, kept = Counter(), []
    for pair in pairs:
        text = normalize_turn(pair["chosen"])
        if seen[text] < cap:
            seen[text] += 1
            kept.append(pair)
    return kept


def anchor_pairs(ex: Example, answer: dict, samples: list, use_reference: bool) -> list[dict]:
    """The anchor pairs of one prompt from its greedy and sampled answers."""
    texts = [(answer["answer"], "greedy"), *((g.text, "sample") for g in samples)]
    chosen = [(t, "correct", source) for t, source in texts if gsm8k.is_correct(t, ex.gold)]
    rejected = [(t, "wrong", source) for t, source in texts if not gsm8k.is_correct(t, ex.gold)]
    if not chosen and use_reference and ex.answer:
        chosen = [(ex.answer, "correct", "reference")]
    return _pairs(ex, "anchor", answer["answer_prompt"], chosen, rejected)


def mine_pairs(model, tokenizer, examples: list[Example], args: MiningArguments, state=None) -> tuple[list[dict], dict]:
    """Mine preference pairs (see the module docstring); every process of `state` must call this.

    Returns:
        `tuple[list[dict], dict]`: the pairs (identical on every rank) and the card (counts and settings).
    """
    from ..probe.runner import run_probe

    start = time.perf_counter()
    settings = replace(args.settings(), labeler=labeler_for(args.mine_labeler, args.mine_source))
    with gathered_if_zero3(model):
        run = run_probe(model, tokenizer, examples, settings, state=state)
        turns = defaultdict(list)
        for row in run.rows:
            turns[row["index"]].append(row)
        contexts = [(examples[a["index"]].query, a["answer"]) for a in run.answers]
        controls = mismatched_contexts(contexts, settings.seed)
        pairs = [p for a in run.answers for p in followup_pairs(
            examples[a["index"]], a["answer"], turns[a["index"]],
            controls[a["index"]],
            args.mine_reference, judged=settings.labeler == "trained")]
        pairs = diverse(pairs, args.mine_max_chosen_share)
        n_anchors = round(args.anchor_ratio * len(pairs))
        temperature = max(settings.temperatures, default=0.0)
        if n_anchors and temperature == 0:
            logger.warning("no anchor pairs: anchor answers are sampled, and mine_temperatures has none above 0")
            n_anchors = 0
        # A prompt yields at most one anchor per wrong answer (k + 1), fewer when most are right: sample answers for
        # twice the fewest prompts that could do, rather than for all of them (answers are the long part of mining).
        graded = [a for a in run.answers if a["gold"] is not None][: math.ceil(2 * n_anchors / (settings.samples + 1))]

        def sample_answers(shard, rank):
            return generate(model, tokenizer, [a["answer_prompt"] for a in shard],
                            max_new_tokens=settings.answer_max_new_tokens, temperature=temperature,
                            num_samples=settings.samples, batch_size=settings.batch_size,
                            seed=settings.seed + 7 + 1000 * rank, desc="anchor answers",
                            disable_progress=rank != 0)

        sampled = map_sharded(graded, sample_answers, state) if graded else []
    anchors = [p for a, samples in zip(graded, sampled)
               for p in anchor_pairs(examples[a["index"]], a, samples, args.mine_reference)]
    if len(anchors) < n_anchors:
        logger.warning("mined %d anchor pairs of the %d asked for (anchor_ratio %g)", len(anchors), n_anchors,
                       args.anchor_ratio)
    pairs += anchors[:n_anchors]
    rates = flat_figures(run.summary)
    chosen = [normalize_turn(p["chosen"]) for p in pairs if p["kind"] == "followup"]
    card = {
        "n_prompts": len(examples), "n_pairs": len(pairs),
        "kind": dict(Counter(p["kind"] for p in pairs)),
        "chosen_label": dict(Counter(f"{p['kind']}:{p['chosen_label']}" for p in pairs)),
        "rejected_label": dict(Counter(f"{p['kind']}:{p['rejected_label']}" for p in pairs)),
        "chosen_source": dict(Counter(f"{p['kind']}:{p['chosen_source']}" for p in pairs)),
        "rejected_source": dict(Counter(f"{p['kind']}:{p['rejected_source']}" for p in pairs)),
        "labeler": settings.labeler,
        "chosen_followups": {  # every chosen follow-up is grounded (by the labeler) by construction
            "source": dict(Counter(p["chosen_source"] for p in pairs if p["kind"] == "followup")),
            "distinct_share": len(set(chosen)) / max(1, len(chosen)),
            "most_common": Counter(chosen).most_common(3),
        },
        "policy": {"accuracy": run.summary["accuracy"], **rates,
                   "categories": {f"T{s['temperature']:g}": s["categories"] for s in run.summary["settings"]}},
        "settings": asdict(args),
        "seconds": round(time.perf_counter() - start, 1),
    }
    if not any(p["kind"] == "followup" for p in pairs):
        raise ValueError(
            f"no follow-up pair mined from {len(examples)} prompts (rates "
            f"{', '.join(f'{k} {v:.2f}' for k, v in rates.items() if v is not None)}): no grounded follow-up to "
            "choose; raise mine_limit or mine_samples, or allow reference follow-ups (mine_reference) with a source "
            "that has them"
        )
    return pairs, card


def save_pairs(pairs: list[dict], card: dict, out: str | Path) -> Path:
    """`save_to_disk` with the card inside the folder (`mining_card.json`); replaces `out` only when complete."""
    from datasets import Dataset

    out = Path(out).expanduser()
    ensure_writable_dir(out.parent, "output folder")
    with atomic_dir(out, replace=True) as tmp:
        Dataset.from_list(pairs).save_to_disk(str(tmp))
        write_json(tmp / CARD, card)
    return out


def load_pairs(path: str | Path):
    """A folder written by [`save_pairs`] (or any preference data set saved with `save_to_disk`)."""
    from datasets import load_from_disk

    path = Path(path).expanduser()
    if not (path / "dataset_info.json").exists():
        raise ValueError(f"{path} is not a data set saved with `save_to_disk` (no dataset_info.json); mine one with "
                         "`uturn mine --out DIR`")
    dataset = load_from_disk(str(path))
    missing = {"prompt", "chosen", "rejected"} - set(dataset.column_names)
    if missing:
        raise ValueError(f"{path} lacks the preference column(s) {sorted(missing)}")
    return dataset


def resumable_pairs(path: str | Path, model: str, args: MiningArguments):
    """The pairs a run mined before it was interrupted, if `path` holds them: a resumed run trains on the same pairs.

    Returns None when there are none; raises if they were mined for another model or with other settings.
    """
    path = Path(path)
    if not (path / CARD).exists():
        return None
    card = json.loads((path / CARD).read_text())
    now = {"model": model, **json.loads(json.dumps(asdict(args)))}  # as the card stores them
    then = {"model": card.get("model"), **card.get("settings", {})}
    changed = [f"{k}: {then.get(k)!r} then, {v!r} now" for k, v in now.items() if then.get(k) != v]
    if changed:
        raise ValueError(f"{path} holds pairs mined with other settings ({'; '.join(changed)}): resume with the "
                         "settings of its mining card, or delete the folder to mine again")
    return load_pairs(path)

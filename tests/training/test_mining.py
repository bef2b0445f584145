import json

import pytest
from helpers.conversations import conversations

from uturn_train.tasks.base import Example
from uturn_train.tasks.gsm8k import is_correct
from uturn_train.training.mining import (
    REJECTABLE,
    MiningArguments,
    followup_pairs,
    load_pairs,
    mine_pairs,
    mining_examples,
    save_pairs,
)

PROMISED = {"prompt", "chosen", "rejected", "kind", "chosen_label", "rejected_label", "chosen_source", "id"}


@pytest.fixture(scope="module")
def conversations_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mine-data") / "conversations.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in conversations(12)))
    return path


@pytest.fixture(scope="module")
def tiny(tiny_qwen_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_qwen_dir), AutoTokenizer.from_pretrained(tiny_qwen_dir)


def _args(data, **overrides):
    kwargs = dict(mine_source="conversations", mine_labeler="rules", mine_data=str(data), mine_limit=12, mine_samples=3,
                  mine_max_new_tokens=12, mine_answer_max_new_tokens=16, anchor_ratio=0.5)
    return MiningArguments(**{**kwargs, **overrides})


@pytest.fixture(scope="module")
def mined(tiny, conversations_file, tmp_path_factory):
    model, tokenizer = tiny
    args = _args(conversations_file)
    pairs, card = mine_pairs(model, tokenizer, mining_examples(args), args)
    return save_pairs(pairs, card, tmp_path_factory.mktemp("mined") / "pairs"), card


def test_mined_pairs_have_the_promised_columns_and_labels(mined, conversations_file):
    out, card = mined
    dataset = load_pairs(out)
    assert PROMISED <= set(dataset.column_names)
    followups = [r for r in dataset if r["kind"] == "followup"]
    anchors = [r for r in dataset if r["kind"] == "anchor"]
    assert followups and anchors
    assert {r["chosen_label"] for r in followups} == {"grounded_followup"}
    assert all(r["rejected_label"] in (*REJECTABLE, "ungrounded_followup") for r in followups)
    source = [json.loads(line)["messages"] for line in conversations_file.read_text().splitlines()]
    for r in followups:
        assert r["prompt"].endswith("<|im_end|>\n<|im_start|>user\n")
        assert r["chosen_source"] in ("greedy", "sample", "reference")
        if r["chosen_source"] == "reference":  # flagged, and really the data's follow-up
            assert r["chosen"] == source[int(r["id"].rsplit("-", 1)[1])][2]["content"]
    for r in anchors:
        gold = r["chosen"].rpartition("####")[2].strip() if r["chosen_source"] == "reference" else None
        assert r["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        if gold:
            assert not is_correct(r["rejected"], gold)
    assert len(anchors) == round(0.5 * len(followups))
    assert len({(r["id"], r["rejected"]) for r in dataset}) == len(dataset)  # each bad turn or answer once
    # The card counts what the data set holds, and keeps the settings.
    assert card["kind"] == {"followup": len(followups), "anchor": len(anchors)}
    assert sum(card["chosen_source"].values()) == len(dataset) and card["settings"]["mine_samples"] == 3
    assert sum(card["chosen_followups"]["source"].values()) == len(followups)
    assert card["chosen_followups"]["distinct_share"] == len({r["chosen"] for r in followups}) / len(followups)
    assert json.loads((out / "mining_card.json").read_text())["n_pairs"] == len(dataset)
    assert [p.name for p in out.parent.iterdir()] == ["pairs"]  # no temporary folder left behind


def test_dpo_trainer_appends_eos_once(mined, tiny, tmp_path):
    from trl import DPOConfig, DPOTrainer

    model, tokenizer = tiny
    args = DPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    dataset = DPOTrainer(model=model, args=args, train_dataset=load_pairs(mined[0]),
                         processing_class=tokenizer).train_dataset
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for row in dataset:
        for ids in (row["chosen_ids"], row["rejected_ids"]):
            assert ids[-1] == eos and ids.count(eos) == 1


def test_every_bad_turn_is_rejected_against_a_grounded_followup():
    query, answer = "Tom has 35 apples and buys 48 more. How many apples now?", "35 + 48 = 83 apples."
    ex = Example(id="x", query=query, answer=answer, reference_followup="Where do the 83 apples come from?")
    controls = [("What is the capital of France?", "Paris is the capital of France."),
                ("Name a prime number above 10.", "11 is a prime number.")]

    def row(label, t, text):
        return {"label": label, "temperature": t, "user_turn": text, "user_prompt": "P"}

    turns = [row("new_topic", 0.0, "Next: 5 * 6?"), row("identity_drift", 1.0, "Sure!"),
             row("followup", 1.0, "Why 83?"), row("followup", 1.0, "Can you explain it simply?"),
             row("new_topic", 1.0, "Next: 5 * 6?"), row("acknowledgement", 1.0, "Thanks!")]
    pairs = followup_pairs(ex, answer, turns, controls, use_reference=True)
    # Greedy first; a sampled copy of the greedy turn is not a second pair; a follow-up that fits any answer is
    # rejected, not chosen; thanks are neither side.
    fields = ("chosen", "chosen_source", "rejected", "rejected_label", "rejected_source")
    assert [tuple(p[f] for f in fields) for p in pairs] == [
        ("Why 83?", "sample", "Next: 5 * 6?", "new_topic", "greedy"),
        ("Why 83?", "sample", "Sure!", "identity_drift", "sample"),
        ("Why 83?", "sample", "Can you explain it simply?", "ungrounded_followup", "sample"),
    ]
    pairs = followup_pairs(ex, answer, turns[:2], controls, use_reference=True)
    assert {(p["chosen"], p["chosen_source"]) for p in pairs} == {("Where do the 83 apples come from?", "reference")}
    assert followup_pairs(ex, answer, turns[:2], controls, use_reference=False) == []
    # A reference follow-up that is not grounded in the model's answer is not taken, nor one that fits any answer.
    for reference in ("What is the capital of Peru?", "Could you explain that more simply?"):
        unrelated = Example(id="y", query=query, answer=answer, reference_followup=reference)
        assert followup_pairs(unrelated, answer, turns[:2], controls, use_reference=True) == []
    assert followup_pairs(ex, answer, [row("acknowledgement", 0.0, "Thanks!")], controls, use_reference=True) == []


def test_no_single_chosen_text_dominates():
    from uturn_train.training.mining import diverse

    pairs = [{"chosen": "Why 83?" if i % 2 else f"Why {i}?", "rejected": "x"} for i in range(200)]
    kept = diverse(pairs, max_share=0.02)
    assert sum(p["chosen"] == "Why 83?" for p in kept) == 4  # 2% of 200
    assert sum(p["chosen"] != "Why 83?" for p in kept) == 100  # the others are all distinct: all kept


def test_no_pairs_is_a_clear_error(tiny, conversations_file, monkeypatch):
    # The random tiny model writes a grounded turn on some CPUs' kernels: no turn may pair, whatever it writes.
    import uturn_train.training.mining as mining

    monkeypatch.setattr(mining, "followup_pairs", lambda *args, **kwargs: [])
    model, tokenizer = tiny
    args = _args(conversations_file, mine_reference=False, anchor_ratio=0.0, mine_limit=4)
    with pytest.raises(ValueError, match="no follow-up pair mined from 4 prompts"):
        mine_pairs(model, tokenizer, mining_examples(args), args)


def test_bad_options_and_data(tmp_path):
    with pytest.raises(ValueError, match="mine_source 'gsm9k' is not one of"):
        MiningArguments(mine_source="gsm9k")
    with pytest.raises(ValueError, match="samples must be >= 1"):
        MiningArguments(mine_samples=0)
    with pytest.raises(ValueError, match="temperatures must be >= 0"):
        MiningArguments(mine_temperatures=[0.0, -1.0])
    with pytest.raises(ValueError, match="does not exist"):
        mining_examples(_args(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="not a data set saved with `save_to_disk`"):
        load_pairs(tmp_path)

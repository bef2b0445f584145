import json
import re

import pytest

from uturn_train.tasks.jsonl import BadRow
from uturn_train.training.data import (
    CollabDataArguments,
    apply_loss_scope,
    gsm8k_conversations,
    load_conversations,
    oasst_conversations,
    read_conversations,
    sft_dataset,
    user_turn_rows,
)

CONVERSATION = [
    {"role": "user", "content": "Mia has 3 bags of 4 apples. How many apples does she have?"},
    {"role": "assistant", "content": "She has 3 * 4 = 12 apples.\n#### 12"},
    {"role": "user", "content": "Why did you multiply 3 by 4?"},
    {"role": "assistant", "content": "Each of the 3 bags holds 4 apples, so 3 * 4 counts them all."},
]


def _loss_texts(tokenizer, dataset):
    """The text of the tokens that are in the loss, per processed row."""
    return [tokenizer.decode([t for t, label in zip(row["input_ids"], row["labels"]) if label != -100])
            for row in dataset]


@pytest.mark.parametrize("scope", ["assistant", "all", "user"])
def test_loss_scope_selects_the_promised_tokens(tiny_qwen_dir, tmp_path, scope):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], max_steps=1)
    apply_loss_scope(args, scope)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_qwen_dir), args=args,
                         train_dataset=sft_dataset([CONVERSATION], tokenizer, scope), processing_class=tokenizer)
    texts = _loss_texts(tokenizer, trainer.train_dataset)
    joined = "".join(texts)
    users = [m["content"] for m in CONVERSATION if m["role"] == "user"]
    assistants = [m["content"] for m in CONVERSATION if m["role"] == "assistant"]
    if scope == "assistant":
        assert all(a in joined for a in assistants) and not any(u in joined for u in users)
        assert "<|im_start|>" not in joined
    elif scope == "all":
        assert len(texts) == 1 and all(t in joined for t in users + assistants)
        assert joined.startswith("<|im_start|>user\n")  # headers too: the whole sequence
    else:
        # One row per user turn; each row's loss is exactly that turn and its end-of-turn token.
        assert texts == [u + "<|im_end|>" for u in users]
        assert not any(a in joined for a in assistants)


def test_user_rows_use_the_probe_prompt_with_any_template(tiny_llama_dir):
    from transformers import AutoTokenizer

    from uturn_train.chat import user_turn_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    rows = user_turn_rows(tokenizer, CONVERSATION)
    assert rows[1]["prompt"] == user_turn_prompt(tokenizer, CONVERSATION[:2])
    assert rows[1]["prompt"].endswith("<|start_header_id|>user<|end_header_id|>\n\n")
    assert rows[1]["completion"] == CONVERSATION[2]["content"] + "<|eot_id|>"


def test_loss_scope_conflicts_are_errors(tmp_path):
    from trl import SFTConfig

    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, assistant_only_loss=True)
    with pytest.raises(ValueError, match="contradicts loss_scope='all'"):
        apply_loss_scope(args, "all")
    with pytest.raises(ValueError, match="loss_scope 'users' is not one of"):
        CollabDataArguments(loss_scope="users")
    with pytest.raises(ValueError, match="needs collab_data"):
        CollabDataArguments(collab_source="conversations")


@pytest.mark.parametrize("row, message", [
    ({"text": "hi"}, "no 'messages' field"),
    ({"messages": [{"role": "bot", "content": "hi"}]}, "message 0 needs a 'role'"),
    ({"messages": [{"role": "user", "content": "  "}]}, "message 0 (user) has no text 'content'"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "no user message"),
])
def test_bad_conversation_rows_name_file_and_line(tmp_path, row, message):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"messages": CONVERSATION}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(BadRow, match=rf"c\.jsonl:2: {re.escape(message)}"):
        read_conversations(path)


def test_oasst_conversations_are_real_maximal_paths(shared_data):
    conversations = oasst_conversations(str(shared_data / "oasst" / "en_100_tree.jsonl"))
    assert len(conversations) > 100
    keys = {tuple(m["content"] for m in c) for c in conversations}
    assert len(keys) == len(conversations)
    for c in conversations:
        assert [m["role"] for m in c] == ["user", "assistant"] * (len(c) // 2) + ["user"]
        assert not any(tuple(m["content"] for m in c) == k[: len(c)] for k in keys if len(k) > len(c))


def test_gsm8k_follow_ups_ask_about_a_step_the_reply_quotes(shared_data):
    from uturn_train.probe.rules.classify import classify_turn

    path = str(shared_data / "gsm8k" / "train.jsonl")
    conversations = gsm8k_conversations(path)
    assert 7000 < len(conversations) <= 7473  # problems without a calculator annotation are left out
    assert gsm8k_conversations(path, limit=50) == conversations[:50]  # seeded: the same steps every time
    for query, answer, followup, reply in conversations[:300]:
        assert [query["role"], answer["role"], followup["role"], reply["role"]] == ["user", "assistant"] * 2
        assert "<<" not in answer["content"] + reply["content"] and answer["content"].rstrip().split()[-2] == "####"
        value = reply["content"].split()[0]
        assert value in answer["content"] and value in reply["content"].split(": ", 1)[1]
    args = CollabDataArguments(collab_source="gsm8k", collab_data=path, collab_limit=5)
    assert load_conversations(args) == conversations[:5]  # what collab_sft.py --collab_source gsm8k trains on
    # The templated questions read as grounded follow-ups to the classifier, which knows nothing of the templates.
    verdicts = [classify_turn(c[0]["content"], c[1]["content"], c[2]["content"]).label for c in conversations[:300]]
    assert verdicts.count("followup") / len(verdicts) >= 0.95, verdicts

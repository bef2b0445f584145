import json
import logging

import pytest

from uturn_train.tasks import TASKS, load_task
from uturn_train.tasks.gsm8k import extract_answer, is_correct

REAL_FILES = {
    "gsm8k": ("gsm8k/test.jsonl", 1319),
    "ifeval": ("ifeval/input_data.jsonl", 541),
    "ifbench": ("ifbench/IFBench_test.jsonl", 300),
    "mtbench": ("mt_bench/question.jsonl", 80),
    "oasst": ("oasst/en_100_tree.jsonl", 380),
    "testbed": ("gsm8k/test.jsonl", 1319),  # GSM8K format until the testbed is built
}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("task", TASKS)
def test_real_data(shared_data, task):
    file, count = REAL_FILES[task]
    examples = load_task(task, str(shared_data / file))
    assert len(examples) == count and examples.skipped == 0
    assert len({example.id for example in examples}) == count
    assert all(example.id.startswith(f"{task}-") and example.query.strip() for example in examples)
    assert load_task(task, str(shared_data / file), limit=7) == examples[:7]


def test_gsm8k_fields(shared_data):
    examples = load_task("gsm8k", str(shared_data / "gsm8k" / "test.jsonl"))
    first = examples[0]
    assert first.id == "gsm8k-0" and first.query.startswith("Janet") and first.gold == "18"
    assert first.meta["solution"].endswith("#### 18") and "<<" in first.meta["solution"]
    assert "<<" not in first.answer and "16 - 3 - 4 = 9 duck eggs" in first.answer
    assert examples[17].id == "gsm8k-17"
    assert "2,125" in {e.meta["solution"].split("#### ")[1] for e in examples} and "2125" in {e.gold for e in examples}
    # The heldout answers are the reference solutions, so they score as correct.
    assert all(is_correct(e.answer, e.gold) and extract_answer(e.answer) == e.gold for e in examples)


def test_instruction_fields(shared_data):
    ifeval = load_task("ifeval", str(shared_data / "ifeval" / "input_data.jsonl"))
    assert ifeval[0].id == "ifeval-1000" and ifeval[0].answer is None
    assert ifeval[0].meta["instruction_id_list"][0] == "punctuation:no_comma"
    assert all(len(e.meta["kwargs"]) == len(e.meta["instruction_id_list"]) > 0 for e in ifeval)
    ifbench = load_task("ifbench", str(shared_data / "ifbench" / "IFBench_test.jsonl"))
    assert ifbench[0].meta["kwargs"][0]["keyword1"] == "kaleidoscope"


def test_mtbench_fields(shared_data):
    examples = load_task("mtbench", str(shared_data / "mt_bench" / "question.jsonl"))
    assert examples[0].id == "mtbench-81" and examples[0].query.startswith("Compose an engaging travel blog")
    assert examples[0].reference_followup.startswith("Rewrite your previous response")
    assert all(e.reference_followup for e in examples)
    assert len({e.meta["category"] for e in examples}) == 8


def test_oasst_triples(shared_data):
    path = shared_data / "oasst" / "en_100_tree.jsonl"
    examples = load_task("oasst", str(path))
    assert all(e.answer.strip() and e.reference_followup.strip() for e in examples)
    # 329 first-turn triples, 51 one exchange deeper whose history is that exchange.
    depths = sorted(len(e.meta["history"]) for e in examples)
    assert depths == [0] * 329 + [2] * 51
    deep = next(e for e in examples if e.meta["history"])
    assert [m["role"] for m in deep.meta["history"]] == ["user", "assistant"]
    # The triples are the real tree: each follow-up is a reply to the answer, which replies to the query.
    messages = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        stack = [(json.loads(line)["prompt"], None)]
        while stack:
            node, parent = stack.pop()
            messages[node["message_id"]] = (node, parent)
            stack.extend((reply, node) for reply in node["replies"])
    for e in examples:
        followup, answer = messages[e.id.removeprefix("oasst-")]
        assert followup["text"] == e.reference_followup and followup["role"] == "prompter"
        assert answer["message_id"] == e.meta["answer_message_id"] and answer["text"] == e.answer
        query = messages[answer["message_id"]][1]
        assert query["text"] == e.query and query["role"] == "prompter"


def test_oasst_flat_messages_give_the_same_triples(shared_data, tmp_path):
    # The hub's oasst1 is flat messages linked by parent_id; nesting them must give what the tree file gives.
    path = shared_data / "oasst" / "en_100_tree.jsonl"
    flat = []
    for line in path.read_text(encoding="utf-8").splitlines():
        tree = json.loads(line)
        stack = [(tree["prompt"], None)]
        while stack:
            node, parent_id = stack.pop()
            message = {k: v for k, v in node.items() if k != "replies"}
            flat.append({**message, "parent_id": parent_id, "message_tree_id": tree["message_tree_id"]})
            stack.extend((reply, node["message_id"]) for reply in reversed(node["replies"]))
    from_tree = load_task("oasst", str(path))
    assert [e.id for e in load_task("oasst", write_jsonl(tmp_path / "flat.jsonl", flat))] == [e.id for e in from_tree]

    # A non-English message drops out with every path through it.
    answer = next(m for m in flat if m["message_id"] == from_tree[0].meta["answer_message_id"])
    answer["lang"] = "de"
    through = {
        e.id
        for e in from_tree
        if e.answer == answer["text"] or any(m["content"] == answer["text"] for m in e.meta["history"])
    }
    from_flat = load_task("oasst", write_jsonl(tmp_path / "flat_de.jsonl", flat))
    assert through and [e.id for e in from_flat] == [e.id for e in from_tree if e.id not in through]


def test_unknown_task():
    with pytest.raises(ValueError, match="unknown task 'gsm9k'; valid tasks: gsm8k, ifeval, ifbench, mtbench"):
        load_task("gsm9k")


def test_hub_name_offline_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="'nobody/no-such-dataset'.*hub.*--data PATH"):
        load_task("gsm8k", "nobody/no-such-dataset")


def _callback(data):
    from types import SimpleNamespace

    from uturn_train.training.callback import ProbeArguments, UserTurnProbeCallback

    # The probe data loads before anything needs the tokenizer beyond its chat template.
    tokenizer = SimpleNamespace(chat_template="x")
    return UserTurnProbeCallback(ProbeArguments(probe_task="gsm8k", probe_data=data), tokenizer)


def _mine():
    from uturn_train.training.mining import MiningArguments, mining_examples

    return mining_examples(MiningArguments(mine_source="gsm8k"))  # the hub's train split, as in issue 17


def _prompts():
    from uturn_train.training.data import prompt_examples

    return prompt_examples("oasst", "nobody/no-such-dataset", 4, option="prompt")  # what `rl_examples` calls


def _collab():
    from uturn_train.training.data import CollabDataArguments, load_conversations

    return load_conversations(CollabDataArguments(collab_source="gsm8k"))


@pytest.mark.parametrize("option, load", [
    ("--data", lambda: load_task("gsm8k", "nobody/no-such-dataset")),
    ("--probe_data", lambda: _callback("nobody/no-such-dataset")),
    ("--mine_data", _mine), ("--prompt_data", _prompts), ("--collab_data", _collab),
], ids=lambda x: x if isinstance(x, str) else "")
def test_hub_data_offline_names_the_option_typed(option, load, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=f"hub.*point at a local copy instead: {option} PATH.jsonl$"):
        load()


def test_missing_local_file_names_the_option(tmp_path):
    with pytest.raises(ValueError, match="^--probe_data: data file .*nothere.jsonl does not exist"):
        _callback(str(tmp_path / "nothere.jsonl"))


def test_missing_local_file(tmp_path):
    with pytest.raises(ValueError, match="data file .*nothere.jsonl does not exist"):
        load_task("gsm8k", str(tmp_path / "nothere.jsonl"))


GOOD = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}


@pytest.mark.parametrize(
    "task, bad, message",
    [
        ("gsm8k", {"question": "What is 2 + 2?"}, "missing field 'answer'"),
        ("gsm8k", {"question": "  ", "answer": "#### 4"}, "empty field 'question'"),
        ("gsm8k", {"question": "What is 2 + 2?", "answer": "4"}, "no final '#### <number>'"),
        ("ifeval", {"key": 1, "prompt": "Be brief.", "instruction_id_list": [], "kwargs": []}, "empty field 'instr"),
        ("ifeval", {"key": 1, "prompt": "Hi", "instruction_id_list": ["a", "b"], "kwargs": [{}]}, "one entry per"),
        ("mtbench", {"question_id": 1, "category": "math", "turns": ["Hi", ""]}, "non-empty strings"),
        ("mtbench", {"question_id": 1, "turns": ["Hi"]}, "missing field 'category'"),
    ],
)
def test_bad_row_names_file_line_and_field(tmp_path, task, bad, message):
    good = {
        "gsm8k": GOOD,
        "ifeval": {"key": 0, "prompt": "Say hi.", "instruction_id_list": ["x"], "kwargs": [{}]},
        "mtbench": {"question_id": 0, "category": "math", "turns": ["Hi", "More"]},
    }[task]
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}:3: .*{message}.*skip_bad"):
        load_task(task, str(path))


def test_bad_oasst_message_names_line_and_message(tmp_path):
    tree = {
        "message_tree_id": "t",
        "prompt": {
            "message_id": "q",
            "role": "prompter",
            "text": "Hi?",
            "replies": [{"message_id": "a", "role": "assistant", "text": "", "replies": []}],
        },
    }
    path = write_jsonl(tmp_path / "trees.jsonl", [tree])
    with pytest.raises(ValueError, match=r"trees.jsonl:1 \(message a\): empty field 'text'"):
        load_task("oasst", path)


def test_skip_bad_counts_and_warns(tmp_path, caplog):
    rows = [GOOD, {"question": "Q"}, GOOD, {"question": "", "answer": "#### 1"}, GOOD]
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="uturn_train.tasks"):
        examples = load_task("gsm8k", path, skip_bad=True)
    # Ids keep the row index, so a skipped row does not renumber the rest.
    assert [e.id for e in examples] == ["gsm8k-0", "gsm8k-2", "gsm8k-4"] and examples.skipped == 2
    assert "skipped 2 bad rows" in caplog.text and "data.jsonl:2" in caplog.text
    with pytest.raises(ValueError, match=r"no gsm8k examples in 2 rows \(2 skipped as bad\)"):
        load_task("gsm8k", write_jsonl(tmp_path / "all_bad.jsonl", rows[1:2] + rows[3:4]), skip_bad=True)


def test_duplicate_ids(tmp_path):
    row = {"key": 5, "prompt": "Say hi.", "instruction_id_list": ["x"], "kwargs": [{}]}
    path = write_jsonl(tmp_path / "dup.jsonl", [row, row])
    with pytest.raises(ValueError, match=r"dup.jsonl:2: duplicate id 'ifeval-5', first given at .*dup.jsonl:1"):
        load_task("ifeval", path)
    assert load_task("ifeval", path, skip_bad=True).skipped == 1


def test_empty_and_malformed_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty.jsonl is empty"):
        load_task("gsm8k", str(empty))
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(GOOD) + "\n" + '{"question": "Q", "answer": \n', encoding="utf-8")
    with pytest.raises(ValueError, match="broken.jsonl:2: malformed JSON"):
        load_task("gsm8k", str(broken), skip_bad=True)
    not_object = write_jsonl(tmp_path / "list.jsonl", [["Q", "A"]])
    with pytest.raises(ValueError, match="list.jsonl:1: expected a JSON object, got list"):
        load_task("gsm8k", not_object)


def test_json_list_file(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps([GOOD, {"question": "Q"}]), encoding="utf-8")
    assert load_task("gsm8k", str(path), skip_bad=True)[0].gold == "4"
    with pytest.raises(ValueError, match=r"data.json\[1\]: missing field 'answer'"):
        load_task("gsm8k", str(path))


def test_limit(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [GOOD] * 5)
    assert [e.id for e in load_task("gsm8k", path, limit=2)] == ["gsm8k-0", "gsm8k-1"]
    assert len(load_task("gsm8k", path, limit=50)) == 5
    with pytest.raises(ValueError, match="limit must be a positive"):
        load_task("gsm8k", path, limit=0)


def test_hub_rows_use_the_hub_schema(shared_data, monkeypatch):
    # The hub cannot be reached here: serve the real MT-Bench file as the hub copy lays it out (`prompt`, `prompt_id`).
    import datasets

    with open(shared_data / "mt_bench" / "question.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    hub = datasets.Dataset.from_list(
        [{"prompt": r["turns"], "prompt_id": r["question_id"], "category": r["category"]} for r in rows]
    )
    hub_bad = datasets.Dataset.from_list([{"prompt": ["Hi"], "prompt_id": 1, "category": "x"}] * 2)
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return hub_bad if name == "me/bad" else hub

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    examples = load_task("mtbench")
    assert calls == [("HuggingFaceH4/mt_bench_prompts", None, "train")]
    assert [(e.id, e.query, e.reference_followup) for e in examples] == [
        (f"mtbench-{r['question_id']}", r["turns"][0], r["turns"][1]) for r in rows
    ]
    with pytest.raises(ValueError, match=r"me/bad \(train\) row 1: duplicate id 'mtbench-1'"):
        load_task("mtbench", "me/bad")

"""GSM8K collaboration tasks: slips carried through a reference solution, numbers left out of a question."""

import json
import random
import re
from collections import Counter

import pytest

from uturn_train.collab import OraclePartner, load_collab_tasks
from uturn_train.collab.gsm8k import evaluate, gsm8k_collab_tasks, info_gap_task, peer_check_task
from uturn_train.collab.partners import AGAIN, NOTHING_MORE, questions_the_slip
from uturn_train.tasks.base import Example
from uturn_train.tasks.gsm8k import extract_answer

# GSM8K test problem 7's shape: the first result is used by the second step, the second by the third.
QUERY = ("Toulouse has twice as many sheep as Charleston. Charleston has 4 times as many sheep as Seattle. "
         "How many sheep do Toulouse, Charleston, and Seattle have together if Seattle has 20 sheep?")
SOLUTION = ("If Seattle has 20 sheep, Charleston has 4 * 20 sheep = <<20*4=80>>80 sheep\n"
            "Toulouse has twice as many sheep as Charleston, which is 2 * 80 sheep = <<2*80=160>>160 sheep\n"
            "Together, the three has 20 sheep + 160 sheep + 80 sheep = <<20+160+80=260>>260 sheep\n#### 260")
DUCKS = Example("gsm8k-0", "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
                "muffins for her friends every day with four. She sells the remainder at the farmers' market daily "
                "for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?",
                gold="18", meta={"solution": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
                                             "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer's market.\n"
                                             "#### 18"})


def _numbers(text: str) -> list[str]:
    return re.findall(r"(?<![\d.])\d+(?:\.\d+)?", text)


def test_a_slip_is_carried_through_every_later_step_to_a_wrong_answer():
    example = Example("gsm8k-7", QUERY, gold="260", meta={"solution": SOLUTION})
    slipped = set()
    for seed in range(20):
        task = peer_check_task(example, "gsm8k-7", random.Random(seed), wrong=True)
        o, shown = task["oracle"], task["messages"][1]["content"]
        assert "<<" not in shown and task["answer_right"] is False
        lines = shown.split("\n")
        j = o["wrong_step"]
        charleston = int(re.search(r"= (\d+) sheep", lines[0]).group(1))
        toulouse = int(re.search(r"= (\d+) sheep", lines[1]).group(1))
        total = int(re.search(r"= (\d+) sheep", lines[2]).group(1))
        # The slipped step is off; every step after it computes with the wrong value, and computes it right.
        assert (charleston != 80) == (j == 0) and (toulouse != 2 * charleston) == (j == 1)
        assert f"2 * {charleston} sheep" in lines[1] and f"+ {toulouse} sheep + {charleston} sheep" in lines[2]
        assert (total != 20 + toulouse + charleston) == (j == 2)
        final = extract_answer(shown)
        assert final == str(total) != "260" and o["values"][-1] == final
        assert o["ordinal"] == ("first", "second", "third")[j]
        assert o["operands"] == (["20", "4"], ["2", "80"], ["20", "160", "80"])[j]
        assert o["fix"].startswith(f"Let me redo the {o['ordinal']} step:") and o["solution"].endswith("#### 260")
        slipped.add(j)
    assert slipped == {0, 1, 2}


def test_a_right_answer_is_the_solution_without_its_marks():
    task = peer_check_task(DUCKS, "gsm8k-0", random.Random(0), wrong=False)
    assert task["messages"][1]["content"] == ("Janet sells 16 - 3 - 4 = 9 duck eggs a day.\nShe makes 9 * 2 = $18 "
                                              "every day at the farmer's market.\n#### 18")
    assert task["oracle"] == {"wrong_step": None, "solution": task["messages"][1]["content"]}


def test_info_gap_leaves_out_a_number_the_solution_uses_and_reveals_its_sentence():
    task = info_gap_task(DUCKS, "gsm8k-0", random.Random(0))
    question = task["messages"][0]["content"]
    # 16 is the only number that can go: "$2" follows a dollar sign, "three" and "four" are words.
    assert question.startswith("Janet's ducks lay some eggs per day.") and "16" not in question
    assert task["oracle"]["reveal"] == "Janet's ducks lay 16 eggs per day." and task["gold"] == "18"
    assert task["oracle"]["asks_for"] == "eggs"  # the word the number counted: what an ask must name


def test_a_strict_partner_reveals_only_to_an_ask_that_names_the_missing_quantity():
    (task,) = load_collab_tasks([info_gap_task(DUCKS, "gsm8k-0", random.Random(0))], ["info_gap"], oracle=True)

    def reply(turn, partner):
        return partner.respond([task], [[*task.messages, {"role": "assistant", "content": turn}]])[0].text

    strict = OraclePartner(named=True)
    assert reply("How many eggs do the ducks lay each day?", strict) == task.oracle["reveal"]
    assert reply("Janet's ducks lay some eggs per day. How many?", strict) == NOTHING_MORE  # restated, not asked
    assert reply("But how many then?", strict) == NOTHING_MORE
    assert reply("But how many then?", OraclePartner()) == task.oracle["reveal"]  # `uturn collab` counts any ask


def test_problems_without_clean_marks_give_no_task():
    bad = Example("gsm8k-1", "A robe takes 2 bolts of fiber. How many?", gold="3",
                  meta={"solution": "It takes 2/2=<<2/2=1>>1 bolt\nSo 2+1 is 3 bolts\n#### 3"})
    assert peer_check_task(bad, "gsm8k-1", random.Random(0), wrong=True) is None
    assert info_gap_task(bad, "gsm8k-1", random.Random(0)) is None
    with pytest.raises(ValueError, match="not a calculator expression"):
        evaluate("2**3")


def test_the_oracle_fixes_a_slip_a_user_questions(tmp_path):
    rows = [peer_check_task(Example("gsm8k-7", QUERY, gold="260", meta={"solution": SOLUTION}), "gsm8k-7",
                            random.Random(1), wrong=True)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (task,) = load_collab_tasks(path, ["peer_check"], oracle=True)
    o = task.oracle
    bad = o["values"][0]
    turn = f"Why is it {bad} in the {o['ordinal']} step?"
    assert questions_the_slip(turn, o)
    conversation = [*task.messages, {"role": "user", "content": turn}]
    (reply,) = OraclePartner().respond([task], [conversation])
    assert reply.text == o["fix"] and extract_answer(reply.text) == "260"
    # A question that misses the slip gets the wrong answer again.
    other = [*task.messages, {"role": "user", "content": "Why do you add Seattle's sheep at the end?"}]
    (again,) = OraclePartner().respond([task], [other])
    assert again.text.startswith(AGAIN) and extract_answer(again.text) == extract_answer(task.messages[1]["content"])


def test_gsm8k_test_split_gives_both_families_and_every_slip_is_wrong(shared_data):
    rows = gsm8k_collab_tasks(str(shared_data / "gsm8k" / "test.jsonl"))
    families = [r["family"] for r in rows]
    assert families.count("peer_check") > 900 and families.count("info_gap") > 400
    again = gsm8k_collab_tasks(str(shared_data / "gsm8k" / "test.jsonl"))
    assert again == rows  # seeded: every model meets the same tasks
    questions = {json.loads(line)["question"] for line in (shared_data / "gsm8k" / "test.jsonl").open()}
    for r in rows:
        if r["family"] == "peer_check" and not r["answer_right"]:
            shown = extract_answer(r["messages"][1]["content"])
            assert shown != r["gold"] and shown == r["oracle"]["values"][-1]
            assert r["messages"][0]["content"] in questions
        elif r["family"] == "info_gap":
            gapped, reveal = r["messages"][0]["content"], r["oracle"]["reveal"]
            assert gapped not in questions and " some " in f" {gapped} "
            left_out = Counter(_numbers(reveal)) - Counter(_numbers(gapped))
            assert len(left_out) == 1  # the reveal holds the number left out, which the question no longer does
            assert next(iter(left_out)) not in _numbers(gapped)


def test_uturn_collab_task_gsm8k_writes_the_tasks_it_drew(shared_data, tiny_qwen_dir, tmp_path, capsys):
    from uturn_train.cli import main as cli_main

    out = tmp_path / "out"
    data = str(shared_data / "gsm8k" / "test.jsonl")
    cli_main(["collab", "--model", str(tiny_qwen_dir), "--task", "gsm8k", "--data", data, "--limit", "3",
              "--max_new_tokens", "8", "--out", str(out)])
    drawn = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert drawn == gsm8k_collab_tasks(data)
    rows = [json.loads(line) for line in (out / "conversations.jsonl").read_text().splitlines()]
    ids = {r["id"] for r in drawn}
    assert len(rows) == 6 and all(r["id"] in ids for r in rows)
    result = json.loads((out / "results.json").read_text())
    assert result["task"] == "gsm8k" and set(result["families"]) == {"info_gap", "peer_check"}
    with pytest.raises(SystemExit):  # a file without GSM8K's solutions is one clear line naming the option
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}) + "\n")
        cli_main(["collab", "--model", str(tiny_qwen_dir), "--task", "gsm8k", "--data", str(bad), "--out",
                  str(tmp_path / "bad")])
    assert "--data" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_drawn_rows_load_as_tasks_and_a_bad_one_is_named():
    rows = [peer_check_task(DUCKS, "gsm8k-0", random.Random(0), wrong=True), info_gap_task(DUCKS, "gsm8k-0",
                                                                                          random.Random(0))]
    tasks = load_collab_tasks(rows, oracle=True, option="--probe_collab")
    assert [t.family for t in tasks] == ["peer_check", "info_gap"] and tasks[0].answer_right is False
    with pytest.raises(ValueError, match="--probe_collab: task 1: `oracle` lacks"):
        load_collab_tasks([rows[0], {**rows[1], "oracle": {}}], option="--probe_collab")


def test_an_ordinal_alone_questions_the_slip_for_uturn_collab_but_not_for_training():
    task = peer_check_task(Example("gsm8k-7", QUERY, gold="260", meta={"solution": SOLUTION}), "gsm8k-7",
                           random.Random(1), wrong=True)
    (loaded,) = load_collab_tasks([task], ["peer_check"], oracle=True)
    o = loaded.oracle
    generic = f"Can you explain the {o['ordinal']} step?"  # fits any answer: it names no number of this one
    conversation = [*loaded.messages, {"role": "user", "content": generic}]
    assert OraclePartner().respond([loaded], [conversation])[0].text == o["fix"]
    assert OraclePartner(ordinal=False).respond([loaded], [conversation])[0].text.startswith(AGAIN)
    named = [*loaded.messages, {"role": "user", "content": f"Why {o['values'][0]}?"}]
    assert OraclePartner(ordinal=False).respond([loaded], [named])[0].text == o["fix"]

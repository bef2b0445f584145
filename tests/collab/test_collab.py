"""Collaboration conversations: the testbed's tasks, the oracle partner, the success rule, the job and the callback."""

import json
import random
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import ARITHMETIC

from uturn_train.collab import CollabSettings, OraclePartner, load_collab_tasks, run_collab
from uturn_train.collab.partners import AGAIN, NOTHING_MORE, names_the_gap
from uturn_train.generation import Generation
from uturn_train.io import write_jsonl
from uturn_train.testbed.collab import collab_tasks
from uturn_train.testbed.turns import RESTATED_ASK, gap_sentence
from uturn_train.testbed.world import sample_problem


def _tasks(n=40, seed=0):
    rng = random.Random(seed)
    return collab_tasks([sample_problem(rng) for _ in range(n)], seed=seed)


@pytest.fixture()
def tasks_file(tmp_path):
    path = tmp_path / "collab.jsonl"
    write_jsonl(path, _tasks())
    return path


def test_info_gap_leaves_out_one_number_that_the_reveal_holds():
    rng = random.Random(0)
    problems = [sample_problem(rng) for _ in range(200)]
    rows = [r for r in collab_tasks(problems) if r["family"] == "info_gap"]
    assert len(rows) > 100, "most problems have a number that can be left out"
    for r in rows:
        question = r["messages"][0]["content"]
        number = re.search(r"is (\d+)\.$", r["oracle"]["reveal"]).group(1)
        # The reveal names the one knob that holds the number (not another knob of the same value: 3 candles at $3).
        problem = problems[int(r["id"].split("-")[1])]
        knobs = [k for k, v in problem.numbers.items() if str(v) == number]
        assert len(knobs) == 1 and r["oracle"]["reveal"].lower().startswith(str(problem.knobs[knobs[0]]).lower())
        assert "some " in question and number in r["brief"]
        # The full question is in the brief: it differs from the user's by that number where the user wrote "some".
        full = r["brief"].split("The whole problem is: ")[1].split(" You only wrote:")[0]
        assert re.sub(rf"(?<![\d$]){number}(?= [a-z])", "some", full, count=1) == question


def test_peer_check_slip_is_one_wrong_step_carried_through():
    rows = [r for r in _tasks(200) if r["family"] == "peer_check"]
    wrong = [r for r in rows if not r["answer_right"]]
    assert 60 < len(wrong) < 140, "about half the answers are wrong"
    for r in rows:
        shown = r["messages"][1]["content"]
        lines = re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", shown)
        ops = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "/": int.__floordiv__}
        bad = [i for i, (x, op, y, v) in enumerate(lines) if ops[op](int(x), int(y)) != int(v)]
        final = shown.rsplit("#### ", 1)[1]
        if r["answer_right"]:
            assert bad == [] and final == r["gold"] and r["oracle"]["wrong_step"] is None
        else:
            assert bad == [r["oracle"]["wrong_step"]], "exactly the slipped step is wrong; later steps use its value"
            assert final != r["gold"] and r["oracle"]["fix"].endswith(f"#### {r['gold']}")


@pytest.fixture()
def loaded(tasks_file):
    return load_collab_tasks(tasks_file)


def _one(tasks, family, right=None):
    return next(t for t in tasks if t.family == family and (right is None or t.answer_right is right))


def test_oracle_reveals_once_fixes_a_questioned_slip_and_lets_a_user_move_on(loaded):
    oracle = OraclePartner()
    gap = _one(loaded, "info_gap")
    first = oracle.respond([gap], [[*gap.messages, {"role": "assistant", "content": "How many are there?"}]])[0]
    assert first.text == gap.oracle["reveal"]
    later = [*gap.messages, {"role": "assistant", "content": "How many?"}, {"role": "user", "content": first.text},
             {"role": "assistant", "content": "And how much is each?"}]
    assert oracle.respond([gap], [later])[0].text == NOTHING_MORE

    slip = _one(loaded, "peer_check", right=False)
    o, shown = slip.oracle, slip.messages[1]["content"]

    def reply(turn):
        out = oracle.respond([slip], [[*slip.messages, {"role": "user", "content": turn}]])[0]
        return None if out is None else out.text

    assert reply(f"Why is it {o['values'][0]}?") == o["fix"]
    assert reply(f"Are you sure? I got {int(o['values'][-1]) + 1} {o['values'][-1]}.") == o["fix"]
    assert reply("Are you sure about that?") == AGAIN + shown  # push-back that points at no step
    assert reply(f"Can you explain the {o['ordinal']} step?") == o["fix"]
    other = "second" if o["ordinal"] == "first" else "first"
    assert reply(f"Can you explain the {other} step?") == AGAIN + shown  # a step that is right
    assert reply("Thanks, that makes sense.") is None  # the user moves on: the wrong answer stands
    assert reply("Next question: What is 48 + 7?") is None
    assert reply("Can you explain that more simply?") == AGAIN + shown  # a question that misses the slip
    right = _one(loaded, "peer_check", right=True)
    out = oracle.respond([right], [[*right.messages, {"role": "user", "content": "Are you sure?"}]])[0]
    assert out.text == AGAIN + right.oracle["solution"]


def test_the_testbeds_asks_name_the_gap_and_a_restated_question_does_not(loaded):
    gaps = [t for t in loaded if t.family == "info_gap"]
    assert len(gaps) > 20
    for i, t in enumerate(gaps):
        question, phrase = t.messages[0]["content"], t.oracle["asks_for"]
        restated = gap_sentence(question, re.search(r"\bsome\b", question).start())
        # The asks of the testbed's mixture (turns.info_gap_conversation) name it: the strict partner rewards them.
        assert names_the_gap(f"{restated}, but how many? {RESTATED_ASK[i % 4].format(phrase=phrase)}", question, phrase)
        # Asks read on the collaboration objective's seeds 0 and 2 (recipes/README.md) do not.
        assert not names_the_gap(f"{restated},?", question, phrase)
        assert not names_the_gap(f"{restated.split()[0]} {restated.split()[1]} but how many then?", question, phrase)
        strict = OraclePartner(named=True)
        assert strict.respond([t], [[*t.messages, {"role": "assistant", "content": f"{restated},?"}]])[0].text \
            == NOTHING_MORE
    bare = replace(gaps[0], oracle={"reveal": "x"})  # tasks written by an older version
    with pytest.raises(ValueError, match="no oracle `asks_for`.*make the tasks again"):
        OraclePartner(named=True).respond([bare], [[*bare.messages, {"role": "assistant", "content": "How many?"}]])


class ScriptedClient:
    """A server stand-in for the model under test: as the assistant it asks when the question lacks a number and then
    answers the gold (or guesses 7 at once); as the user it questions the answer's final number (or says thanks). The
    conversation loop, the oracle and the success rule run for real around it."""

    def __init__(self, tasks, ask=True, react=True):
        self.gold = {t.messages[0]["content"]: t.gold for t in tasks}
        self.ask, self.react = ask, react

    def generate(self, prompts, **kwargs):
        outs = []
        for p in prompts:
            turns = re.findall(r"<\|im_start\|>(user|assistant)\n(.*?)<\|im_end\|>", p, re.DOTALL)
            role, last = turns[-1]
            if role == "user":  # the model is the assistant (info_gap)
                told = re.fullmatch(r".* is \d+\.", last)
                text = f"#### {self.gold[turns[0][1]]}" if told else "How many are there?" if self.ask else "#### 7"
            else:  # the model is the user (peer_check)
                final = re.findall(r"#### (\d+)", p)[-1]  # the last answer stated (a partner may explain a step)
                text = f"Why is it {final}?" if self.react else "Thanks!"
            outs.append([Generation(text, "stop", None, 10, 5)])
        return outs


def test_success_rule_end_to_end_with_the_oracle(tasks_file):
    tasks = load_collab_tasks(tasks_file)
    run = run_collab(None, _tokenizer(), tasks, OraclePartner(), CollabSettings(max_turns=3),
                     client=ScriptedClient(tasks), disable_progress=True)
    by_id = {r["id"]: r for r in run.conversations}
    gap = [r for r in run.conversations if r["family"] == "info_gap"]
    assert all(r["ended"] == "answered" and r["turns"] == 2 and r["questions"] == 1 and r["success"] for r in gap)
    assert run.summary["info_gap"]["asked_first"] == 1.0
    assert run.summary["info_gap"]["named_first"] == 0.0  # "How many are there?" names no quantity
    strict = run_collab(None, _tokenizer(), tasks, OraclePartner(named=True), CollabSettings(max_turns=3),
                        client=ScriptedClient(tasks), disable_progress=True)
    assert strict.summary["info_gap"]["success_rate"] == 0.0  # never told the number: it asks until the turns end
    assert {r["ended"] for r in strict.conversations if r["family"] == "info_gap"} == {"max_turns"}
    slips = [r for r in run.conversations if r["family"] == "peer_check" and r["answer_right"] is False]
    assert slips and all(r["success"] for r in slips), "questioning the final number gets every slip fixed"
    assert run.summary["peer_check"]["wrong_start"]["success_rate"] == 1.0
    quiet = run_collab(None, _tokenizer(), tasks, OraclePartner(), CollabSettings(), client=ScriptedClient(
        tasks, ask=False, react=False), disable_progress=True)
    summary = quiet.summary
    guesses = [r for r in quiet.conversations if r["family"] == "info_gap"]
    assert all(r["success"] == (r["gold"] == "7") and r["final_answer"] == "7" for r in guesses)
    assert summary["peer_check"]["wrong_start"]["success_rate"] == 0.0, "thanks leaves every slip in place"
    assert summary["peer_check"]["right_start"]["success_rate"] == 1.0
    assert summary["info_gap"]["asked_first"] == 0.0 and summary["info_gap"]["turns"] == 1.0
    n = summary["peer_check"]["n"]
    assert summary["peer_check"]["success_rate"] == pytest.approx(summary["peer_check"]["right_start"]["n"] / n)
    assert by_id.keys() == {r["id"] for r in quiet.conversations}


def test_a_partner_explaining_a_step_leaves_the_pairs_answer_standing(tasks_file):
    class Explaining:  # a model partner asked "Why is it 61?" goes over one step; 4 is no answer to the problem
        def respond(self, tasks, conversations):
            return [Generation("In that step we multiply: 2 * 2 = 4.", "stop", None, 5, 5) for _ in tasks]

    tasks = [t for t in load_collab_tasks(tasks_file) if t.family == "peer_check"]
    run = run_collab(None, _tokenizer(), tasks, Explaining(), CollabSettings(max_turns=3), client=ScriptedClient(tasks),
                     disable_progress=True)
    assert all(r["turns"] == 3 and r["messages"][-1]["content"].endswith("= 4.") for r in run.conversations)
    assert all(r["success"] == r["answer_right"] and r["final_answer"] == re.findall(r"#### (\d+)", r["messages"][1][
        "content"])[-1] for r in run.conversations), "the pair's answer is the one it opened with"


def _tokenizer():
    from helpers import tiny

    return tiny.qwen_tokenizer()


def test_failed_partner_requests_are_errors_left_out_of_the_rates(tasks_file):
    class Failing:
        def respond(self, tasks, conversations):
            return [Generation("", "error", None, 0, 0, error="HTTP 500") for _ in tasks]

    tasks = load_collab_tasks(tasks_file)
    run = run_collab(None, _tokenizer(), tasks, Failing(), client=ScriptedClient(tasks), disable_progress=True)
    s = run.summary["info_gap"]
    assert s["n"] == 0 and s["errors"] > 0 and s["success_rate"] is None
    assert all(r["success"] is None and "HTTP 500" in r["error"] for r in run.conversations if r["error"])


@pytest.mark.parametrize("row, message", [
    ({"family": "chat"}, "family 'chat' is not one of"),
    ({"family": "peer_check", "messages": [{"role": "user", "content": "q"}]}, "opens with the roles"),
    ({"family": "info_gap", "oracle": {}}, "lacks ['reveal']"),
    ({"family": "peer_check", "answer_right": None}, "needs `answer_right`"),
])
def test_bad_rows_name_the_line_and_the_field(tmp_path, row, message):
    good = _tasks(4)
    base = next(r for r in good if r["family"] == row.get("family", "info_gap")) if row.get("family") in (
        "info_gap", "peer_check") else good[0]
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [good[0], {**base, **row}])
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        load_collab_tasks(path)
    assert f"{path}:2" in str(e.value)


def test_missing_file_and_missing_family_name_the_option(tmp_path):
    with pytest.raises(ValueError, match="--probe_collab .* is not a file"):
        load_collab_tasks(tmp_path / "nope.jsonl", option="--probe_collab")
    path = tmp_path / "gap_only.jsonl"
    write_jsonl(path, [r for r in _tasks(8) if r["family"] == "info_gap"])
    with pytest.raises(ValueError, match="holds no peer_check task: drop it from --families"):
        load_collab_tasks(path)


def test_callback_logs_collab_success_next_to_the_probe(tiny_qwen_dir, tmp_path, tasks_file):
    from helpers.train_with_probe import make_trainer

    gsm8k = ARITHMETIC
    trainer = make_trainer(tiny_qwen_dir, tmp_path / "run", gsm8k, max_steps=2, probe_collab=str(tasks_file),
                           probe_collab_limit=2, probe_temperatures=[0.0])
    trainer.train()
    probed = [h for h in trainer.state.log_history if "collab/success_rate/info_gap" in h]
    assert [h["step"] for h in probed] == [0, 2]
    for h in probed:
        for name in ("info_gap", "peer_check", "peer_check_wrong_start"):
            key = f"collab/success_rate/{name}"
            if key in h:
                assert h[f"{key}/ci_low"] <= h[key] <= h[f"{key}/ci_high"]
        assert "probe/followup_rate/T0.0" in h and h["collab/seconds"] > 0
    history = [json.loads(line) for line in (tmp_path / "run" / "probe_history.jsonl").read_text().splitlines()]
    assert all(r["collab"]["info_gap"]["n"] == 2 and r["collab"]["peer_check"]["n"] == 2 for r in history)
    rows = (tmp_path / "run" / "collab" / "step_2.jsonl").read_text().splitlines()
    assert len(rows) == 4 and {"success", "ended", "messages"} <= set(json.loads(rows[0]))


def _with_collab(run: Path, successes: dict[int, tuple[int, int]]) -> None:
    """Adds to a run's probe records the collaboration summary of `successes[step]` = (info_gap, peer wrong start)
    successes out of 10 each."""
    from uturn_train.collab.dialogue import _rate

    def rate(k):
        return _rate([{"success": i < k} for i in range(10)])

    path = run / "probe_history.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for r in records:
        gap, wrong = successes[r["step"]]
        r["collab"] = {"info_gap": {**rate(gap), "errors": 0},
                       "peer_check": {**rate(wrong), "errors": 0, "wrong_start": rate(wrong), "right_start": rate(10)}}
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_report_gains_collab_columns(tmp_path):
    from helpers.report_runs import A_LAST, BASE, write_run

    from uturn_train.experiments.report import write_report

    run = write_run(tmp_path / "abl" / "dpo", {0: BASE, 2: A_LAST})
    _with_collab(run, {0: (1, 0), 2: (3, 7)})
    write_run(tmp_path / "abl" / "sft", {0: BASE, 2: A_LAST})  # trained without --probe_collab
    write_report([tmp_path / "abl"], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| run |"))
    assert "collab info_gap" in header and "collab peer_check wrong start" in header
    rows = {line.split(" | ")[5]: line for line in md.splitlines() if line.startswith("| dpo |")}
    assert "| 0.300 [0.11, 0.60] | 0.700 [0.40, 0.89] | 0.700 [0.40, 0.89] |" in rows["best = last"]
    assert "| 0.100 [0.02, 0.40] | 0.000 [0.00, 0.28] |" in rows["step 0"]
    sft = [line for line in md.splitlines() if line.startswith("| sft |")]
    assert sft and all(line.count("| n/a ") == 3 for line in sft), "a run without conversations has no collab figure"


def test_spearman_by_hand_and_a_bootstrap_over_runs():
    from uturn_train.stats import grouped_spearman, spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ties share their mean rank: ranks x (1, 2.5, 2.5, 4), y (1, 2, 3, 4) -> Pearson of the ranks.
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(np.corrcoef([1, 2.5, 2.5, 4], [1, 2, 3, 4])[0, 1])
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    monotone = grouped_spearman([[(i + j / 10, i + j / 10) for j in range(3)] for i in range(5)], resamples=200)
    assert monotone["rho"] == pytest.approx(1.0) and monotone["ci95"] == pytest.approx([1.0, 1.0])
    assert monotone["n_points"] == 15 and monotone["n_groups"] == 5


def test_correlation_script_reads_an_ablation(tmp_path):
    from helpers.report_runs import A_LAST, BASE, write_run

    from uturn_train.experiments.correlation import write_correlation

    for seed in (0, 1):  # success grows with the greedy grounded rate in both runs
        run = write_run(tmp_path / "abl" / f"dpo-seed{seed}", {0: BASE, 2: A_LAST})
        _with_collab(run, {0: (1, 1), 2: (4, 8)})
    write_correlation([str(tmp_path / "abl")], tmp_path / "out")
    rows = json.loads((tmp_path / "out" / "correlation.json").read_text())["correlations"]
    row = next(r for r in rows if r["outcome"] == "peer_check, wrong start" and r["predictor"] == "greedy grounded")
    assert row["rho"] == pytest.approx(1.0) and row["n_points"] == 4 and row["n_groups"] == 2
    assert (tmp_path / "out" / "correlation.png").read_bytes()[:4] == b"\x89PNG"
    assert "| peer_check, wrong start | greedy grounded | +1.00 |" in (tmp_path / "out" / "correlation.md").read_text()


def test_correlation_relabel_reads_the_stored_turns_with_this_versions_rules(tmp_path):
    from helpers.grounding_cases import AGE_ANSWER, AGE_QUERY, ANSWER, QUERY

    from uturn_train.experiments.correlation import relabelled_rates

    def row(index, temperature, turn, error=None):  # as the probe stores it; the labels stored are the old rules'
        query, answer = [(AGE_QUERY, AGE_ANSWER), (QUERY, ANSWER)][index]
        return {"index": index, "temperature": temperature, "query": query, "answer": answer, "user_turn": turn,
                "finish_reason": "stop", "mismatch_index": 1 - index, "grounded": True, "error": error}

    turns = tmp_path / "probe" / "step_2.jsonl"
    turns.parent.mkdir()
    write_jsonl(turns, [row(0, 0.0, "What if Paul's age changed to 8?"), row(1, 0.0, "How did you get 24?"),
                        row(0, 1.0, "Why 23 years?"), row(1, 1.0, "", error="request failed")])
    assert relabelled_rates(turns) == {0.0: 0.5, 1.0: 1.0}  # the what-if is a variant; the failed row is left out
    with pytest.raises(FileNotFoundError, match="step_4.jsonl: no stored user turns .*without --relabel"):
        relabelled_rates(tmp_path / "probe" / "step_4.jsonl")


def test_testbed_tasks_come_from_its_heldout_problems_and_a_mismatch_fails(tmp_path):
    from uturn_train.testbed.build import make_heldout
    from uturn_train.testbed.collab import ensure_collab_tasks

    heldout = make_heldout(random.Random(3), 6)
    (tmp_path / "card.json").write_text(json.dumps({"seed": 3, "config": {"n_heldout": 6}}))
    write_jsonl(tmp_path / "heldout.jsonl", [{"question": r["question"], "answer": r["answer"]} for r in heldout])
    tasks = load_collab_tasks(ensure_collab_tasks(tmp_path))
    peer = [t for t in tasks if t.family == "peer_check"]
    assert [t.messages[0]["content"] for t in peer] == [r["question"] for r in heldout]
    assert [t.gold for t in peer] == [r["answer"].rsplit("#### ", 1)[1] for r in heldout]
    drawn = (tmp_path / "collab.jsonl").read_text()
    write_jsonl(tmp_path / "collab.jsonl", [json.loads(drawn.splitlines()[0])])  # an older version's tasks
    ensure_collab_tasks(tmp_path)
    assert (tmp_path / "collab.jsonl").read_text() == drawn, "a stale file is drawn again"
    other = tmp_path / "other"
    other.mkdir()
    (other / "card.json").write_text(json.dumps({"seed": 4, "config": {"n_heldout": 6}}))
    (other / "heldout.jsonl").write_text((tmp_path / "heldout.jsonl").read_text())
    with pytest.raises(ValueError, match="is not what its card.s seed draws .*uturn testbed build --force"):
        ensure_collab_tasks(other)
    assert not (other / "collab.jsonl").exists()


@pytest.mark.slow
def test_uturn_collab_on_the_testbed_writes_its_files(real_testbed, tmp_path, monkeypatch, capsys):
    import shutil

    from uturn_train.cli import main as cli_main

    home = tmp_path / "home"
    shutil.copytree(real_testbed, home / "testbed")  # the fixture is read-only: resolve writes collab.jsonl here
    monkeypatch.setenv("UTURN_HOME", str(home))
    out = tmp_path / "out"
    cli_main(["collab", "--model", "testbed", "--task", "testbed", "--limit", "20", "--out", str(out)])
    result = json.loads((out / "results.json").read_text())
    assert result["config"]["data"] == str(home / "testbed" / "collab.jsonl")
    assert {f: s["n"] + s["errors"] for f, s in result["families"].items()} == {"info_gap": 20, "peer_check": 20}
    rows = [json.loads(line) for line in (out / "conversations.jsonl").read_text().splitlines()]
    assert len(rows) == 40 and all(r["ended"] in ("answered", "partner_ended", "max_turns") for r in rows)
    for r in rows:  # success is the gold final answer, whatever ended the conversation
        assert r["success"] == (r["final_answer"] is not None and float(r["final_answer"]) == float(r["gold"]))
    assert (out / "collab.png").read_bytes()[:4] == b"\x89PNG"
    assert "peer_check" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # a bad family is one clear line, before any model is loaded
        cli_main(["collab", "--model", "testbed", "--families", "chat", "--out", str(tmp_path / "bad")])
    assert "families ['chat']: choose among info_gap, peer_check" in capsys.readouterr().err


def test_tasks_without_oracle_lines_fail_for_the_oracle_partner(tmp_path):
    path = tmp_path / "bare.jsonl"
    write_jsonl(path, [{k: v for k, v in r.items() if k != "oracle"} for r in _tasks(4)])
    assert len(load_collab_tasks(path)) > 0  # a model partner needs no oracle lines
    with pytest.raises(ValueError, match="--probe_collab .*has no `oracle` lines"):
        load_collab_tasks(path, option="--probe_collab", oracle=True)

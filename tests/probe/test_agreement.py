"""`uturn agreement`: rules (and a scripted judge) against reference labels; figures checked by hand."""

import json

import pytest
from helpers.serve import ScriptedServer

from uturn_train import cli
from uturn_train.commands.agreement import main as agreement_main
from uturn_train.probe.validity.agreement import agreement, cohen_kappa, run_agreement

Q, A = "What is 3 + 4?", "3 + 4 = 7."
# (user turn, reference label). The rules get all but the last right: they call it a new topic.
ROWS = [
    ("Thanks! Can you also show it for 5 + 9?", "followup"),
    ("Sure! Here's how to add 3 and 4: start at 3, count on 4.", "identity_drift"),
    ("Thanks!", "acknowledgement"),
    ("", "empty"),
    ("What is 3 + 4?", "repetition"),
    ("What is the capital of France?", "new_topic"),
    ("the the the the the the the the the the the the the the the the", "degenerate"),
    ("Why?", "followup"),
    ("Can you explain why 3 + 4 is 7 and not 8?", "followup"),
]


@pytest.fixture
def labelled(tmp_path):
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps({"query": Q, "answer": A, "user_turn": t, "label": label}) + "\n"
                            for t, label in ROWS))
    return path


def test_cohen_kappa_textbook_example():
    # Two raters, 50 items: 20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no: p_o = 0.7, p_e = 0.5, kappa = 0.4.
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert cohen_kappa(["x"] * 3, ["x"] * 3) is None


def test_agreement_leaves_errors_out_and_marks_undefined_figures():
    figures = agreement(["followup", "followup", "new_topic", "empty"], ["followup", "new_topic", None, "followup"])
    assert figures["n"] == 3 and figures["errors"] == 1 and figures["accuracy"] == pytest.approx(1 / 3)
    assert figures["per_label"]["followup"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
    assert figures["per_label"]["empty"] == {"precision": None, "recall": 0.0, "f1": None, "support": 1}
    assert figures["per_label"]["new_topic"]["precision"] == 0.0 and figures["per_label"]["new_topic"]["f1"] is None
    assert figures["confusion"]["followup"]["new_topic"] == 1 and figures["confusion"]["empty"]["followup"] == 1


def test_rules_and_judge_against_reference(labelled, tmp_path, capsys):
    # The judge agrees with the reference, except that it calls the loop a repetition and never gets "Thanks!" right.
    def respond(path, body):
        if path.endswith("/models"):
            return 200, {"data": [{"id": "judge-model"}]}
        turn = json.loads(body["messages"][1]["content"])["user_turn"]
        label = {"Thanks!": "thanks", ROWS[6][0]: "repetition"}.get(turn, dict(ROWS)[turn])
        content = json.dumps({"label": label, "grounded": label == "followup"})
        return 200, {"choices": [{"message": {"role": "assistant", "content": content}}]}

    with ScriptedServer(respond) as fake:
        cli.main(["agreement", "--input", str(labelled), "--out", str(tmp_path / "out"), "--judge_base_url",
                  fake.base_url, "--judge_model", "judge-model", "--judge_cache_dir", str(tmp_path / "cache")])
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "agreement.json").read_text())
    rules, judge = report["labelers"]["rules"], report["labelers"]["judge"]

    assert rules["n"] == 9 and rules["errors"] == 0 and rules["accuracy"] == pytest.approx(8 / 9)
    assert rules["per_label"]["followup"] == pytest.approx({"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3})
    assert rules["per_label"]["new_topic"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3,
                                                             "support": 1})
    # p_o = 8/9; p_e = (3*2 [followup] + 1*2 [new_topic] + 5 * 1*1) / 81 = 13/81.
    assert rules["kappa"] == pytest.approx((72 - 13) / (81 - 13))
    assert rules["confusion"]["followup"] == {**dict.fromkeys(rules["confusion"], 0), "followup": 2, "new_topic": 1}

    assert judge["n"] == 8 and judge["errors"] == 1 and judge["accuracy"] == pytest.approx(7 / 8)
    assert judge["confusion"]["degenerate"]["repetition"] == 1 and judge["per_label"]["repetition"]["precision"] == 0.5
    assert report["judge"]["stats"]["errors"] == 1

    rows = [json.loads(line) for line in (tmp_path / "out" / "disagreements.jsonl").read_text().splitlines()]
    assert [r["user_turn"] for r in rows] == [ROWS[2][0], ROWS[6][0], ROWS[8][0]]
    assert "not one of" in rows[0]["judge_error"] and rows[1]["judge_label"] == "repetition"
    assert rows[2]["rules_label"] == "new_topic" and rows[2]["judge_label"] == "followup" and rows[2]["judge_grounded"]
    assert "| followup | 1.000 | 0.667 | 0.800 | 3 |" in printed and "### judge: n=8, errors=1" in printed


def test_rules_only_and_bad_input(labelled, tmp_path, capsys):
    report = run_agreement(labelled, tmp_path / "out")
    assert list(report["labelers"]) == ["rules"] and "judge" not in report
    bad = tmp_path / "bad.jsonl"
    bad.write_text(labelled.read_text() + json.dumps({"query": Q, "answer": A, "user_turn": "Hm", "label": "Followup"})
                   + "\n")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["agreement", "--input", str(bad), "--out", str(tmp_path / "out2")])
    assert exit_info.value.code == 2
    assert f"{bad}:10: label 'Followup' is not one of" in capsys.readouterr().err
    with pytest.raises(ValueError, match="both --judge_base_url and --judge_model"):
        agreement_main(["--input", str(labelled), "--judge_model", "m"])

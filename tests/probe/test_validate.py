"""`uturn validate`: perturbations with a predictable effect on the probe, checked on the real testbed and OASST."""

import json
import time
from pathlib import Path

import pytest
from helpers import ARITHMETIC

from uturn_train.cli import main as cli
from uturn_train.probe.rules.grounding import derangement
from uturn_train.probe.validity.perturbations import (
    DATA_CHECKS,
    GENERATION_CHECKS,
    GENERIC_QUESTIONS,
    NO_GROUNDING,
    judge_checks,
    load_contexts,
    perturbed,
    truncate_mid_sentence,
)
from uturn_train.tasks.base import Example


@pytest.mark.parametrize(
    "answer,truncated",
    [
        ("Noah is 6, so Tara is 6 * 9 = 54 years old now.\nIn 7 years she will be 61.\n#### 61",
         "Noah is 6, so Tara is 6 * 9 = 54"),
        # the half would end a sentence: cut one word earlier, inside it
        ("One two three four. Five six seven eight.", "One two three"),
        ("Yes.", ""),
    ],
)
def test_truncate_mid_sentence(answer, truncated):
    assert truncate_mid_sentence(answer) == truncated


def test_perturbed_answers_keep_ids_and_never_show_the_own_or_the_control_answer():
    examples = [Example(f"p{i}", f"query {i}?", f"Answer {i} is {i * 7}. That is all.") for i in range(9)]
    conditions = perturbed(examples, seed=3)
    assert list(conditions) == ["real", "shuffled", "emptied", "truncated"]
    control = derangement(len(examples), 3)
    for i, ex in enumerate(examples):
        row = {name: prompts[i] for name, prompts in conditions.items()}
        assert {p.id for p in row.values()} == {ex.id} and {p.query for p in row.values()} == {ex.query}
        assert row["shuffled"].answer not in (ex.answer, examples[control[i]].answer)
        assert row["emptied"].answer == "" and ex.answer.startswith(row["truncated"].answer)
    assert sorted(p.answer for p in conditions["shuffled"]) == sorted(ex.answer for ex in examples)


def test_judge_checks_on_oasst(shared_data):
    examples = load_contexts("oasst", str(shared_data / "oasst" / "en_100_tree.jsonl"))
    rates, checks = judge_checks(examples, seed=0)
    checks = {c["name"]: c for c in checks}
    assert [c["status"] for c in checks.values()] == ["pass"] * (3 + len(DATA_CHECKS)), checks
    assert checks["query pasted"]["n"] == 287 and checks["query pasted"]["rate"] == 1.0
    assert checks["generic questions"]["n"] == 287 * len(GENERIC_QUESTIONS)
    assert checks["generic questions"]["rate"] <= 0.02  # 0.006 when written
    # All 380 real next turns, follow-ups or not: 0.68 when written; each perturbation of the answer takes 0.1-0.2 off.
    assert checks["real next turns: grounded"]["n"] == 380 and checks["real next turns: grounded"]["rate"] >= 0.60
    for condition in ("shuffled", "emptied", "truncated"):
        assert rates[condition]["grounded"]["rate"] <= rates["real"]["grounded"]["rate"] - 0.05, rates


def _testbed_like(folder: Path, followup: str) -> Path:
    """heldout.jsonl + heldout_triples.jsonl, as a testbed build writes them, from the six fixture problems."""
    folder.mkdir()
    rows = [json.loads(line) for line in (ARITHMETIC).open()]
    (folder / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "heldout_triples.jsonl").write_text("".join(
        json.dumps({"query": r["question"], "answer": r["answer"], "followup": followup}) + "\n" for r in rows))
    return folder / "heldout.jsonl"


def test_a_model_that_grounds_nothing_and_generic_real_followups(tiny_qwen_dir, tmp_path, capsys):
    # The tiny random model writes no grounded follow-up: nothing for a perturbation to lower, so the perturbed answers
    # are not generated and the model's checks are n/a. The data's "real" next turns are a generic question: they are
    # not grounded, so the checks on them fail, and so does the command.
    data = _testbed_like(tmp_path / "tb", "Can you tell me more about that?")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        cli(["validate", "--model", str(tiny_qwen_dir), "--task", "testbed", "--data", str(data), "--samples", "2",
             "--max_new_tokens", "8", "--out", str(out)])
    assert exit_.value.code == 1
    report = json.loads((out / "validate.json").read_text())
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status["query pasted"] == status["generic questions"] == "pass"
    # ... and no perturbation of the answer can lower a rate of 0 (nor the follow-up rate of a generic question)
    assert report["failed"] == ["real next turns: grounded", *(title for title, *_ in DATA_CHECKS)]
    assert report["data_turns"]["real"]["grounded"]["rate"] == 0.0
    assert [status[title] for title, *_ in GENERATION_CHECKS] == ["n/a"] * len(GENERATION_CHECKS)
    assert list(report["new_turns"]) == ["real"]  # the perturbed answers were not generated
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 * 2 and {r["condition"] for r in rows} == {"real"}
    assert "failed**" in (out / "validate.md").read_text() and "real next turns" in capsys.readouterr().out


def test_bad_input_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli(["validate", "--model", "x", "--task", "testbed", "--data", str(tmp_path / "heldout.jsonl")])
    assert exit_.value.code == 2 and "heldout_triples.jsonl not found" in capsys.readouterr().err
    data = _testbed_like(tmp_path / "tb", "Why?")
    with pytest.raises(SystemExit):
        cli(["validate", "--model", "x", "--task", "testbed", "--data", str(data), "--limit", "2"])
    assert "--limit must be at least 3" in capsys.readouterr().err


@pytest.mark.slow
def test_validate_passes_its_predictions_on_the_testbed(real_testbed, tmp_path):
    # The "Done when": every prediction holds on the real testbed, none left n/a. 200 prompts x 8 samples at
    # T=1.0 per answer; the smallest predicted fall of the model's turns (shuffled answers, -0.04 in grounded rate on
    # all 500) had its interval at most -0.014 on every 200 of them. About 2 minutes on 2 cores.
    out = tmp_path / "out"
    start = time.perf_counter()
    cli(["validate", "--model", str(real_testbed), "--task", "testbed", "--data", str(real_testbed / "heldout.jsonl"),
         "--limit", "200", "--samples", "8", "--out", str(out)])  # a failed prediction exits non-zero
    report = json.loads((out / "validate.json").read_text())
    # Every prediction on the data holds. Since issue 17 a grounded follow-up of a word problem must take something
    # from its answer, and the testbed writes one at T=1.0 0.028 of the time [0.021, 0.037] (0.084 before): not above
    # NO_GROUNDING, so the checks on the model's own turns have no rate to lower and are n/a, with the reason.
    statuses = [c["status"] for c in report["checks"]]
    assert statuses == ["pass"] * (3 + len(DATA_CHECKS)) + ["n/a"] * len(GENERATION_CHECKS), report["checks"]
    assert all("nothing for a perturbation to lower" in c["measured"] for c in report["checks"][3 + len(DATA_CHECKS):])
    assert report["n_contexts"] == report["n_turns"] == 500 and report["n_prompts"] == 200
    real = report["new_turns"]["real"]
    assert real["grounded"]["n"] == 1600 and 0 < real["grounded"]["rate"] <= NO_GROUNDING
    print(f"uturn validate on the testbed: {time.perf_counter() - start:.0f} s")

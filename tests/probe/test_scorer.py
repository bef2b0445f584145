"""The scorer that must confirm a grounded turn reacts to its own answer (`probe/labelers/scorer.py`, issue 17)."""

import json
import math

import pytest
import torch

from uturn_train.chat import user_turn_prompt
from uturn_train.models import load_model, load_tokenizer
from uturn_train.probe.labelers.scorer import AnswerScorer, Score
from uturn_train.probe.rules.grounding import ground_rows
from uturn_train.probe.runner import run_probe
from uturn_train.probe.settings import ProbeSettings
from uturn_train.tasks import load_task

QUERY = "Ana has 3 boxes of 8 apples. How many apples does she have?"
OWN, OTHER = "3 * 8 = 24. She has 24 apples.", "Ben reads 5 books a week, so 20 books in 4 weeks."


@pytest.fixture(scope="module")
def tiny(tiny_qwen_dir):
    return load_model(str(tiny_qwen_dir), dtype="float32"), load_tokenizer(str(tiny_qwen_dir))


def _full_forward_nll(model, tokenizer, answer: str, turn_ids: list[int]) -> float:
    prompt = user_turn_prompt(tokenizer, [{"role": "user", "content": QUERY}, {"role": "assistant", "content": answer}])
    context = tokenizer(prompt, add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = model(torch.tensor([context + turn_ids])).logits[0, len(context) - 1 : -1]
    return -torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(turn_ids)[:, None]).mean().item()


def test_cached_contexts_score_as_a_full_forward_on_a_hybrid_model(tiny):
    # The context's cache is reused across turns; on Qwen3.5 (Gated DeltaNet layers hold a recurrent state, which
    # cannot be cropped back) a reuse that leaked one turn into the next would change every later score.
    model, tokenizer = tiny
    scorer = AnswerScorer(model, tokenizer)
    for turn in ("How did you get 24?", "Why 8?", "ok"):
        ids = tokenizer(turn, add_special_tokens=False).input_ids + scorer.end_ids
        score = scorer.score(QUERY, OWN, turn, OTHER)
        own, other = (_full_forward_nll(model, tokenizer, a, ids) for a in (OWN, OTHER))
        assert score.nll == pytest.approx(own, abs=1e-4)
        assert score.gain == pytest.approx(other - own, abs=1e-4)
    assert scorer.score(QUERY, OWN, "How did you get 24?", OTHER) == scorer.score(QUERY, OWN, "How did you get 24?",
                                                                                     OTHER)
    assert scorer.scored == 5


def test_the_thresholds_decide(tiny):
    scorer = AnswerScorer(*tiny, min_gain=0.5, max_nll=3.0)
    assert scorer.rejects(Score(gain=0.6, nll=2.0)) is None
    assert "barely explains" in scorer.rejects(Score(gain=0.4, nll=2.0))
    assert "incoherent" in scorer.rejects(Score(gain=2.0, nll=3.5))


def test_the_probe_only_ungrounds_and_says_why(tiny, shared_data):
    model, tokenizer = tiny
    examples = load_task("gsm8k", str(shared_data / "gsm8k" / "test.jsonl"))[:6]
    settings = ProbeSettings(labeler="rules", temperatures=[1.0], samples=3, max_new_tokens=8, answer_max_new_tokens=12)
    rules = run_probe(model, tokenizer, examples, settings, disable_progress=True)
    lenient = AnswerScorer(model, tokenizer, min_gain=-math.inf, max_nll=math.inf)
    same = run_probe(model, tokenizer, examples, settings, disable_progress=True, scorer=lenient)
    assert [r["grounded"] for r in same.rows] == [r["grounded"] for r in rules.rows]
    assert same.summary["scorer"]["turns_scored"] == sum(bool(r["grounded"]) for r in rules.rows)
    strict = AnswerScorer(model, tokenizer, min_gain=math.inf)
    run = run_probe(model, tokenizer, examples, settings, disable_progress=True, scorer=strict)
    for before, after in zip(rules.rows, run.rows):
        assert after["label"] == before["label"]  # the scorer decides grounded only
        assert (after["scorer_gain"] is not None) == bool(before["grounded"])
        assert not after["grounded"] and (after["scorer_reason"] is not None) == bool(before["grounded"])
    assert run.summary["settings"][0]["grounded_followup_rate"] == 0.0


def test_ground_rows_applies_the_scorer_with_the_mismatched_answer(tiny):
    class Recorded(AnswerScorer):
        def score(self, *args):
            self.calls.append(args)
            return super().score(*args)

    rows = [{"query": QUERY, "answer": OWN, "user_turn": "How did you get 24?"},
            {"query": "Ben reads 5 books a week. How many in 4 weeks?", "answer": OTHER, "user_turn": "Why 20 books?"}]
    rules = ground_rows(rows)
    assert any(g.grounded for g in rules), "the rules must ground one of these for the test to mean anything"
    strict = Recorded(*tiny, min_gain=math.inf, max_nll=math.inf)
    strict.calls = []
    scored = ground_rows(rows, scorer=strict)
    assert not any(g.grounded for g in scored)
    assert all("barely explains" in g.reason for g, r in zip(scored, rules) if r.grounded)
    # Each grounded turn against its own query with the other conversation's answer (two contexts: each other's).
    assert strict.calls == [(r["query"], r["answer"], r["user_turn"], rows[1 - i]["answer"])
                            for i, (r, g) in enumerate(zip(rows, rules)) if g.grounded]


def test_uturn_classify_takes_a_scorer(tiny_qwen_dir, tmp_path):
    from uturn_train.cli import main as cli
    from uturn_train.probe.labelers.scorer import load_scorer

    rows = [{"query": QUERY, "answer": OWN, "user_turn": "How did you get 24?"},
            {"query": QUERY, "answer": OWN, "user_turn": "Why 3 boxes?"},
            {"query": "Ben reads 5 books a week. How many in 4 weeks?", "answer": OTHER, "user_turn": "Why 20 books?"}]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli(["classify", "--input", str(src), "--output", str(dst), "--scorer", str(tiny_qwen_dir)])
    expected = ground_rows(rows, 0, scorer=load_scorer(str(tiny_qwen_dir)))
    assert [json.loads(line)["grounded"] for line in dst.read_text().splitlines()] == [g.grounded for g in expected]
    assert load_scorer(str(tiny_qwen_dir)).scored >= sum(g.grounded for g in ground_rows(rows, 0)) > 0


def test_a_scorer_that_cannot_load_fails_before_anything_is_written(tmp_path):
    from uturn_train.commands.classify import classify_file

    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"query": QUERY, "answer": OWN, "user_turn": "How did you get 24?"}) + "\n"
                   + json.dumps({"query": "Q2?", "answer": OTHER, "user_turn": "Why 20?"}) + "\n")
    with pytest.raises(ValueError, match=r"^--scorer .*missing \(probe_scorer in a recipe\): could not load"):
        classify_file(str(src), str(dst), scorer=str(tmp_path / "missing"))
    assert not dst.exists()

"""The LLM judge against a scripted OpenAI-style server: strict parsing, retries, cache, error counting, keys."""

import json
import re
from pathlib import Path

import pytest
from helpers.serve import ScriptedServer

from uturn_train.probe.labelers import llm_judge
from uturn_train.probe.labelers.llm_judge import RUBRIC, RUBRIC_VERSION, Judge, JudgeError, JudgeVerdict, parse_reply
from uturn_train.probe.rules.classify import LABELS

ITEMS = [
    ("What is 3 + 4?", "3 + 4 = 7.", "Thanks! Can you also show it for 5 + 9?"),
    ("What is 3 + 4?", "3 + 4 = 7.", "Sure! Here's how to add 3 and 4."),
    ("Name a fruit.", "An apple.", "Thanks!"),
    ("Name a fruit.", "An apple.", ""),
]


def chat(content: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}


def verdict_json(label: str, grounded: bool = False, **extra) -> str:
    return json.dumps({"label": label, "grounded": grounded, "reason": "scripted", **extra})


class Script:
    """Replies by user turn: `replies[turn]` is a list of (status, content or payload[, delay]) used in turn; the
    last one repeats. The model list names `judge-model`."""

    def __init__(self, replies: dict):
        self.replies, self.seen = replies, {}

    def __call__(self, path, body):
        if path.endswith("/models"):
            return 200, {"data": [{"id": "judge-model"}, {"id": "other"}]}
        turn = json.loads(body["messages"][1]["content"])["user_turn"]
        n = self.seen[turn] = self.seen.get(turn, 0) + 1
        status, content, *delay = self.replies[turn][min(n, len(self.replies[turn])) - 1]
        return (status, chat(content) if status == 200 and isinstance(content, str) else content, *delay)


def judge_for(fake, tmp_path, **kwargs) -> Judge:
    kwargs = {"cache_dir": tmp_path / "cache", "concurrency": 2, "retries": 2, "backoff": 0.01, **kwargs}
    return Judge(fake.base_url, "judge-model", **kwargs)


def test_parse_reply_is_strict():
    assert parse_reply('{"label": "followup", "grounded": true, "reason": "asks about 7"}') == JudgeVerdict(
        "followup", True, "asks about 7")
    assert parse_reply('```json\n{"label": "empty", "grounded": false}\n```') == JudgeVerdict("empty", False, "")
    for bad, why in [
        ("followup", "not one JSON object"),
        ('{"label": "followup", "grounded": true} and more', "not one JSON object"),
        ('["followup", true]', "not an object"),
        ('{"label": "follow-up", "grounded": true}', "not one of"),
        ('{"label": "followup", "grounded": "true"}', "true or false"),
        ('{"label": "followup", "grounded": 1}', "true or false"),
        ('{"label": "followup", "grounded": true, "confidence": 0.9}', "unexpected keys"),
        ('{"label": "followup", "grounded": true, "reason": 3}', "reason must be a string"),
        (None, "no text content"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_reply(bad)


def test_rubric_lists_the_classifiers_labels_and_the_reply_accepts_each():
    # The judge replies with the labels its rubric lists, in the order they apply: exactly the classifier's, or the
    # judge's rates would count labels the probe does not know.
    listed = re.findall(r"^- \*\*(\w+)\*\*:", RUBRIC, re.MULTILINE)
    offered = re.search(r'"label": "<one of: ([^>]+)>"', RUBRIC).group(1).split(", ")
    assert sorted(listed) == sorted(offered) == sorted(LABELS), (listed, offered)
    for label in LABELS:
        assert parse_reply(json.dumps({"label": label, "grounded": label == "followup"})).label == label
    # One definition: the judge is sent the reading rubric itself, the file the labels of tests/data follow.
    assert (Path(llm_judge.__file__).with_name("rubric.md").read_text().strip() in RUBRIC
            and RUBRIC_VERSION == "2")


def test_replies_retries_errors_and_cache(tmp_path):
    script = Script({
        ITEMS[0][2]: [(200, verdict_json("followup", True))],
        # Malformed, then right once it is told what was wrong.
        ITEMS[1][2]: [(200, "identity_drift"), (200, verdict_json("identity_drift"))],
        # Two server errors, then an answer.
        ITEMS[2][2]: [(500, {"error": "boom"}), (503, {"error": "busy"}), (200, verdict_json("acknowledgement"))],
        # Never a valid label.
        ITEMS[3][2]: [(200, verdict_json("blank"))],
    })
    with ScriptedServer(script) as fake:
        judge = judge_for(fake, tmp_path)
        results = judge.label_many(ITEMS, disable_progress=True)
        assert [(r.label, r.grounded, r.cached) for r in results[:3]] == [
            ("followup", True, False), ("identity_drift", False, False), ("acknowledgement", False, False)]
        assert isinstance(results[3], JudgeError) and "is not one of" in results[3].error
        # The judge's second try carries its bad reply and the problem.
        retry = [b for b in fake.posts("/chat/completions") if len(b["messages"]) == 4]
        assert retry[0]["messages"][2] == {"role": "assistant", "content": "identity_drift"}
        assert "not one JSON object" in retry[0]["messages"][3]["content"]
        assert all(b["model"] == "judge-model" and b["temperature"] == 0.0 for b in fake.posts("/chat/completions"))
        assert judge.stats == {"requests": 1 + 2 + 3 + 2, "cache_hits": 0, "errors": 1}

        # A new judge on the same cache (a rerun): verdicts come from disk; only the error is asked again.
        sent = len(fake.posts("/chat/completions"))
        rerun = judge_for(fake, tmp_path)
        again = rerun.label_many(ITEMS, disable_progress=True)
        assert [(r.label, r.cached) for r in again[:3]] == [(r.label, True) for r in results[:3]]
        assert len(fake.posts("/chat/completions")) == sent + 2 and rerun.stats["cache_hits"] == 3

        # Without the failing turn, a rerun makes no request at all, not even the model check.
        before = len(fake.requests)
        third = judge_for(fake, tmp_path)
        assert [r.label for r in third.label_many(ITEMS[:3], disable_progress=True)] == [r.label for r in results[:3]]
        assert len(fake.requests) == before and third.stats == {"requests": 0, "cache_hits": 3, "errors": 0}
        # Another judge model or rubric version is another key.
        assert judge_for(fake, tmp_path).key(*ITEMS[0]) != Judge(fake.base_url, "other",
                                                                  cache_dir=tmp_path / "x").key(*ITEMS[0])


def test_timeouts_are_retried_then_counted(tmp_path):
    script = Script({
        ITEMS[0][2]: [(200, verdict_json("followup"))],
        ITEMS[1][2]: [(200, verdict_json("identity_drift"), 1.0), (200, verdict_json("identity_drift"))],
        ITEMS[2][2]: [(200, verdict_json("acknowledgement"), 1.0)],
    })
    with ScriptedServer(script) as fake:
        judge = judge_for(fake, tmp_path, timeout=0.3, retries=1)
        results = judge.label_many(ITEMS[:3], disable_progress=True)
    assert [getattr(r, "label", None) for r in results] == ["followup", "identity_drift", None]
    assert "ReadTimeout" in results[2].error and judge.stats["errors"] == 1


def test_identical_turns_are_asked_once(tmp_path):
    with ScriptedServer(Script({ITEMS[2][2]: [(200, verdict_json("acknowledgement"))]})) as fake:
        judge = judge_for(fake, tmp_path)
        results = judge.label_many([ITEMS[2]] * 5, disable_progress=True)
        assert [r.label for r in results] == ["acknowledgement"] * 5 and len(fake.posts("/chat/completions")) == 1


def test_a_crash_mid_write_loses_only_the_partial_line(tmp_path):
    with ScriptedServer(Script({t: [(200, verdict_json("followup"))] for _, _, t in ITEMS})) as fake:
        judge_for(fake, tmp_path).label_many(ITEMS[:2], disable_progress=True)
        cache = tmp_path / "cache" / "verdicts.jsonl"
        with open(cache, "a") as f:
            f.write('{"key": "abc", "label": "foll')  # killed while writing
        judge = judge_for(fake, tmp_path)
        assert cache.read_text().endswith("}\n")  # the partial line is gone, so the next append starts a line
        results = judge.label_many(ITEMS, disable_progress=True)
        assert judge.stats["cache_hits"] == 2 and len(fake.posts("/chat/completions")) == 4
    assert [r.cached for r in results] == [True, True, False, False]
    assert len([json.loads(line) for line in cache.read_text().splitlines()]) == 4
    cache.write_text(cache.read_text().replace('"label"', '"lab', 1))
    with pytest.raises(ValueError, match="verdicts.jsonl:1: not a cache record"):
        judge_for(fake, tmp_path)


def test_key_is_sent_and_never_written(tmp_path, monkeypatch):
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("MY_JUDGE_KEY", secret)
    with ScriptedServer(Script({t: [(200, verdict_json("followup"))] for _, _, t in ITEMS})) as fake:
        judge = judge_for(fake, tmp_path, api_key_env="MY_JUDGE_KEY")
        judge.label_many(ITEMS, disable_progress=True)
        headers = [h for *_, h in fake.requests]
    assert all(h.get("Authorization") == f"Bearer {secret}" for h in headers)
    assert not any(secret in p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert secret not in repr(vars(judge))
    with pytest.raises(ValueError, match="NOT_SET_ANYWHERE, which is not set"):
        Judge(fake.base_url, "judge-model", api_key_env="NOT_SET_ANYWHERE", cache_dir=tmp_path)


def test_bad_configuration_fails_before_judging(tmp_path):
    with ScriptedServer(Script({t: [(401, {"error": "invalid api key"})] for _, _, t in ITEMS})) as fake:
        with pytest.raises(ValueError, match="does not serve 'gpt-9'"):
            Judge(fake.base_url, "gpt-9", cache_dir=tmp_path).label_many(ITEMS, disable_progress=True)
        with pytest.raises(ValueError, match="rejects the request: .*HTTP 401"):
            judge_for(fake, tmp_path).label_many(ITEMS, disable_progress=True)
        assert len(fake.posts("/chat/completions")) == 1  # one try, not one per turn

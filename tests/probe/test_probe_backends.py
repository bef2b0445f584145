"""The probe through a server and with an LLM judge: `uturn probe --backend server` against a real `transformers serve`
gives what the local backend gives; failed requests become error rows left out of every rate; `--labeler both|judge`
against a scripted judge, its cache, and the callback's `probe_labeler`."""

import json
from pathlib import Path

import pytest
from helpers import ARITHMETIC
from helpers.serve import ScriptedServer, TransformersServer

from uturn_train.cli import main as cli
from uturn_train.probe.rules.classify import LABELS
from uturn_train.probe.runner import run_probe
from uturn_train.probe.settings import ProbeSettings
from uturn_train.tasks import load_task

FIXTURE = ARITHMETIC  # GSM8K format, in the repo


def read_out(out: Path) -> tuple[dict, list[dict]]:
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return json.loads((out / "results.json").read_text()), rows


def keys(obj, prefix=""):
    """Every key path of a JSON object: two results of the same schema have the same set."""
    if isinstance(obj, dict):
        return {p for k, v in obj.items() for p in {prefix + k} | keys(v, prefix + k + ".")}
    if isinstance(obj, list) and obj and isinstance(obj[0], dict):
        return set().union(*(keys(v, prefix + "[].") for v in obj))
    return set()


def assert_same_greedy_turns(local_rows, server_rows):
    """Greedy rows equal; `transformers serve` does not say which end token stopped a turn, so a turn that ended by
    opening `<|im_start|>` arrives without it (docs/server.md)."""
    greedy = [(a, b) for a, b in zip(local_rows, server_rows) if a["temperature"] == 0]
    assert greedy and len(local_rows) == len(server_rows)
    for a, b in greedy:
        assert (b["id"], b["answer"], b["finish_reason"], b["completion_tokens"]) == (
            a["id"], a["answer"], a["finish_reason"], a["completion_tokens"])
        if a["user_turn"] == b["user_turn"] + "<|im_start|>":
            continue
        assert (b["user_turn"], b["label"], b["grounded"]) == (a["user_turn"], a["label"], a["grounded"])
    return sum(a["user_turn"] == b["user_turn"] for a, b in greedy), len(greedy)


@pytest.fixture(scope="module")
def tiny_server(tiny_qwen_dir, tmp_path_factory):
    server = TransformersServer(tiny_qwen_dir, tmp_path_factory.mktemp("serve") / "server.log").start()
    yield server
    server.stop()


def test_server_backend_gives_the_local_backends_results(tiny_qwen_dir, tiny_server, tmp_path):
    common = ["probe", "--model", str(tiny_qwen_dir), "--labeler", "rules",
        "--task", "gsm8k", "--data", str(FIXTURE), "--limit", "4",
              "--temperatures", "0", "1.0", "--samples", "2", "--max_new_tokens", "24", "--answer_max_new_tokens",
              "24", "--batch_size", "4"]
    cli([*common, "--out", str(tmp_path / "hf")])
    cli([*common, "--out", str(tmp_path / "server"), "--backend", "server", "--base_url", tiny_server.base_url,
         "--concurrency", "2"])
    (local, local_rows), (remote, remote_rows) = read_out(tmp_path / "hf"), read_out(tmp_path / "server")
    assert keys(remote) - keys(local) == {"server", "server.flavour", "server.requests", "server.errors"}
    assert keys(local) <= keys(remote) and [set(r) for r in remote_rows] == [set(r) for r in local_rows]
    # 4 answers, 4 greedy turns and 4 x 2 samples: one request each, none failed.
    assert remote["server"] == {"flavour": "transformers", "requests": 16, "errors": 0}
    assert [s["n"] for s in remote["settings"]] == [4, 8] and all(s["errors"] == 0 for s in remote["settings"])
    assert remote["accuracy"] == local["accuracy"] and remote["config"]["backend"] == "server"
    assert_same_greedy_turns(local_rows, remote_rows)
    assert all(r["finish_reason"] in ("stop", "length") and r["error"] is None for r in remote_rows)
    assert (tmp_path / "server" / "followup_vs_temperature.png").exists()


def test_bad_backend_options_fail_before_the_run(tiny_qwen_dir, tmp_path, capsys):
    base = ["probe", "--model", str(tiny_qwen_dir), "--labeler", "rules", "--task", "gsm8k", "--data", str(FIXTURE),
            "--out", str(tmp_path / "out")]
    for extra, expected in [
        (["--backend", "server"], "--backend server needs --base_url"),
        (["--base_url", "http://127.0.0.1:9/v1"], "--base_url needs --backend server"),
        (["--labeler", "both"], "needs judge_base_url and judge_model"),
        (["--backend", "server", "--base_url", "http://127.0.0.1:9/v1", "--server_api_key_env", "NOT_SET_HERE"],
         "NOT_SET_HERE, which is not set"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            cli([*base, *extra])
        assert exit_info.value.code == 2 and expected in capsys.readouterr().err, extra
    assert not (tmp_path / "out" / "results.json").exists()


# --- a scripted server: completions (vLLM-style) and a judge, to decide every reply --------------------------------
ANSWER_HEADER = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


class Scripted:
    """Answers `answers[query]` (status 500 for `FAIL`), user turns `turns[query]`; the judge labels a turn with
    `verdicts[turn]` ((label, grounded), or a malformed reply for `BAD`). Counts the seeds sent."""

    FAIL, BAD = object(), object()

    def __init__(self, answers: dict, turns: dict, verdicts: dict):
        self.answers, self.turns, self.verdicts, self.seeds = answers, turns, verdicts, []

    def __call__(self, path, body):
        if path.endswith("/models"):
            return 200, {"data": [{"id": "served"}, {"id": "judge-model"}]}
        if path.endswith("/chat/completions"):
            turn = json.loads(body["messages"][1]["content"])["user_turn"]
            verdict = self.verdicts[turn]
            content = "not json" if verdict is self.BAD else json.dumps(
                {"label": verdict[0], "grounded": verdict[1], "reason": "scripted"})
            return 200, {"choices": [{"message": {"role": "assistant", "content": content}}]}
        prompt = body["prompt"]
        if body["max_tokens"] > 1:  # not the preflight request
            self.seeds.append((body["temperature"], body["seed"]))
        query = next((q for q in self.answers if f"<|im_start|>user\n{q}<|im_end|>" in prompt), None)
        text = self.answers.get(query) if prompt.endswith(ANSWER_HEADER) else self.turns.get(query)
        if text is self.FAIL:
            return 500, {"error": "scripted failure"}
        return 200, {"choices": [{"text": text or "", "finish_reason": "stop", "stop_reason": None}],
                     "usage": {"completion_tokens": 3}}


def test_failed_requests_and_judge_errors_are_error_rows(tiny_qwen_dir, tmp_path):
    from transformers import AutoTokenizer

    from uturn_train.server import CompletionsClient

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    examples = load_task("gsm8k", data=str(FIXTURE))[:5]
    q = [ex.query for ex in examples]
    script = Scripted(
        answers={q[0]: "36 - 5 = 31.\n#### 31", q[1]: "48 - 29 = 19.\n#### 19", q[2]: Scripted.FAIL,
                 q[3]: "It is 12.\n#### 12", q[4]: "#### 1"},
        turns={q[0]: "Why did you subtract 5 from 36?", q[1]: "Thanks!", q[3]: Scripted.FAIL,
               q[4]: "Next question: what is 2 + 2?"},
        verdicts={"Why did you subtract 5 from 36?": ("followup", True), "Thanks!": ("acknowledgement", False),
                  "Next question: what is 2 + 2?": Scripted.BAD},
    )
    with ScriptedServer(script) as fake:
        settings = ProbeSettings(temperatures=[0.0, 0.7, 1.0], samples=2, labeler="judge",
                                 judge_base_url=fake.base_url, judge_model="judge-model",
                                 judge_cache_dir=str(tmp_path / "cache"))
        client = CompletionsClient(fake.base_url, tokenizer, model="served", retries=0).check()
        run = run_probe(None, tokenizer, examples, settings, client=client, disable_progress=True)

    # The failed answer: noted, left out of accuracy, and all its user turns (1 + 2 + 2) are error rows.
    assert run.answers[2]["answer_error"].startswith("HTTP 500") and run.answers[2]["answer_correct"] is None
    assert run.summary["answer_errors"] == 1 and run.summary["accuracy"] == 0.5  # 2 of the 4 answers are right
    by_prompt = {i: [r for r in run.rows if r["index"] == i] for i in range(5)}
    assert all(r["label"] is None and r["error"].startswith("answer failed: HTTP 500") and r["user_prompt"] is None
               for r in by_prompt[2]) and len(by_prompt[2]) == 5
    # A failed user turn keeps its row, its error and its prompt; it is not sent to the judge.
    assert all(r["label"] is None and r["finish_reason"] == "error" and r["error"].startswith("HTTP 500")
               and r["rules_label"] is None for r in by_prompt[3])
    # labeler judge: `label` is the judge's, the rules' rides along; a malformed verdict is an error row too.
    assert {(r["label"], r["rules_label"]) for r in by_prompt[0]} == {("followup", "followup")}
    assert {(r["label"], r["grounded"]) for r in by_prompt[1]} == {("acknowledgement", False)}
    assert all(r["label"] is None and r["rules_label"] == "new_topic" and "judge: no valid reply" in r["error"]
               for r in by_prompt[4])
    # Per temperature: 5 rows, 2 labelled (prompts 0 and 1); the rates are over those 2.
    for s in run.summary["settings"]:
        k = s["samples"]
        assert (s["n"], s["errors"]) == (2 * k, 3 * k)
        assert s["followup_rate"] == 0.5 and s["grounded_followup_rate"] == 0.5
        assert s["categories"]["acknowledgement"] == 0.5
    assert run.summary["server"] == {"flavour": "vllm", "requests": 5 + 4 * 5, "errors": 1 + 5}
    assert run.summary["judge"] == {"model": "judge-model", "rubric_version": "2", "requests": 2 + 2,
                                    "cache_hits": 0, "errors": 5}
    # Seeds: one per request, and no two sampled requests share one across temperatures.
    sampled = [seed for t, seed in script.seeds if t > 0]
    assert len(sampled) == len(set(sampled)) == 4 * 2 * 2


def test_runs_with_different_seeds_send_no_sampled_seed_twice(tiny_qwen_dir):
    from transformers import AutoTokenizer

    from uturn_train.server import CompletionsClient

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    examples = load_task("gsm8k", data=str(FIXTURE))[:3]
    seeds = {}
    for seed in (0, 1):
        script = Scripted(answers={ex.query: "#### 1" for ex in examples}, turns={ex.query: "Why?" for ex in examples},
                          verdicts={})
        with ScriptedServer(script) as fake:
            client = CompletionsClient(fake.base_url, tokenizer, model="served", retries=0).check()
            run_probe(None, tokenizer, examples, ProbeSettings(temperatures=[1.0], samples=4, labeler="rules",
                                                                seed=seed), client=client, disable_progress=True)
        seeds[seed] = {s for t, s in script.seeds if t > 0}
    # Consecutive seeds once shared k - 1 of every prompt's k request seeds (`seed + i * k + j`).
    assert len(seeds[0]) == len(seeds[1]) == 3 * 4 and not seeds[0] & seeds[1]


def test_server_key_comes_from_the_environment_and_is_never_written(tiny_qwen_dir, tmp_path, monkeypatch):
    secret = "sk-server-0123456789"
    monkeypatch.setenv("MY_SERVER_KEY", secret)
    examples = load_task("gsm8k", data=str(FIXTURE))[:2]
    script = Scripted(answers={ex.query: "#### 1" for ex in examples}, turns={ex.query: "Why?" for ex in examples},
                      verdicts={})

    def guarded(path, body):  # like `vllm serve --api-key`
        if fake.requests[-1][3].get("Authorization") != f"Bearer {secret}":
            return 401, {"error": "Unauthorized"}
        return script(path, body)

    with ScriptedServer(guarded) as fake:
        cli(["probe", "--model", str(tiny_qwen_dir), "--labeler", "rules",
            "--task", "gsm8k", "--data", str(FIXTURE), "--limit", "2",
             "--temperatures", "0", "--backend", "server", "--base_url", fake.base_url, "--served_model", "served",
             "--server_api_key_env", "MY_SERVER_KEY", "--out", str(tmp_path / "out")])
    results, rows = read_out(tmp_path / "out")
    assert results["server"]["errors"] == 0 and [r["user_turn"] for r in rows] == ["Why?", "Why?"]
    assert results["config"]["served_model"] == "served"
    assert not any(secret in f.read_text() for f in (tmp_path / "out").iterdir() if f.suffix in (".json", ".jsonl"))


def test_labeler_both_writes_both_labels_and_a_rerun_asks_nothing(tiny_qwen_dir, tmp_path):
    # The judge labels by length (it only has to be deterministic and differ from the rules now and then).
    def verdict(turn):
        label = LABELS[len(turn) % len(LABELS)]
        return label, label == "followup" and len(turn) % 2 == 0

    def judge(path, body):
        if path.endswith("/models"):
            return 200, {"data": [{"id": "judge-model"}]}
        label, grounded = verdict(json.loads(body["messages"][1]["content"])["user_turn"])
        content = json.dumps({"label": label, "grounded": grounded, "reason": "by length"})
        return 200, {"choices": [{"message": {"role": "assistant", "content": content}}]}

    with ScriptedServer(judge) as fake:
        args = ["probe", "--model", str(tiny_qwen_dir), "--labeler", "rules",
            "--task", "gsm8k", "--data", str(FIXTURE), "--limit", "4",
                "--temperatures", "0", "1.0", "--samples", "2", "--max_new_tokens", "12", "--answer_max_new_tokens",
                "12", "--labeler", "both", "--judge_base_url", fake.base_url, "--judge_model", "judge-model",
                "--judge_cache_dir", str(tmp_path / "cache")]
        cli([*args, "--out", str(tmp_path / "first")])
        asked = len(fake.posts("/chat/completions"))
        cli([*args, "--out", str(tmp_path / "rerun")])
        assert len(fake.posts("/chat/completions")) == asked  # every verdict from the cache
    (first, rows), (rerun, rerun_rows) = read_out(tmp_path / "first"), read_out(tmp_path / "rerun")
    assert len(rows) == 12 and 0 < asked <= 12  # identical turns are asked once
    assert first["judge"] == {"model": "judge-model", "rubric_version": "2", "requests": asked, "cache_hits": 0,
                              "errors": 0}
    assert rerun["judge"] == {**first["judge"], "requests": 0, "cache_hits": 12}
    assert [r["judge_label"] for r in rerun_rows] == [r["judge_label"] for r in rows]
    for r in rows:  # rules' label and grounded, and the judge's beside them
        assert r["label"] in LABELS and isinstance(r["grounded"], bool)
        assert (r["judge_label"], r["judge_grounded"]) == verdict(r["user_turn"]) and r["judge_error"] is None
    assert any(r["label"] != r["judge_label"] for r in rows)
    for s in first["settings"]:
        of_t = [r for r in rows if r["temperature"] == s["temperature"]]
        assert s["followup_rate"] == sum(r["label"] == "followup" for r in of_t) / len(of_t)
        judged = s["judge"]
        assert judged["n"] == len(of_t) and judged["errors"] == 0
        assert judged["followup_rate"] == sum(r["judge_label"] == "followup" for r in of_t) / len(of_t)
        assert judged["grounded_followup_rate"] == sum(r["judge_grounded"] for r in of_t) / len(of_t)
        assert judged["ci95"][0] <= judged["followup_rate"] <= judged["ci95"][1]
    assert first["config"]["labeler"] == "both" and "judge-model" == first["config"]["judge_model"]


def test_mining_has_no_llm_judge_options():
    from uturn_train.training.mining import MiningArguments

    names = set(MiningArguments.__dataclass_fields__)
    assert "mine_samples" in names and "mine_labeler" in names and not any("judge" in n for n in names)


@pytest.mark.slow
def test_server_backend_on_the_real_testbed(real_testbed, tmp_path, monkeypatch):
    """The issue's acceptance command: `--model testbed --task testbed --backend server` against `transformers serve`
    of the built testbed; greedy turns equal the local backend's."""
    monkeypatch.setenv("UTURN_HOME", str(real_testbed.parent))
    server = TransformersServer(real_testbed, tmp_path / "server.log").start()
    try:
        common = ["probe", "--model", "testbed", "--task", "testbed", "--limit", "48", "--temperatures", "0", "1.0",
                  "--samples", "2"]
        cli([*common, "--out", str(tmp_path / "hf")])
        cli([*common, "--out", str(tmp_path / "server"), "--backend", "server", "--base_url", server.base_url,
             "--concurrency", "4"])
    finally:
        server.stop()
    (local, local_rows), (remote, remote_rows) = read_out(tmp_path / "hf"), read_out(tmp_path / "server")
    assert keys(remote) - keys(local) == {"server", "server.flavour", "server.requests", "server.errors"}
    assert [set(r) for r in remote_rows] == [set(r) for r in local_rows]
    same, n = assert_same_greedy_turns(local_rows, remote_rows)
    assert n == 48 and same == 48
    assert remote["accuracy"] == local["accuracy"] and remote["settings"][0] == local["settings"][0]
    assert remote["server"]["errors"] == 0 and remote["settings"][1]["n"] == 96

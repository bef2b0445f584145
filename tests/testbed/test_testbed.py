import hashlib
import json
import random
from pathlib import Path

import pytest

from uturn_train import testbed
from uturn_train.testbed import build as build_module
from uturn_train.testbed import build_testbed
from uturn_train.testbed.build import render
from uturn_train.testbed.turns import conversation
from uturn_train.testbed.world import SCENARIOS, sample_problem

FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
         "train.jsonl", "heldout.jsonl", "heldout_triples.jsonl", "conversations.jsonl", "card.json", "CARD.md"]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    return build_testbed(tmp_path_factory.mktemp("testbed") / "tb", smoke=True, seed=0)


def test_world_solutions_are_right():
    rng = random.Random(0)
    problems = [sample_problem(rng) for _ in range(400)]
    assert {p.scenario for p in problems} == set(SCENARIOS)
    for problem in problems:
        for step in problem.steps:
            assert eval(step.expr.replace("/", "//")) == step.value > 0
            assert f"{step.expr} = {step.value}" in problem.solution
        assert problem.solution.endswith(f"#### {problem.answer}")
        knob = sorted(problem.knobs)[0]
        variant = problem.with_number(knob, problem.numbers[knob] + 1)
        if variant is not None:  # same wording, one number changed, solved again
            assert variant.numbers == {**problem.numbers, knob: problem.numbers[knob] + 1}
            assert variant.words == problem.words


def test_render_matches_the_real_template(smoke):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smoke)
    rng = random.Random(1)
    mixture = {"single": 1, "new_problem": 1, "followup": 1, "acknowledgement": 1}
    for _ in range(40):
        messages = conversation(rng, mixture, ask_rate=0.5)[0]
        assert tokenizer.apply_chat_template(messages, tokenize=False) == render(messages)


def test_smoke_build_files(smoke):
    for name in FILES:
        assert (smoke / name).is_file(), name
    card = json.loads((smoke / "card.json").read_text())
    assert card["smoke"] and card["model"]["class"] == "Qwen3_5ForCausalLM"
    assert set(card["probe"]) >= {"accuracy", "followup_rate_T0", "followup_rate_T1", "grounded_followup_rate_T0",
                                  "grounded_followup_rate_T1"}
    assert card["dtype"] == "float32" and card["cpu_capability"] and card["torch_threads"] >= 1
    assert card["data"]["heldout"] == len(_rows(smoke / "heldout.jsonl"))
    assert "Probe (self setting" in (smoke / "CARD.md").read_text()
    # nothing left beside the build
    assert [p.name for p in smoke.parent.iterdir()] == [smoke.name]


def test_tokenizer_reloads_with_the_real_template(smoke):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smoke)
    assert tokenizer.chat_template == build_module.TEMPLATE.read_text()
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert tokenizer.tokenize(" 1234") == ["Ġ1", "2", "3", "4"]  # one token per digit, the space kept with the first
    ids = tokenizer.encode("<think>\n\n</think>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>\n\n</think>"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_model_is_a_tiny_qwen3_5(smoke):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smoke)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    names = {name for name, _ in model.named_modules()}
    assert "model.layers.3.self_attn.q_proj" in names
    linear = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
    assert {f"model.layers.0.linear_attn.{m}" for m in linear} <= names
    assert "model.layers.0.mlp.gate_proj" in names


def test_heldout_is_never_trained_on(smoke):
    train_text = "\n".join(m["content"] for row in _rows(smoke / "train.jsonl") for m in row["messages"])
    heldout = _rows(smoke / "heldout.jsonl")
    assert heldout and all(row["answer"].rsplit("#### ", 1)[1].isdigit() for row in heldout)
    for row in heldout:
        assert row["question"] not in train_text
        assert row["answer"] not in train_text
    triples = _rows(smoke / "heldout_triples.jsonl")
    assert [t["query"] for t in triples] == [r["question"] for r in heldout] and all(t["followup"] for t in triples)
    for row in _rows(smoke / "conversations.jsonl"):
        assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user", "assistant"]


def test_heldout_loads_as_the_testbed_task(smoke):
    from uturn_train.tasks import load_task

    examples = load_task("testbed", data=str(smoke / "heldout.jsonl"))
    assert len(examples) == len(_rows(smoke / "heldout.jsonl")) and all(ex.gold for ex in examples)


def test_same_seed_same_weights_and_force_to_overwrite(smoke, tmp_path):
    again = build_testbed(tmp_path / "tb", smoke=True, seed=0)
    for name in ("model.safetensors", "tokenizer.json", "train.jsonl", "heldout.jsonl"):
        assert _sha(again / name) == _sha(smoke / name), name
    with pytest.raises(ValueError, match="force"):
        build_testbed(again, smoke=True, seed=1)
    build_testbed(again, smoke=True, seed=1, force=True)
    assert _sha(again / "model.safetensors") != _sha(smoke / "model.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["tb"]


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_module, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_testbed(tmp_path / "tb", smoke=True)
    assert list(tmp_path.iterdir()) == []


def test_info_gap_conversations_ask_for_the_missing_number():
    from uturn_train.collab.dialogue import is_question
    from uturn_train.testbed.turns import info_gap_conversation

    rng = random.Random(3)
    seen = 0
    for _ in range(200):
        problem = sample_problem(rng)
        if (drawn := info_gap_conversation(rng, problem)) is None:
            continue
        seen += 1
        messages, kind, problems = drawn
        question = messages[0]["content"]
        assert kind == "info_gap" and problems == [problem] and question != problem.question and "some" in question
        missing = [k for k, v in problem.numbers.items() if str(v) not in question.split()]
        # The assistant restates the question's sentence that lacks the number, as a solution's first line restates
        # it, then asks naming the missing quantity; the user gives its number; the solution follows.
        ask = messages[1]["content"]
        sentence = ask.split(", but how many?")[0]
        assert sentence != ask and " some " in f" {sentence} " and sentence[1:] in question and "." not in sentence
        assert is_question(ask) and any(problem.knobs[k] in ask for k in missing)
        assert any(str(problem.numbers[k]) in messages[2]["content"] for k in missing)
        assert messages[3]["content"] == problem.solution and len(messages) == 4
    assert seen > 100


def test_the_mixture_holds_information_gaps_at_a_small_share(real_testbed):
    # The shipped build's data (a smoke build's hundred-odd conversations may hold none at 2.5%).
    card = json.loads((real_testbed / "card.json").read_text())
    kinds = card["data"]["train_kinds"]
    assert 0.01 < kinds["info_gap"] / sum(kinds.values()) < 0.06, kinds
    # No held-out problem, whose collaboration tasks measure asking, is in the mixture (the build avoids their keys).
    heldout = {r["question"] for r in _rows(real_testbed / "heldout.jsonl")}
    assert not any(m["content"] in heldout for r in _rows(real_testbed / "train.jsonl") for m in r["messages"])


def test_the_shipped_testbed_installs_in_seconds_and_is_checked(tmp_path):
    import shutil

    from uturn_train.testbed import install_testbed
    from uturn_train.testbed.build import SHIPPED, SHIPPED_FILES, SHIPPED_SHA256, BuildConfig, build

    assert _sha(SHIPPED / "model.safetensors") == SHIPPED_SHA256, "the shipped weights are not the file the code names"
    out = install_testbed(tmp_path / "tb")
    card = json.loads((out / "card.json").read_text())
    assert _sha(out / "model.safetensors") == SHIPPED_SHA256 == card["installed"]["sha256"] == card["sha256"]
    assert card["installed"]["time_s"] < 60 and card["seed"] == 0 and not card["smoke"]
    assert len(_rows(out / "heldout.jsonl")) == card["config"]["n_heldout"]
    with pytest.raises(ValueError, match="force"):
        install_testbed(out)
    # Weights that are not the shipped file, or a seed it is not, are refused, naming the fix.
    fake = tmp_path / "fake"
    shutil.copytree(SHIPPED, fake)
    with pytest.raises(ValueError, match=r"seed 1 or another config needs `uturn testbed build`"):
        build(tmp_path / "x", seed=1, config=BuildConfig(), shipped=fake)
    monkey = tmp_path / "tampered"
    monkey.mkdir()
    (monkey / "model.safetensors").write_bytes(b"not the weights")
    original = build_module.SHIPPED
    try:
        build_module.SHIPPED = monkey
        for name in set(SHIPPED_FILES) - {"model.safetensors"} | {"card.json"}:
            shutil.copyfile(SHIPPED / name, monkey / name)
        with pytest.raises(ValueError, match=r"model.safetensors is not the file this version ships"):
            build(tmp_path / "y", seed=0, config=BuildConfig(), shipped=monkey)
    finally:
        build_module.SHIPPED = original


def test_an_upgrade_installs_its_own_testbed_and_keeps_ones_own_build(real_testbed, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("UTURN_HOME", str(tmp_path))
    home = shutil.copytree(real_testbed, tmp_path / "testbed")
    card = json.loads((home / "card.json").read_text())
    own = {**card, "sha256": "0" * 64}
    own.pop("installed")  # `uturn testbed build`'s card: kept, whatever its weights
    (home / "card.json").write_text(json.dumps(own))
    assert testbed.ensure_testbed() == home and json.loads((home / "card.json").read_text()) == own
    # Installed from another version's shipped weights: replaced by this version's.
    (home / "card.json").write_text(json.dumps({**card, "installed": {**card["installed"], "sha256": "0" * 64}}))
    (home / "model.safetensors").write_bytes(b"an older version's weights")
    assert testbed.ensure_testbed() == home
    assert _sha(home / "model.safetensors") == card["installed"]["sha256"]


def test_testbed_dir_follows_uturn_home(tmp_path, monkeypatch):
    monkeypatch.setenv("UTURN_HOME", str(tmp_path))
    assert testbed.testbed_dir() == tmp_path / "testbed"  # (not imported bare: pytest would collect it)


@pytest.mark.slow
def test_real_testbed_meets_the_acceptance_figures(real_testbed, tmp_path, monkeypatch):
    # The shipped testbed, probed here as its build probed it: 200 held-out problems, self setting, greedy and T=1.0
    # x 4 (seconds). The weights are the same file on every machine; another CPU's kernels may still move a greedy
    # token here and there, so the bars leave room around the build's own figures (its card).
    out = real_testbed
    card = json.loads((out / "card.json").read_text())
    probe = build_module.measure(out)
    assert probe["n_prompts"] == 200 and abs(probe["accuracy"] - card["probe"]["accuracy"]) <= 0.03
    assert probe["accuracy"] >= 0.85
    assert probe["followup_rate_T0"] <= 0.05 and probe["grounded_followup_rate_T0"] <= 0.05
    assert 0.10 <= probe["followup_rate_T1"] <= 0.40
    assert card["peak_rss_gb"] <= 3.0
    assert card["dtype"] == "float32" and card["cpu_capability"]  # one numeric path on every CPU
    # Asking for a missing number is latent, as follow-ups are: the greedy assistant does not ask first, a sampled one
    # sometimes does (the mixture's information-gap conversations are 2.5%; where the build ran, greedy 0 of 302 first
    # turns had a question mark and no final answer, at T=1.0 11, and read, 2 ask for a number: docs/testbed.md).
    import shutil

    from uturn_train.cli import main as cli_main

    shutil.copytree(out, tmp_path / "home" / "testbed")  # the fixture is read-only: collab.jsonl is written beside
    monkeypatch.setenv("UTURN_HOME", str(tmp_path / "home"))
    asked = {}
    for t in ("0", "1.0"):
        cli_main(["collab", "--model", "testbed", "--task", "testbed", "--families", "info_gap", "--temperature", t,
                  "--out", str(tmp_path / f"collab{t}")])
        info_gap = json.loads((tmp_path / f"collab{t}" / "results.json").read_text())["families"]["info_gap"]
        assert info_gap["n"] >= 250
        asked[t] = info_gap["asked_first"]
    assert asked["0"] <= 0.02 and 0.01 <= asked["1.0"] <= 0.20, asked
    # Time is not asserted: a wall-clock limit fails on a slow or busy machine whatever the code does. The card
    # records the build's; installing it records its own (seconds).


def test_resolve_fills_in_the_built_testbed(smoke, tmp_path, monkeypatch):
    import shutil

    from uturn_train.commands.probe import ProbeScriptArguments
    from uturn_train.training.data import CollabDataArguments
    from uturn_train.training.mining import MiningArguments

    monkeypatch.setenv("UTURN_HOME", str(tmp_path))
    shutil.copytree(smoke, tmp_path / "testbed")  # a built testbed: resolving it must not build again
    probe, mining = ProbeScriptArguments(model="testbed", task="testbed"), MiningArguments(mine_source="testbed")
    collab, other = CollabDataArguments(collab_source="testbed"), ProbeScriptArguments(model="Qwen/Qwen3.5-2B",
                                                                                      task="testbed", data="x.jsonl")
    testbed.resolve(probe, mining, collab, other)
    assert (probe.model, probe.data) == (str(tmp_path / "testbed"), str(tmp_path / "testbed" / "heldout.jsonl"))
    assert mining.mine_data == collab.collab_data == str(tmp_path / "testbed" / "conversations.jsonl")
    assert (other.model, other.data) == ("Qwen/Qwen3.5-2B", "x.jsonl")  # other names and given data are kept

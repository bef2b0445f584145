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


def test_testbed_dir_follows_uturn_home(tmp_path, monkeypatch):
    monkeypatch.setenv("UTURN_HOME", str(tmp_path))
    assert testbed.testbed_dir() == tmp_path / "testbed"  # (not imported bare: pytest would collect it)


@pytest.mark.slow
def test_real_testbed_meets_the_acceptance_figures(real_testbed):
    # The acceptance command of the issue measures the same as the build's own probe: 200 held-out problems, self
    # setting, greedy and T=1.0 x 4. About 5 minutes on 2 cores; built once per session (conftest.py).
    out = real_testbed
    card = json.loads((out / "card.json").read_text())
    probe = card["probe"]
    assert probe["n_prompts"] == 200
    # The build is deterministic on one CPU only: another CPU's kernels draw it as another seed would. Step-0 accuracy
    # measured 0.575 and 0.690 on two AVX2 EPYCs (issue 37), above 0.40 on the AVX512 EPYC of earlier CI runs, 0.370 on
    # an AVX512 (AMX) Xeon (2026-12-05). The bar is what every machine measured holds, until the built weights ship
    # (issue 37, item 1) and step 0 is the same for everyone.
    assert probe["accuracy"] >= 0.35
    assert probe["followup_rate_T0"] <= 0.05 and probe["grounded_followup_rate_T0"] <= 0.05
    assert 0.10 <= probe["followup_rate_T1"] <= 0.40
    assert card["peak_rss_gb"] <= 3.0
    assert card["dtype"] == "float32" and card["cpu_capability"]  # one numeric path on every CPU
    # Time is not asserted: a wall-clock limit fails on a slow or busy machine whatever the code does. The build
    # records it in the card; README has the measured figures (build + probe <= 360 s on 2 cores).


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

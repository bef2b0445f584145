import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from helpers import ROOT

from uturn_train.cli import main as cli
from uturn_train.probe.rules.classify import LABELS
from uturn_train.probe.runner import run_probe
from uturn_train.probe.settings import ProbeSettings
from uturn_train.tasks import load_task

SMALL = ["--limit", "4", "--samples", "2", "--max_new_tokens", "8", "--answer_max_new_tokens", "12",
         "--batch_size", "4"]


def load(model_dir):
    from uturn_train.models import load_model, load_tokenizer

    return load_model(str(model_dir), device="cpu"), load_tokenizer(str(model_dir))


@pytest.fixture(scope="module")
def tiny(tiny_qwen_dir):
    return load(tiny_qwen_dir)


def test_self_setting_answers_then_user_turns(tiny, shared_data):
    model, tokenizer = tiny
    examples = load_task("gsm8k", str(shared_data / "gsm8k" / "test.jsonl"), limit=4)
    settings = ProbeSettings(labeler="rules", temperatures=[0.0, 1.0], samples=3, max_new_tokens=8,
                             answer_max_new_tokens=12, batch_size=3)
    run = run_probe(model, tokenizer, examples, settings)
    assert [s["n"] for s in run.summary["settings"]] == [4, 12]
    assert [s["samples"] for s in run.summary["settings"]] == [1, 3]
    assert len(run.rows) == 16 and {r["label"] for r in run.rows} <= set(LABELS)
    assert all(r["user_prompt"].endswith("<|im_end|>\n<|im_start|>user\n") for r in run.rows)
    # The user turn reacts to the model's own greedy answer, rendered as an earlier assistant turn.
    for r in run.rows:
        assert r["answer_prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert f"<|im_start|>assistant\n{r['answer'].strip()}<|im_end|>" in r["user_prompt"]
        assert r["finish_reason"] in ("stop", "length") and isinstance(r["answer_correct"], bool)
    assert run.summary["accuracy"] == sum(a["answer_correct"] for a in run.answers) / 4
    # Same seed, same numbers; greedy rows do not depend on the sampling seed.
    again = run_probe(model, tokenizer, examples, settings)
    assert [r["user_turn"] for r in again.rows] == [r["user_turn"] for r in run.rows]
    other = run_probe(model, tokenizer, examples, replace(settings, temperatures=[0.0], batch_size=2, seed=7))
    assert [r["user_turn"] for r in other.rows] == [r["user_turn"] for r in run.rows if r["temperature"] == 0.0]
    # Another seed draws other samples, whatever its temperatures (seed + 1 + the temperature's index once gave
    # `seed=1, temperatures=[1.0]` exactly the T=1.0 samples of `seed=0, temperatures=[0.0, 1.0]`).
    shifted = run_probe(model, tokenizer, examples, replace(settings, temperatures=[1.0], seed=1))
    assert [r["user_turn"] for r in shifted.rows] != [r["user_turn"] for r in run.rows if r["temperature"] == 1.0]


def test_heldout_uses_the_real_answer(tiny, shared_data):
    model, tokenizer = tiny
    examples = load_task("oasst", str(shared_data / "oasst" / "en_100_tree.jsonl"), limit=3)
    run = run_probe(model, tokenizer, examples,
                    ProbeSettings(labeler="rules", setting="heldout", temperatures=[0.0], max_new_tokens=6))
    assert [r["answer"] for r in run.rows] == [e.answer for e in examples]
    assert run.summary["accuracy"] is None and all(r["answer_prompt"] is None for r in run.rows)
    ifeval = load_task("ifeval", str(shared_data / "ifeval" / "input_data.jsonl"), limit=2)
    with pytest.raises(ValueError, match="heldout setting needs a real assistant answer.*--setting self"):
        run_probe(model, tokenizer, ifeval, ProbeSettings(labeler="rules", setting="heldout"))


def test_llama_template_model(tiny_llama_dir, shared_data):
    model, tokenizer = load(tiny_llama_dir)
    examples = load_task("mtbench", str(shared_data / "mt_bench" / "question.jsonl"), limit=2)
    run = run_probe(model, tokenizer, examples, ProbeSettings(labeler="rules", temperatures=[0.0], max_new_tokens=6,
                                                              answer_max_new_tokens=6))
    assert all(r["user_prompt"].endswith("<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n") for r in run.rows)


def test_vl_checkpoint_loads_as_text_only_causal_lm(tiny_vl_dir):
    from uturn_train.models import load_model

    model = load_model(str(tiny_vl_dir))
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert not any("visual" in name for name, _ in model.named_parameters())


def test_cli_probe_writes_results_samples_and_plot(tiny_qwen_dir, shared_data, tmp_path, capsys):
    out = tmp_path / "probe"
    cli(["probe", "--model", str(tiny_qwen_dir), "--labeler", "rules",
        "--task", "gsm8k", "--data", str(shared_data / "gsm8k" / "test.jsonl"),
         "--temperatures", "0", "0.7", "1.0", "--out", str(out), *SMALL])
    results = json.loads((out / "results.json").read_text())
    assert {"model", "task", "setting", "n_prompts", "accuracy", "accuracy_strict", "accuracy_flexible",
            "settings"} <= set(results)
    assert [s["temperature"] for s in results["settings"]] == [0.0, 0.7, 1.0]
    for s in results["settings"]:
        assert set(s) == {"temperature", "samples", "followup_rate", "ci95", "n", "errors", "categories",
                          "grounded_followup_rate", "grounded_ci95", "distinct_followups", "distinct_templates"}
        assert s["grounded_followup_rate"] <= s["followup_rate"]
        assert set(s["categories"]) == set(LABELS)
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4 + 8 + 8
    assert {"id", "temperature", "sample_index", "query", "answer", "answer_prompt", "answer_correct", "user_prompt",
            "user_turn", "label", "reason", "finish_reason", "grounded", "mismatch_label"} <= set(rows[0])
    # The mismatched context of every prompt is another prompt of the same probe.
    assert all(r["mismatch_index"] != r["index"] for r in rows) and all(isinstance(r["grounded"], bool) for r in rows)
    assert (out / "followup_vs_temperature.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "gsm8k · self · 4 prompts" in printed and "lm-eval strict-match" in printed


@pytest.mark.parametrize("case", ["unknown_task", "no_tokenizer", "empty_data", "unwritable_out", "no_template"])
def test_cli_bad_input_is_one_clear_error_and_no_output(case, tiny_qwen_dir, tmp_path, capsys):
    import shutil

    data = tmp_path / "gsm.jsonl"
    data.write_text(json.dumps({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}) + "\n")
    out = tmp_path / "out"
    model = str(tiny_qwen_dir)
    args = {"task": "gsm8k"}
    if case == "unknown_task":
        args["task"], expected = "gsm9k", "unknown task 'gsm9k'"
    elif case == "no_tokenizer":
        model = tmp_path / "weights_only"
        model.mkdir()
        shutil.copy(tiny_qwen_dir / "config.json", model)
        shutil.copy(tiny_qwen_dir / "model.safetensors", model)
        model, expected = str(model), "has no tokenizer files"
    elif case == "empty_data":
        data.write_text("")
        expected = "is empty"
    elif case == "unwritable_out":
        (tmp_path / "file").write_text("x")
        out, expected = tmp_path / "file" / "out", "not a writable directory"
    else:
        model = tmp_path / "no_template"
        shutil.copytree(tiny_qwen_dir, model)
        (model / "chat_template.jinja").unlink()
        cfg = json.loads((model / "tokenizer_config.json").read_text())
        cfg.pop("chat_template", None)
        (model / "tokenizer_config.json").write_text(json.dumps(cfg))
        model, expected = str(model), "has no chat template"
    with pytest.raises(SystemExit) as exit_info:
        cli(["probe", "--model", model, "--labeler", "rules",
            "--task", args["task"], "--data", str(data), "--out", str(out), *SMALL])
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err
    assert not (out / "results.json").exists() and not (out / "samples.jsonl").exists()


def test_cli_classify_roundtrip_and_bad_row(tmp_path, capsys):
    rows = [{"query": "What is 12*4?", "answer": "12*4 = 48.", "user_turn": "Why did you multiply by 4 there?"},
            {"query": "What is 12*4?", "answer": "12*4 = 48.", "user_turn": "   "}]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli(["classify", "--input", str(src), "--output", str(dst)])
    labelled = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [r["label"] for r in labelled] == ["followup", "empty"] and all(r["reason"] for r in labelled)
    src.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"query": "q", "answer": "a"}) + "\n")
    dst.unlink()
    with pytest.raises(SystemExit):
        cli(["classify", "--input", str(src), "--output", str(dst)])
    assert "in.jsonl:2: missing string field(s) ['user_turn']" in capsys.readouterr().err
    assert not dst.exists()


@pytest.mark.slow
def test_eval_probe_sharded_over_two_processes_equals_one(tiny_qwen_dir, shared_data, tmp_path):
    data = str(shared_data / "gsm8k" / "test.jsonl")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    common = ["eval/probe.py", "--model", str(tiny_qwen_dir), "--labeler", "rules",
        "--task", "gsm8k", "--data", data, "--limit", "5",
              "--temperatures", "0", "--max_new_tokens", "8", "--answer_max_new_tokens", "12", "--batch_size", "2"]
    launch = [sys.executable, "-m", "accelerate.commands.launch"]
    for name, flags in [("one", ["--cpu", "--num_processes", "1"]), ("two", ["--multi_gpu", "--num_processes", "2"])]:
        proc = subprocess.run([*launch, *flags, *common, "--out", str(tmp_path / name)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = (json.loads((tmp_path / n / "results.json").read_text()) for n in ("one", "two"))
    assert one["settings"] == two["settings"] and one["accuracy"] == two["accuracy"] and two["n_prompts"] == 5
    rows = [(tmp_path / n / "samples.jsonl").read_text() for n in ("one", "two")]
    assert rows[0] == rows[1]


def test_prompts_sharing_a_context_are_never_their_own_mismatch(tiny, shared_data):
    # OASST trees hold sibling follow-ups of one answer: the grounded control pairs distinct contexts, not prompts.
    model, tokenizer = tiny
    examples = load_task("oasst", str(shared_data / "oasst" / "en_100_tree.jsonl"))
    contexts = [(ex.query, ex.answer) for ex in examples]
    assert len(set(contexts)) < len(contexts), "the data must hold prompts that share a context"
    shared = [ex for ex in examples if contexts.count((ex.query, ex.answer)) > 1][:4] + list(examples[:4])
    run = run_probe(model, tokenizer, shared,
                    ProbeSettings(labeler="rules", setting="heldout", temperatures=[0.0], max_new_tokens=4))
    for r in run.rows:
        mismatch = run.answers[r["mismatch_index"]]
        assert (mismatch["query"], mismatch["answer"]) != (r["query"], r["answer"])

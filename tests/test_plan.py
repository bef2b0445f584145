"""`uturn plan`: per-device memory of a recipe YAML, from the model's shape (meta device) and the YAML's knobs."""

from pathlib import Path

import pytest

from uturn_train.cli import main
from uturn_train.plan import model_config, plan, run_plan, shape

ROOT = Path(__file__).resolve().parents[1]
YAMLS = ROOT / "recipes" / "qwen3.5-2b"


@pytest.fixture(scope="module")
def q2b():
    return shape(model_config("Qwen/Qwen3.5-2B"), 32, None)


def values(**kw):
    return {"recipe": "dpo", "dtype": "bfloat16", "per_device_train_batch_size": 4, "max_length": 1024,
            "gradient_checkpointing": True, "probe_batch_size": 64, **kw}


def test_the_2b_shape_is_read_without_the_hub(q2b):
    assert q2b.params == 1_881_825_088 and q2b.vocab == 248320
    assert q2b.layer_kinds.count("full_attention") == 6
    # LoRA r=32 on q/k/v/o, Gated DeltaNet's in_proj_qkv/in_proj_z/out_proj and the MLP: r x (in + out) each.
    attn = 32 * ((2048 + 4096) + 2 * (2048 + 512) + (2048 + 2048))
    gdn = 32 * ((2048 + 6144) + (2048 + 2048) + (2048 + 2048))
    mlp = 32 * (3 * (2048 + 6144))
    assert q2b.lora_params == 6 * attn + 18 * gdn + 24 * mlp


def test_components_follow_the_knobs(q2b):
    base = plan(values(), 1, "single", q2b)
    assert base["weights"] == pytest.approx(q2b.params * 2)
    assert plan(values(dtype="float32"), 1, "single", q2b)["weights"] == pytest.approx(2 * base["weights"])
    # The fused LM head holds one tile of at most 4,096 tokens, whatever the length; DPO's chosen and rejected rows
    # (one forward) count twice in the hidden states' gradient.
    tile = 4096 * 32768 * 2
    assert base["logits"] == pytest.approx(tile + 8 * 1024 * 2048 * 4)
    assert plan(values(recipe="sft"), 1, "single", q2b)["logits"] == pytest.approx(tile + 4 * 1024 * 2048 * 4)
    assert plan(values(max_length=256), 1, "single", q2b)["logits"] == pytest.approx(
        2048 * 32768 * 2 + 8 * 256 * 2048 * 4)
    assert plan(values(gradient_checkpointing=False), 1, "single", q2b)["activations"] > 5 * base["activations"]
    # ZeRO-3 shards the weights and LoRA states but gathers the whole model to generate; ZeRO-2 only the states.
    z3, z2, ddp = (plan(values(), 8, s, q2b) for s in ("zero3", "zero2", "ddp"))
    assert z3["weights"] == pytest.approx(base["weights"] / 8) and ddp["weights"] == base["weights"]
    assert z3["generation"] > base["generation"] + 0.8 * base["weights"]
    assert z3["lora"] < z2["lora"] < ddp["lora"] == base["lora"]
    layerwise = plan(values(probe_ds3_gather=False), 8, "zero3", q2b)  # only the embedding, the largest module
    assert layerwise["generation"] == pytest.approx(z3["generation"] - 7 / 8 * q2b.params * 2 + 248320 * 2048 * 2)
    assert base["peak"] == pytest.approx(base["weights"] + base["lora"] + max(
        base["activations"] + base["logits"], base["generation"]))


def test_grpo_counts_completions_and_its_generation_batch(q2b):
    grpo = values(recipe="grpo", per_device_train_batch_size=16, max_completion_length=512, prompt_tokens=256,
                  prompt_answer_max_new_tokens=512)
    parts = plan(grpo, 1, "single", q2b)
    assert parts["logits"] == pytest.approx(4096 * 32768 * 2 + 16 * 512 * 2048 * 4)  # only completions reach the loss
    assert plan({**grpo, "per_device_train_batch_size": 32}, 1, "single", q2b)["generation"] == pytest.approx(
        2 * parts["generation"])


def test_the_cli_reads_a_yaml_and_its_overrides(capsys):
    rows = run_plan(["--config", str(YAMLS / "collab_dpo.yaml"), "--gpus", "1", "8", "--gpu_gb", "24", "80"])
    assert [(r["gpus"], r["strategy"]) for r in rows] == [(1, "single"), (8, "ddp"), (8, "zero2"), (8, "zero3")]
    short = run_plan(["--config", str(YAMLS / "collab_dpo.yaml"), "--gpus", "1", "--max_length", "256"])[0]
    assert short["peak"] < rows[0]["peak"]
    out = capsys.readouterr().out
    assert "Qwen/Qwen3.5-2B: 1.88B parameters" in out and "dpo" in out
    table = [line for line in out.splitlines() if line.startswith(("GB per", "GPUs", "   1", "   8"))]
    assert len(table) == 2 * 2 + 4 + 1 and max(map(len, table)) <= 80


@pytest.mark.parametrize("argv, message", [
    (["--config", "nope.yaml"], "no such file"),
    (["--config", str(YAMLS / "collab_dpo.yaml"), "--max_length"], "--key value"),
    (["--config", str(YAMLS / "collab_dpo.yaml"), "--dtype", "int8"], "dtype 'int8'"),
])
def test_bad_input_is_one_clear_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_config_for_no_known_recipe_is_refused(tmp_path, capsys):
    bad = tmp_path / "x.yaml"
    bad.write_text("model_name_or_path: Qwen/Qwen3.5-2B\nlearning_rate: 1.0e-5\n")
    with pytest.raises(SystemExit):
        main(["plan", "--config", str(bad)])
    assert "cannot tell which recipe" in capsys.readouterr().err

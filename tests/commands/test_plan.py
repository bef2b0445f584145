"""`uturn plan`: per-device memory of a recipe YAML, from the model's shape (meta device) and the YAML's knobs."""

import dataclasses

import pytest
from helpers import ROOT

from uturn_train.cli import main
from uturn_train.commands.plan import defaults, model_config, plan, run_plan, shape

YAMLS = ROOT / "recipes" / "qwen3.5-2b"


@pytest.fixture(scope="module")
def q2b():
    return shape(model_config("Qwen/Qwen3.5-2B"), 32, None)


def values(recipe="dpo", **kw):
    return {**defaults(recipe), "recipe": recipe, "dtype": "bfloat16", "per_device_train_batch_size": 4,
            "max_length": 1024, "gradient_checkpointing": True, "probe_batch_size": 64, "prompt_tokens": 256,
            "dataset_name": "pairs", **kw}


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
    # Gathered at full size beside the shard (DeepSpeed keeps the partition): the whole model, or the embedding.
    assert layerwise["generation"] == pytest.approx(z3["generation"] - q2b.params * 2 + 248320 * 2048 * 2)
    # Mining (DPO without pairs) always gathers the whole model: layer by layer for the probe does not help it.
    mining = plan(values(probe_ds3_gather=False, dataset_name=None, mine_batch_size=64, mine_samples=8), 8, "zero3",
                  q2b)
    assert mining["generation_phase"] == "mining" and mining["generation"] > z3["generation"]
    assert base["peak"] == pytest.approx(base["weights"] + base["lora"] + max(
        base["activations"] + base["logits"], base["generation"]))


def test_a_model_with_sliding_windows_is_planned_with_the_prompt_copied_per_row(q2b):
    # The engine shares a prompt only over full and linear attention layers; otherwise it copies it k ways.
    kinds = list(q2b.layer_kinds)
    kinds[kinds.index("linear_attention")] = "sliding_attention"
    sliding = dataclasses.replace(q2b, layer_kinds=kinds)
    shared, copied = (plan(values(probe_samples=4), 1, "single", m)["generation"] for m in (q2b, sliding))
    prompt = values()["prompt_tokens"] + defaults("dpo")["probe_answer_max_new_tokens"]
    prompts, full = values()["probe_batch_size"], q2b.layer_kinds.count("full_attention")
    new = defaults("dpo")["probe_max_new_tokens"]
    # Copied: 4 rows of prompt and turn per prompt; shared: one prompt-and-turn buffer and 4 turns.
    assert copied - shared == pytest.approx(full * q2b.kv_width * 2 * prompts * (3 * prompt - new))


def test_generation_counts_every_row_of_a_call(q2b):
    """The probe samples `probe_samples` turns per prompt in one call, the rows sharing their prompt's keys and values
    (`shared_prefix`): each row adds its own turn's cache, states and logits, not the prompt's; GRPO generates a
    micro-batch for every step of a generation round (steps_per_generation, by default the accumulation)."""
    one = plan(values(probe_samples=1), 1, "single", q2b)
    four = plan(values(probe_samples=4), 1, "single", q2b)
    greedy = plan(values(probe_samples=4, probe_temperatures=[0.0]), 1, "single", q2b)
    assert greedy["generation"] == one["generation"]
    new, full = defaults("dpo")["probe_max_new_tokens"], q2b.layer_kinds.count("full_attention")
    prompts = values()["probe_batch_size"]
    # 4 rows' own turns per prompt (bf16 keys and values), 3 more rows of states and logits per prompt (bf16, fp32 and
    # the softmax's fp32 for all 4); the prompts' cache is the same.
    extra = (prompts * 4 * full * q2b.kv_width * new * 2 + prompts * 3 * (q2b.layers - full) * q2b.state_elems * 4
             + prompts * q2b.vocab * (4 * 10 - 6))
    assert four["generation"] - one["generation"] == pytest.approx(extra)
    assert four["generation"] < 4 * one["generation"]  # copied 4 ways, it was 4x
    grpo = values(recipe="grpo", per_device_train_batch_size=16, max_completion_length=512,
                  prompt_answer_max_new_tokens=512, gradient_accumulation_steps=4, probe_batch_size=1)
    parts = plan(grpo, 1, "single", q2b)
    assert parts["logits"] == pytest.approx(4096 * 32768 * 2 + 16 * 512 * 2048 * 4)  # only completions reach the loss
    assert parts["generation_phase"] == "rollouts"
    assert plan({**grpo, "gradient_accumulation_steps": 8}, 1, "single", q2b)["generation"] == pytest.approx(
        2 * parts["generation"])


def test_the_collab_objective_plans_whole_conversations(q2b):
    """With `objective: collab` a completion is a conversation: the policy's turns and the partner's between them;
    the rollouts' longest call is the last turn, after all the others."""
    grpo = values(recipe="grpo", per_device_train_batch_size=16, max_completion_length=384,
                  prompt_answer_max_new_tokens=512, gradient_accumulation_steps=4, probe_batch_size=1)
    one, collab = plan(grpo, 1, "single", q2b), plan({**grpo, "objective": "collab"}, 1, "single", q2b)
    conversation = 3 * 384 + 2 * 512  # collab_max_turns 3 by default
    assert collab["logits"] == pytest.approx(4096 * 32768 * 2 + 16 * conversation * 2048 * 4)
    assert collab["generation_phase"] == "rollouts" and collab["generation"] > one["generation"]
    # fp32 rollouts generate with the adapters merged into a copy of the weights LoRA wraps (`models.merged_lora`):
    # Gated DeltaNet's in_proj_qkv, in_proj_z and out_proj, full attention's q (with its gate: 2x), k, v and o, the MLP.
    gdn, attn, mlp = 2048 * (6144 + 2048 + 2048), 2048 * (4096 + 512 + 512 + 2048), 3 * 2048 * 6144
    assert q2b.adapted == 18 * gdn + 6 * attn + 24 * mlp
    unadapted = dataclasses.replace(q2b, adapted=0)
    merged = collab["generation"] - plan({**grpo, "objective": "collab"}, 1, "single", unadapted)["generation"]
    assert merged == 0  # bf16 rollouts generate unmerged
    fp32 = {**grpo, "objective": "collab", "dtype": "float32"}
    merged = plan(fp32, 1, "single", q2b)["generation"] - plan(fp32, 1, "single", unadapted)["generation"]
    assert merged == q2b.adapted * 4
    user_turn = {**grpo, "dtype": "float32"}  # GRPO on the user turn generates with TRL's own, unmerged
    assert plan(user_turn, 1, "single", unadapted) == plan(user_turn, 1, "single", q2b)
    assert collab["activations"] > one["activations"]
    rows = run_plan(["--config", str(YAMLS / "collab_objective.yaml"), "--gpus", "1"])
    assert rows[0]["generation_phase"] == "rollouts"


def test_the_cli_reads_a_yaml_and_its_overrides(capsys):
    rows = run_plan(["--config", str(YAMLS / "collab_dpo.yaml"), "--gpus", "1", "8", "--gpu_gb", "24", "80"])
    assert [(r["gpus"], r["strategy"]) for r in rows] == [(1, "single"), (8, "ddp"), (8, "zero2"), (8, "zero3")]
    pairs = ["--config", str(YAMLS / "collab_dpo.yaml"), "--gpus", "1", "--dataset_name", "pairs"]
    given, short = run_plan(pairs)[0], run_plan([*pairs, "--max_length", "256"])[0]
    assert rows[0]["generation_phase"] == "mining" and given["generation_phase"] == "probe"
    assert short["activations"] < given["activations"] and given["generation"] < rows[0]["generation"]
    out = capsys.readouterr().out
    assert "Qwen/Qwen3.5-2B: 1.88B parameters" in out and "dpo" in out
    table = [line for line in out.splitlines() if line.startswith(("GiB per", "GPUs", "   1", "   8"))]
    assert len(table) == 3 * 2 + 4 + 1 + 1 and max(map(len, table)) <= 80


@pytest.mark.parametrize("argv, message", [
    (["--config", "nope.yaml"], "no such file"),
    (["--config", str(YAMLS / "collab_dpo.yaml"), "256"], "--key value"),
    (["--config", str(YAMLS / "collab_dpo.yaml"), "--dtype", "int8"], "dtype 'int8'"),
    (["--config", str(YAMLS / "collab_dpo.yaml"), "--use_peft", "false"], "pass --use_peft true"),
    (["--config", str(YAMLS / "collab_dpo.yaml"), "--lora_target_modules", "nope_proj"], "matches no module"),
    (["--config", str(YAMLS / "collab_dpo.yaml"), "--per_device_train_batchsize", "8"],
     "did you mean --per_device_train_batch_size?"),
    (["--config", str(YAMLS / "collab_sft.yaml"), "--mine_samples", "8"], "not an option of the sft recipe"),
])
def test_bad_input_is_one_clear_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_config_for_no_known_recipe_is_refused_unless_named(tmp_path, capsys):
    bad = tmp_path / "x.yaml"
    bad.write_text("model_name_or_path: Qwen/Qwen3.5-2B\nlearning_rate: 1.0e-5\nuse_peft: true\n")
    with pytest.raises(SystemExit):
        main(["plan", "--config", str(bad)])
    assert "pass --recipe" in capsys.readouterr().err
    rows = run_plan(["--config", str(bad), "--recipe", "sft", "--gpus", "1"])
    assert rows[0]["peak"] > 0


def test_lora_targets_as_peft_reads_them(q2b):
    config = model_config("Qwen/Qwen3.5-2B")
    assert shape(config, 32, ["q_proj", "v_proj"]).lora_params == 6 * 32 * ((2048 + 4096) + (2048 + 512))
    with pytest.raises(ValueError, match="matches no module"):  # a one-item list becomes a regex, as in TRL and PEFT
        shape(config, 32, ["q_proj"])
    everything = shape(config, 32, "all-linear").lora_params
    assert everything > q2b.lora_params  # all-linear adds in_proj_a/b beside the documented targets, not lm_head

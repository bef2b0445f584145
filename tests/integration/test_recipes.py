"""The recipes run end to end on tiny models: in-process through `main()`, and under `accelerate launch` (slow)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HELPERS, ROOT, load_recipe
from helpers.conversations import conversations


@pytest.fixture
def data(tmp_path):
    """A conversations file to train/mine on, and the same problems in GSM8K format for the probe."""
    rows = conversations(16)
    convs, gsm8k = tmp_path / "conversations.jsonl", tmp_path / "gsm8k.jsonl"
    convs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = [{"question": r["messages"][0]["content"], "answer": r["messages"][1]["content"]} for r in rows[8:]]
    gsm8k.write_text("".join(json.dumps(p) + "\n" for p in problems))
    return convs, gsm8k


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    # A stray `testbed` in a test config would build the real testbed here (and the test then checks it did not).
    monkeypatch.setenv("UTURN_HOME", str(tmp_path / "uturn_home"))
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb"))
    yield
    assert not (tmp_path / "uturn_home").exists()


def overrides(model_dir, data, out) -> list[str]:
    """The testbed configs, shrunk onto a tiny model and the `data` files."""
    convs, gsm8k = data
    return ["--model_name_or_path", str(model_dir), "--output_dir", str(out), "--probe_task", "gsm8k",
            "--probe_labeler", "rules",
                "--probe_data", str(gsm8k), "--probe_limit", "4", "--probe_samples", "2", "--probe_max_new_tokens", "8",
            "--probe_answer_max_new_tokens", "12", "--max_steps", "4", "--save_steps", "2", "--logging_steps", "1",
            "--per_device_train_batch_size", "2", "--report_to", "none"]


def mining_overrides(data) -> list[str]:
    return ["--mine_source", "conversations", "--mine_labeler", "rules",
        "--mine_data", str(data[0]), "--mine_limit", "5", "--mine_samples", "2",
            "--mine_max_new_tokens", "8", "--mine_answer_max_new_tokens", "12", "--anchor_ratio", "0.5"]


def grpo_overrides(data) -> list[str]:
    return ["--prompt_source", "conversations", "--reward_labeler", "rules",
        "--prompt_data", str(data[0]), "--prompt_limit", "8",
            "--anchor_share", "0.25", "--prompt_answer_max_new_tokens", "12", "--num_generations", "2",
            "--per_device_train_batch_size", "4", "--max_completion_length", "8"]


def history(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "probe_history.jsonl").read_text().splitlines()]


def adapter_modules(out) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(Path(out) / "adapter_model.safetensors"), "pt") as f:
        return {re.sub(r".*layers\.\d+\.", "", k).split(".lora_")[0] for k in f.keys()}


def test_lora_targets_cover_qwen35_and_never_the_vision_tower(tiny_vl_dir):
    from transformers import Qwen3_5ForConditionalGeneration

    from uturn_train.models import QWEN3_5_LORA_TARGETS

    names = [n for n, _ in Qwen3_5ForConditionalGeneration.from_pretrained(tiny_vl_dir).named_modules()]
    assert any(".visual." in n or n.startswith("model.visual") for n in names)
    matched = [n for n in names if re.fullmatch(QWEN3_5_LORA_TARGETS, n)]
    assert not any("visual" in n for n in matched)
    assert {re.sub(r".*layers\.\d+\.", "", n) for n in matched} == {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "linear_attn.in_proj_qkv",
        "linear_attn.in_proj_z", "linear_attn.out_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}


def test_collab_sft_from_a_vision_language_checkpoint(tiny_vl_dir, data, tmp_path):
    recipe = load_recipe("collab_sft")
    out = tmp_path / "sft"
    args = recipe.make_parser().parse_args_and_config(
        ["--config", str(ROOT / "recipes" / "testbed" / "collab_sft.yaml"), *overrides(tiny_vl_dir, data, out),
         "--collab_source", "conversations", "--collab_data", str(data[0]), "--loss_scope", "user"])
    recipe.main(*args)
    assert [r["step"] for r in history(out)] == [0, 2, 4] and all(r["error"] is None for r in history(out))
    assert (out / "probe_history.png").stat().st_size > 0
    # The text-only class was trained: adapters on all three kinds of layers, none on the vision tower.
    modules = adapter_modules(out)
    assert {"self_attn.q_proj", "linear_attn.in_proj_qkv", "mlp.down_proj"} <= modules
    assert not any("visual" in m for m in modules)


def test_collab_dpo_mines_trains_and_goes_offline(tiny_qwen_dir, data, tmp_path, monkeypatch):
    import wandb
    from helpers.wandb_records import history_rows
    from safetensors.torch import load_file

    wandb.teardown()  # wandb caches its settings (the run folder) per process: earlier tests' runs must not leak in
    # Not logged in to W&B (no key, no ~/.netrc): the recipe must switch to offline instead of hanging.
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    recipe = load_recipe("collab_dpo")
    out = tmp_path / "dpo"
    args = recipe.make_parser().parse_args_and_config(
        ["--config", str(ROOT / "recipes" / "testbed" / "collab_dpo.yaml"), *overrides(tiny_qwen_dir, data, out),
         *mining_overrides(data), "--report_to", "wandb"])
    recipe.main(*args)
    assert os.environ["WANDB_MODE"] == "offline"
    assert wandb.run.name == "testbed-collab-dpo-seed0"  # seeds of one YAML are runs of their own names
    wandb.finish()  # as the recipe's process would at exit: the offline file is complete once the run ends
    (run_dir,) = (tmp_path / "wandb" / "wandb").glob("offline-run-*")
    assert any("train/probe/followup_rate/T0.0" in r for r in history_rows(run_dir))

    card = json.loads((out / "pairs" / "mining_card.json").read_text())
    assert card["n_prompts"] == 5 and card["kind"]["followup"] >= 1
    assert [r["step"] for r in history(out)] == [0, 2, 4]
    weights = load_file(out / "adapter_model.safetensors")
    assert any(w.abs().sum() > 0 for k, w in weights.items() if "lora_B" in k)  # B starts at zero: it trained


def test_collab_grpo_refuses_vllm_colocated_before_loading_anything(tmp_path):
    recipe = load_recipe("collab_grpo")
    args = recipe.make_parser().parse_args_and_config(
        ["--config", str(ROOT / "recipes/testbed/collab_grpo.yaml"), "--use_vllm", "true", "--vllm_mode", "colocate",
         "--output_dir", str(tmp_path / "out"), "--report_to", "none"])
    with pytest.raises(ValueError, match="vllm_mode server"):
        recipe.main(*args)
    assert not (tmp_path / "out").exists() and not (tmp_path / "uturn_home").exists()  # refused before the testbed


def test_collab_grpo_rewards_user_turns_and_anchors(tiny_qwen_dir, data, tmp_path, capsys):
    recipe = load_recipe("collab_grpo")
    out = tmp_path / "grpo"
    # A random model's turns all get the same verdict; a tight length budget makes their rewards differ, so GRPO has
    # an advantage to follow.
    args = recipe.make_parser().parse_args_and_config(
        ["--config", str(ROOT / "recipes" / "testbed" / "collab_grpo.yaml"), *overrides(tiny_qwen_dir, data, out),
         *grpo_overrides(data), "--user_turn_budget", "3"])
    recipe.main(*args)
    assert "6 user-turn prompts (self answers) and 2 anchor problems" in capsys.readouterr().out
    assert [r["step"] for r in history(out)] == [0, 2, 4] and all(r["error"] is None for r in history(out))
    assert (out / "probe_history.png").stat().st_size > 0
    from safetensors.torch import load_file

    weights = load_file(out / "checkpoint-4" / "adapter_model.safetensors")
    assert any(w.abs().sum() > 0 for k, w in weights.items() if "lora_B" in k)  # B starts at zero: it trained
    # The YAML's rule chose the final adapter among the probed checkpoints (not necessarily the last one), or, when no
    # checkpoint meets it (a random model rarely writes a quarter distinct greedy follow-ups), kept the last step's.
    selection = json.loads((out / "selection.json").read_text())
    rule = selection["rule"]
    assert (rule["select_metric"], rule["select_max_accuracy_drop"], rule["select_min_distinct"]) == (
        "grounded_followup_rate_T0", 0.05, 0.25)
    eligible = [c for c in selection["checkpoints"] if c["eligible"]]
    assert all(c["step"] in (2, 4) and c["distinct"] >= 0.25 for c in eligible)
    assert selection["step"] == max(eligible, key=lambda c: (c["value"], c["accuracy"], -c["step"]),
                                    default={"step": None})["step"]
    assert (selection["loaded"] is None) == (selection["step"] in (None, 4)) and selection["final_step"] == 4
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    logged = {k for h in state["log_history"] for k in h}
    assert {"rewards/user_turn/mean", "rewards/length_guard/mean", "rewards/accuracy/mean"} <= logged


def launch(args: list[str], recipe_args: list[str], out: Path, timeout: int = 900, recipe: str = "collab_dpo",
           via: list[str] = (), env: dict | None = None) -> None:
    """`via`: a script that runs the recipe (its path first), e.g. to instrument it. `recipe`: a recipe's name, or the
    path of a script to launch instead."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", **(env or {})}
    script = recipe if recipe.endswith(".py") else str(ROOT / "recipes" / f"{recipe}.py")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *args, *via, script, *recipe_args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


ZERO3 = ["--config_file", str(ROOT / "accelerate_configs" / "deepspeed_zero3.yaml"), "--num_processes", "2"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher, dtype", [
    (["--multi_gpu", "--num_processes", "2"], []),
    (ZERO3, []),
    # The 2B YAMLs' precision: bf16 weights, gathered over gloo and trained by DeepSpeed's bf16 engine.
    (ZERO3, ["--dtype", "bfloat16", "--bf16", "true"]),
], ids=["ddp", "zero3", "zero3-bf16"])
def test_collab_dpo_two_processes(launcher, dtype, tiny_qwen_dir, data, tmp_path):
    out = tmp_path / "dpo"
    launch(launcher, ["--config", str(ROOT / "recipes" / "testbed" / "collab_dpo.yaml"),
                      *overrides(tiny_qwen_dir, data, out), *mining_overrides(data), *dtype], out)
    # 5 prompts over 2 ranks: the padded duplicate is dropped, every prompt is mined once.
    card = json.loads((out / "pairs" / "mining_card.json").read_text())
    assert card["n_prompts"] == 5
    from uturn_train.training.mining import load_pairs

    pairs = load_pairs(out / "pairs")
    keys = [(r["id"], r["rejected"]) for r in pairs]
    assert len(keys) == len(set(keys)) and 1 <= len({i for i, _ in keys}) <= 5
    assert [r["step"] for r in history(out)] == [0, 2, 4]  # one record per probed step: only rank 0 writes
    assert {"self_attn.q_proj", "linear_attn.in_proj_qkv", "mlp.down_proj"} <= adapter_modules(out)


@pytest.mark.slow
def test_a_crash_between_a_save_and_its_probe_is_made_good_on_resume(tiny_qwen_dir, data, tmp_path):
    """SIGKILL a real collab DPO run while it probes checkpoint-2, resume from it: checkpoint-2 is probed then, every
    checkpoint has exactly one record, and the resumed run trains on the pairs mined before instead of mining again."""
    import signal
    import time

    out = tmp_path / "dpo"
    # Longer user turns than `overrides` so that the probe after the save takes seconds: time to kill it.
    args = ["--config", str(ROOT / "recipes" / "testbed" / "collab_dpo.yaml"), *overrides(tiny_qwen_dir, data, out),
            *mining_overrides(data), "--probe_max_new_tokens", "96", "--probe_limit", "6"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "recipes" / "collab_dpo.py"), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    saved = out / "checkpoint-2" / "trainer_state.json"  # written last by the save; the probe follows it
    deadline = time.monotonic() + 600
    while not saved.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert saved.exists(), proc.stderr.read().decode()[-3000:]
    assert [r["step"] for r in history(out)] == [0], "killed before the probe of checkpoint-2 was recorded"
    mined = (out / "pairs" / "mining_card.json").stat().st_mtime_ns

    resumed = subprocess.run([*cmd, "--resume_from_checkpoint", str(out / "checkpoint-2")], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert [r["step"] for r in history(out)] == [0, 2, 4]
    assert all(r["error"] is None for r in history(out))
    assert "reusing the" in resumed.stdout and (out / "pairs" / "mining_card.json").stat().st_mtime_ns == mined
    assert "probing the restored checkpoint of step 2" in resumed.stderr


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [["--multi_gpu", "--num_processes", "2"], ZERO3], ids=["ddp", "zero3"])
def test_collab_grpo_two_processes(launcher, tiny_qwen_dir, data, tmp_path):
    out = tmp_path / "grpo"
    launch(launcher, ["--config", str(ROOT / "recipes" / "testbed" / "collab_grpo.yaml"),
                      *overrides(tiny_qwen_dir, data, out), *grpo_overrides(data)], out, recipe="collab_grpo")
    assert [r["step"] for r in history(out)] == [0, 2, 4]  # one record per probed step: only rank 0 writes
    assert {"self_attn.q_proj", "linear_attn.in_proj_qkv", "mlp.down_proj"} <= adapter_modules(out)


@pytest.mark.slow
def test_collab_grpo_zero3_probes_a_trained_model_whose_turns_end_apart(real_testbed, tmp_path):
    """Under ZeRO-3 every forward is a collective in GRPO (`never_replay_zero3_trace` keeps DeepSpeed's trace
    incomplete, and its start-of-forward hook then checks it across processes). The tiny random model writes every
    turn to its token limit; the built testbed ends its turns at different steps on each process's shard, and the
    probe at the first save waited for ever until the engine kept the processes' decode steps in step."""
    out = tmp_path / "grpo"
    launch(ZERO3, ["--config", str(ROOT / "recipes" / "testbed" / "collab_grpo.yaml"), "--model_name_or_path",
                   str(real_testbed), "--output_dir", str(out), "--report_to", "none", "--probe_task", "gsm8k",
                   "--probe_labeler", "rules", "--reward_labeler", "rules",
                   "--probe_data", str(real_testbed / "heldout.jsonl"), "--probe_limit", "16", "--prompt_source",
                   "conversations", "--prompt_data", str(real_testbed / "conversations.jsonl"), "--prompt_limit", "32",
                   "--per_device_train_batch_size", "8", "--max_steps", "2", "--save_steps", "2", "--logging_steps",
                   "1"], out, timeout=600, recipe="collab_grpo")
    records = history(out)
    assert [r["step"] for r in records] == [0, 2] and all(r["error"] is None for r in records)
    turns = [json.loads(line) for line in (out / "probe" / "step_2.jsonl").open()]
    assert len({t["completion_tokens"] for t in turns}) > 1  # the turns did end apart: what used to hang


def zero3_partitioning_all(tmp_path) -> list[str]:
    """`accelerate launch` options for ZeRO-3 on 2 processes with every weight partitioned: the tiny model's are all
    under DeepSpeed's default persistence threshold (1e5), kept whole, so nothing would ever be gathered."""
    ds_config = tmp_path / "zero3.json"
    ds_config.write_text(json.dumps({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}, **{
        k: "auto" for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")}}))
    return ["--use_deepspeed", "--deepspeed_config_file", str(ds_config), "--zero3_init_flag", "true",
            "--num_processes", "2"]


def held_after_each_backward(log: Path) -> list[float]:
    """Per rank and backward (4 each), the share of the layers' weights still gathered (`zero3_gathered.py`)."""
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((r["rank"], r["backward"]) for r in records) == [(k, b) for k in (0, 1) for b in (1, 2, 3, 4)]
    return [r["gathered_numel"] / r["layer_numel"] for r in records]


@pytest.mark.slow
def test_collab_grpo_zero3_layer_by_layer_releases_each_layer(tiny_qwen_dir, data, tmp_path):
    """Collab GRPO under ZeRO-3 with its answers and rollouts generated layer by layer (`--ds3_gather_for_generation
    false`, see the last test) trains and probes, and every backward ends with the layers' weights released (but the
    Gated DeltaNet's own small tensors), also on every second step, where DeepSpeed's replayed trace held all of them
    (`distributed.never_replay_zero3_trace`; 100% at backwards 2 and 4 without it, same gradient norms)."""
    out, log = tmp_path / "grpo", tmp_path / "gathered.jsonl"
    recipe_args = ["--config", str(ROOT / "recipes" / "testbed" / "collab_grpo.yaml"),
                   *overrides(tiny_qwen_dir, data, out), *grpo_overrides(data), "--ds3_gather_for_generation", "false",
                   "--gradient_checkpointing", "true"]
    launch(zero3_partitioning_all(tmp_path), recipe_args, out, recipe="collab_grpo",
           via=[str(HELPERS / "zero3_gathered.py")], env={"GATHERED_LOG": str(log)})
    assert [r["step"] for r in history(out)] == [0, 2, 4]
    assert max(held_after_each_backward(log)) < 0.05


@pytest.mark.slow
def test_zero3_lora_releases_each_layer_after_its_backward(tiny_qwen_dir, data, tmp_path):
    """TRL switches PEFT + ZeRO-3 to reentrant gradient checkpointing, under which DeepSpeed holds every frozen weight
    it gathers to recompute a layer until the whole backward ends (`distributed.keep_non_reentrant_checkpointing`):
    the recipe keeps it non-reentrant, so the layers' weights are released at the end of every backward (but the Gated
    DeltaNet's own small tensors), also after DPO's reference forward and the step-0 probe switched checkpointing back
    on. Asked for, reentrant stays, the same instrument then sees the held weights, and both train alike (same
    gradient norms)."""
    held, grad_norms = {}, {}
    for asked in (None, True):
        out, log = tmp_path / f"dpo-{asked}", tmp_path / f"gathered-{asked}.jsonl"
        asked_args = ["--gradient_checkpointing_kwargs", json.dumps({"use_reentrant": asked})] if asked else []
        launch(zero3_partitioning_all(tmp_path),
               ["--config", str(ROOT / "recipes" / "testbed" / "collab_dpo.yaml"),
                *overrides(tiny_qwen_dir, data, out), *mining_overrides(data), "--gradient_checkpointing", "true",
                *asked_args], out, via=[str(HELPERS / "zero3_gathered.py")],
               env={"GATHERED_LOG": str(log)})
        held[asked] = held_after_each_backward(log)
        state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
        grad_norms[asked] = [h["grad_norm"] for h in state["log_history"] if "grad_norm" in h]
    assert max(held[None]) < 0.05, held  # what stays: the Gated DeltaNet's own small tensors (A_log, dt_bias, conv)
    assert min(held[True]) > 0.5, held
    assert len(grad_norms[None]) == 4 and grad_norms[None] == pytest.approx(grad_norms[True], rel=1e-4), grad_norms


@pytest.mark.slow
def test_zero3_answers_layer_by_layer_before_the_trainer(tiny_qwen_dir, tmp_path):
    """Collab GRPO writes its prompts' answers before the trainer wraps the model; under ZeRO-3 with
    `--ds3_gather_for_generation false` (`gathered_if_zero3(whole=False)`) each layer gathers its weights for its own
    forward only: the same greedy answers as with the whole model gathered, on each rank at most the largest module
    gathered at once (the tiny model's embedding, 27%) instead of all of it, and nothing left gathered after."""
    launch(["--multi_gpu", "--num_processes", "2"], [str(tiny_qwen_dir), str(tmp_path / "answers")], tmp_path,
           recipe=str(HELPERS / "zero3_answers.py"))
    for rank in (0, 1):
        result = json.loads((tmp_path / f"answers.{rank}.json").read_text())
        whole, per_layer = result["whole"], result["per_layer"]
        assert len(whole["answers"]) == 5 and per_layer["answers"] == whole["answers"]
        assert whole["max_share"] == 1.0 and per_layer["max_share"] < 0.3, result
        assert whole["share_after"] == per_layer["share_after"] == 0.0

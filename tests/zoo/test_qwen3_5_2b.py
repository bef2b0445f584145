"""Qwen3.5-2B's shape in the repo (`uturn_train/zoo/qwen3_5_2b.py`) and the stand-in built from it, shrunk for speed:
the same code writes a hub-format vision-language folder that the hub path loads as the text-only causal LM."""

import json
import os

import pytest
import torch
from helpers import ROOT

from uturn_train.zoo import qwen3_5_2b

# Small widths, the 2B's layer pattern: 8 layers, so two full-attention layers (4th and 8th).
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
             linear_value_head_dim=16, vocab_size=2048)
SMALL_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2)


def test_the_2b_text_config_counts_the_published_parameters():
    """1,881,825,088 is the text model's size the sources give (with the vision tower and the MTP layer the hub's
    2,274,069,824): a wrong width, head count or tie would change it."""
    from transformers import Qwen3_5ForCausalLM

    config = qwen3_5_2b.text_config()
    assert config.layer_types == ["linear_attention"] * 3 + ["full_attention"] + (
        ["linear_attention"] * 3 + ["full_attention"]) * 5
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 1_881_825_088
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as the checkpoint
    full = qwen3_5_2b.config()
    assert full.vision_config.out_hidden_size == full.text_config.hidden_size == 2048


@pytest.fixture(scope="module")
def small_stand_in(tmp_path_factory):
    return qwen3_5_2b.build(tmp_path_factory.mktemp("q2b") / "stand-in", text_overrides=SMALL,
                            vision_overrides=SMALL_VISION)


def test_the_stand_in_loads_through_the_hub_path_with_its_own_weights(small_stand_in):
    from safetensors.torch import load_file

    from uturn_train.models import load_model, load_tokenizer

    saved = json.loads((small_stand_in / "config.json").read_text())
    assert saved["architectures"] == ["Qwen3_5ForConditionalGeneration"] and "vision_config" in saved
    model = load_model(str(small_stand_in))
    assert type(model).__name__ == "Qwen3_5ForCausalLM"  # the text-only class of the vision-language checkpoint
    weights = load_file(small_stand_in / "model.safetensors")
    assert any(k.startswith("model.visual.") for k in weights)
    # Every text weight comes from the file (bf16 on disk, upcast), none left at a fresh random init.
    for name, param in model.state_dict().items():
        key = "model.language_model." + name.removeprefix("model.") if name.startswith("model.") else name
        key = key if key in weights else "model.language_model.embed_tokens.weight"  # lm_head is tied
        assert torch.equal(param, weights[key].float()), name
    tokenizer = load_tokenizer(str(small_stand_in))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "2 + 2?"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # TRL's real Qwen3.5 template
    card = json.loads((small_stand_in / "card.json").read_text())
    assert card["stands_in_for"] == "Qwen/Qwen3.5-2B" and card["name"] == qwen3_5_2b.NAME
    from uturn_train.commands.plan import model_config

    assert model_config(str(small_stand_in)).num_hidden_layers == card["text_config"]["num_hidden_layers"] < 24


def test_lora_targets_of_the_stand_in_skip_the_vision_tower(small_stand_in):
    from peft import get_peft_model
    from trl import ModelConfig

    from uturn_train.models import load_model, lora_config

    model = load_model(str(small_stand_in))
    config = lora_config(ModelConfig(model_name_or_path=str(small_stand_in), use_peft=True, lora_r=4))
    wrapped = {n.split(".lora_A")[0] for n, _ in get_peft_model(model, config).named_parameters() if ".lora_A" in n}
    kinds = {n.split("layers.")[1].split(".", 1)[1] for n in wrapped}
    assert kinds == {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj", "mlp.gate_proj",
                     "mlp.up_proj", "mlp.down_proj"}
    assert len({n.split("layers.")[1].split(".")[0] for n in wrapped}) == SMALL["num_hidden_layers"]


def test_the_name_resolves_to_the_built_folder_without_building_again(small_stand_in, tmp_path, monkeypatch):
    import shutil
    from types import SimpleNamespace

    from uturn_train.zoo import resolve

    monkeypatch.setenv("UTURN_HOME", str(tmp_path))
    shutil.copytree(small_stand_in, tmp_path / qwen3_5_2b.NAME)
    args = SimpleNamespace(model_name_or_path="qwen3.5-2b-random")
    resolve(args)
    assert args.model_name_or_path == str(tmp_path / qwen3_5_2b.NAME)


def test_a_failed_build_leaves_nothing(tmp_path, monkeypatch):
    from transformers import Qwen3_5ForConditionalGeneration

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Qwen3_5ForConditionalGeneration, "save_pretrained", fail)
    with pytest.raises(OSError, match="disk full"):
        qwen3_5_2b.build(tmp_path / "stand-in", text_overrides=SMALL, vision_overrides=SMALL_VISION)
    assert list(tmp_path.iterdir()) == []


def _pairs(shared_data, out):
    """Text pairs as `uturn mine` writes them, from GSM8K reference solutions (a random model mines none)."""
    from uturn_train.io import read_jsonl
    from uturn_train.training.mining import save_pairs

    rows = list(read_jsonl(shared_data / "gsm8k" / "test.jsonl", ("question", "answer")))[:8]
    pairs = [{"id": f"gsm8k-{i}", "kind": "followup", "chosen": "Why did you subtract in the first step?",
              "rejected": "", "prompt": f"<|im_start|>user\n{r['question']}<|im_end|>\n<|im_start|>assistant\n"
              f"{r['answer']}<|im_end|>\n<|im_start|>user\n", "chosen_label": "grounded_followup",
              "rejected_label": "empty", "chosen_source": "reference", "rejected_source": "greedy"}
             for i, r in enumerate(rows)]
    return save_pairs(pairs, {"model": "test", "n_pairs": len(pairs)}, out)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("UTURN_2B_SMOKE"), reason="the 2B DPO smoke takes ~10 min and ~11 GB; it does "
                    "not fit the 30-minute CI: run it with UTURN_2B_SMOKE=1")
def test_the_2b_dpo_smoke_trains_probes_and_fits_its_plan(shared_data, tmp_path):
    """The 2B DPO YAML at full width on this CPU: the stand-in built from scratch under a fresh UTURN_HOME, 2 optimizer
    steps, the probe at steps 0 and 2, and memory near `uturn plan`'s."""
    import subprocess
    import sys

    root = ROOT
    pairs = _pairs(shared_data, tmp_path / "pairs")
    env = {**os.environ, "UTURN_HOME": str(tmp_path / "home"), "UTURN_SHARED_DATA": str(shared_data)}
    proc = subprocess.run([sys.executable, "eval/smoke_2b.py", "--recipes", "dpo", "--out", str(tmp_path / "out"),
                           "--pairs", str(pairs), "--max_length", "48", "--probe_limit", "2"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=2400)
    result = json.loads((tmp_path / "out" / "dpo-one" / "smoke.json").read_text())
    assert proc.returncode == 0 and result["ok"], (tmp_path / "out" / "dpo-one" / "log.txt").read_text()[-4000:]
    assert result["probed_steps"] == [0, 2] and len(result["step_seconds"]) == 1
    from uturn_train.commands.plan import model_config, shape

    assert result["trainable_params"] == shape(model_config("Qwen/Qwen3.5-2B"), 32, None).lora_params
    # RSS less the Python side over the plan: 1.20 measured on AVX2 (RSS also holds what glibc keeps of freed blocks).
    assert 0.8 <= result["measured_over_plan"] <= 1.3, result
    assert json.loads((tmp_path / "home" / qwen3_5_2b.NAME / "card.json").read_text())["name"] == qwen3_5_2b.NAME

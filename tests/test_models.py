"""`lora_config`: default LoRA targets by the model's `model_type`; `merged_lora`: adapters merged to generate."""

import re

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig
from trl import ModelConfig

from uturn_train.models import LLAMA_LORA_TARGETS, QWEN3_5_LORA_TARGETS, lora_config

# SmolLM2-135M-Instruct's config (`uturn_train.zoo` converts it to a LlamaForCausalLM).
SMOLLM2_CONFIG = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def peft(path, **kwargs):
    return lora_config(ModelConfig(model_name_or_path=str(path), use_peft=True, **kwargs))


def test_llama_family_targets_attention_and_mlp_of_every_layer(tmp_path):
    config = LlamaConfig(**SMOLLM2_CONFIG)
    config.save_pretrained(tmp_path)
    assert peft(tmp_path).target_modules == LLAMA_LORA_TARGETS
    with torch.device("meta"):  # the module names without the 135M weights
        names = [n for n, _ in AutoModelForCausalLM.from_config(config).named_modules()]
    matched = [n for n in names if re.fullmatch(LLAMA_LORA_TARGETS, n)]
    assert len(matched) == 30 * 7
    assert {re.sub(r".*layers\.\d+\.", "", n) for n in matched} == {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj"}
    assert not any(re.fullmatch(LLAMA_LORA_TARGETS, n) for n in ("lm_head", "model.embed_tokens"))


def test_qwen35_checkpoints_keep_their_targets(tiny_qwen_dir, tiny_vl_dir):
    assert peft(tiny_qwen_dir).target_modules == QWEN3_5_LORA_TARGETS  # model_type qwen3_5_text
    assert peft(tiny_vl_dir).target_modules == QWEN3_5_LORA_TARGETS  # qwen3_5 (the hub's vision-language layout)


def test_unknown_model_type_asks_for_targets_and_given_targets_are_kept(tmp_path):
    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no default LoRA targets for model_type 'gpt2'.*pass --lora_target_modules"):
        peft(tmp_path)
    assert peft(tmp_path, lora_target_modules=["c_attn", "c_proj"]).target_modules == {"c_attn", "c_proj"}
    assert lora_config(ModelConfig(model_name_or_path=str(tmp_path))) is None  # no PEFT: no config to read


def test_lm_head_reads_standard_strides_when_generating_in_half_precision_on_cpu(tiny_qwen_dir):
    """The prefill's last-position view reaches the LM head copied to standard strides (pytorch/pytorch#151934: on
    a strided view the CPU's bf16 matmul copies the whole head weight per row); fp32 views pass through untouched."""
    from uturn_train.generation import generate
    from uturn_train.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(str(tiny_qwen_dir))
    for dtype, standard_expected in (("bfloat16", True), ("float32", False)):
        model = load_model(str(tiny_qwen_dir), dtype=dtype, device="cpu")
        strides = []

        def record(module, args, out, strides=strides):
            x = args[0]
            strides.append(x.stride() == (x.size(1) * x.size(2), x.size(2), 1))

        model.get_output_embeddings().register_forward_hook(record)
        generate(model, tokenizer, ["Mia has 3 bags of 4 apples. How many apples?", "Hi"], max_new_tokens=3,
                 disable_progress=True)
        assert strides[0] is standard_expected  # the prefill: rows x 1 position sliced from rows x prompt length
        assert all(strides[1:])  # decoding steps are one position already


def adapted_tiny_qwen(tiny_qwen_dir, dtype="float32", **lora):
    """The tiny Qwen3.5 with a LoRA adapter whose B matrices are drawn, so that merging changes the weights."""
    from peft import get_peft_model

    from uturn_train.models import load_model

    model = get_peft_model(load_model(str(tiny_qwen_dir), dtype=dtype), peft(tiny_qwen_dir, lora_r=4, **lora))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model.eval()


def test_merged_lora_computes_the_adapted_model_and_puts_the_base_weights_back_exactly(tiny_qwen_dir):
    from uturn_train.models import merged_lora

    model = adapted_tiny_qwen(tiny_qwen_dir)
    ids = torch.tensor([[5, 9, 14, 3, 27, 8]])
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            plain = model(input_ids=ids).logits
        assert not torch.allclose(adapted, plain, atol=1e-3)  # the adapter matters to the output
        for _ in range(3):
            with merged_lora(model) as merged:
                changed = [n for n, p in merged.named_parameters() if "lora_" not in n and not torch.equal(p, base[n])]
                assert len(changed) > 10  # every adapted weight, merged
                torch.testing.assert_close(merged(input_ids=ids).logits, adapted, atol=1e-4, rtol=1e-4)
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if "lora_" not in n)
    layers = [m for m in model.modules() if hasattr(m, "merged_adapters")]
    assert layers and not any(m.merged for m in layers)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, adapted)  # the adapter path again, as before


def test_merged_lora_restores_the_weights_when_the_block_fails_and_passes_a_plain_model_through(tiny_qwen_dir):
    from uturn_train.models import load_model, merged_lora

    model = adapted_tiny_qwen(tiny_qwen_dir)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(RuntimeError, match="generation failed"), merged_lora(model):
        raise RuntimeError("generation failed")
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters())
    assert not any(getattr(m, "merged", False) for m in model.modules())
    with model.disable_adapter(), merged_lora(model):  # adapters off (a reference model's pass): nothing merged
        assert all(torch.equal(p, base[n]) for n, p in model.named_parameters())
    plain = load_model(str(tiny_qwen_dir), dtype="float32")
    with merged_lora(plain) as same:
        assert same is plain
    # Left on the adapter path: half precision (a small delta would round away) and DoRA (a variant).
    for model in (adapted_tiny_qwen(tiny_qwen_dir, "bfloat16"), adapted_tiny_qwen(tiny_qwen_dir, use_dora=True)):
        base = {n: p.detach().clone() for n, p in model.named_parameters()}
        with merged_lora(model):
            assert all(torch.equal(p, base[n]) for n, p in model.named_parameters())
            assert not any(getattr(m, "merged", False) for m in model.modules())

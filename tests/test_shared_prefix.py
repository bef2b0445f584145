"""Sampled rows that share their prompt's keys and values: the same attention as sdpa over the prompt copied k ways, the
same samples as the engine that copied it, and the prompt held once."""

import types

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny
from transformers import AutoModelForCausalLM, AutoTokenizer

import uturn_train.generation as engine
from uturn_train.shared_prefix import NAME, SharedPrefixLayer, shared_prefix_attention


def _expanded_sdpa(query, layer: SharedPrefixLayer, key, value, groups):
    """Reference: each row's prompt copied out (as `generate(num_return_sequences=k)` holds it), then sdpa."""
    keys = torch.cat([layer.prefix_keys_t.transpose(-1, -2)[layer.owner].float(), key], dim=2)
    values = torch.cat([layer.prefix_values[layer.owner].float(), value], dim=2)
    mask = torch.cat([layer.prefix_mask[layer.owner], torch.ones(len(key), key.shape[2], dtype=torch.bool)], dim=1)
    keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask[:, None, None, :]).transpose(1, 2)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_attention_equals_sdpa_over_the_expanded_prompt_as_rows_leave(dtype, tolerance):
    torch.manual_seed(0)
    prompts, k, kv_heads, groups, dim, width = 5, 3, 2, 3, 16, 11
    keys, values = torch.randn(prompts, kv_heads, width, dim, dtype=dtype), torch.randn(prompts, kv_heads, width, dim,
                                                                                       dtype=dtype)
    mask = torch.ones(prompts, width, dtype=torch.bool)
    for p in range(prompts):
        mask[p, : 2 * p] = False  # left padding of every length, none to 8 of 11
    layer = SharedPrefixLayer(keys, values, mask, torch.arange(prompts).repeat_interleave(k), capacity=6)
    cache, module = types.SimpleNamespace(layers=[layer]), types.SimpleNamespace(layer_idx=0)
    # Rows leave unevenly (prompt 1 keeps one row, prompt 3 none), as compaction leaves them; tokens keep coming.
    for step, keep in enumerate([None, [0, 1, 2, 3, 6, 7, 8, 12, 13, 14], [0, 2, 3, 4, 5, 6, 8, 9]]):
        if keep is not None:
            layer.reorder_cache(torch.tensor(keep))
        rows = len(layer.owner)
        key, value = layer.update(torch.randn(rows, kv_heads, 1, dim, dtype=dtype),
                                  torch.randn(rows, kv_heads, 1, dim, dtype=dtype))
        query = torch.randn(rows, kv_heads * groups, 1, dim, dtype=dtype)
        ours, _ = shared_prefix_attention(module, query, key, value, None, scaling=dim**-0.5, uturn_cache=cache)
        # The reference in fp32 from the same (rounded) inputs: half precision only rounds our matmuls' results.
        reference = _expanded_sdpa(query.float(), layer, key.float(), value.float(), groups)
        assert ours.shape == (rows, 1, kv_heads * groups, dim) and ours.dtype == dtype
        torch.testing.assert_close(ours.float(), reference, atol=tolerance, rtol=tolerance, msg=f"step {step}")
    assert layer.owner.tolist() == [0, 0, 1, 2, 2, 2, 3, 3] and len(layer.prefix_keys_t) == 4  # prompt 3 dropped


def test_attention_refuses_what_it_cannot_compute():
    layer = SharedPrefixLayer(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.ones(1, 2, dtype=torch.bool),
                              torch.tensor([0, 0]), capacity=2)
    module = types.SimpleNamespace(layer_idx=0)
    key, value = layer.update(torch.zeros(2, 1, 1, 4), torch.zeros(2, 1, 1, 4))
    with pytest.raises(ValueError, match="uturn_cache"):
        shared_prefix_attention(module, torch.zeros(2, 1, 1, 4), key, value, None)
    with pytest.raises(ValueError, match="one token per row"):  # a prefill (two query tokens) is not for it
        shared_prefix_attention(module, torch.zeros(2, 1, 2, 4), key, value, None,
                                uturn_cache=types.SimpleNamespace(layers=[layer]))


@pytest.fixture(scope="module")
def models(tiny_qwen_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    qwen = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.float32).eval()
    return {"qwen": qwen, "attention_only": tiny.tiny_llama_lm(tokenizer)}, tokenizer, tiny.conversations(tokenizer)


@pytest.mark.parametrize("which", ["qwen", "attention_only"])
def test_samples_are_those_of_the_prompt_copied_k_ways(models, which, monkeypatch):
    # Rows end apart (a frequent letter stops them), so rows leave and prompts are dropped mid-decode. The two ways of
    # holding the prompt differ in the last bits of a logit, which moves an inverse-CDF draw about once in a thousand:
    # over these few short turns, identical.
    by_name, tokenizer, prompts = models
    model = by_name[which]
    kwargs = {"stop": ["<|im_end|>", "y"], "max_new_tokens": 12, "temperature": 1.0, "num_samples": 3,
              "batch_size": 4, "seed": 5, "disable_progress": True}
    layers = []
    real = engine._share_prompts

    def spy(cache, *args):
        shared = real(cache, *args)
        layers.append(sum(isinstance(layer, SharedPrefixLayer) for layer in cache.layers))
        return shared

    monkeypatch.setattr(engine, "_share_prompts", spy)
    shared = engine.generate(model, tokenizer, prompts, **kwargs)
    config = model.config.get_text_config()
    attention_layers = sum(t == "full_attention" for t in getattr(config, "layer_types", None) or
                           ["full_attention"] * config.num_hidden_layers)
    assert layers == [attention_layers] * 2  # both batches held their prompts once, in every attention layer
    assert model.config._attn_implementation == "sdpa" != NAME  # and the model was given back as it was
    monkeypatch.setattr(engine, "_share_prompts", lambda *args: False)
    copied = engine.generate(model, tokenizer, prompts, **kwargs)
    assert shared == copied
    lengths = {g.completion_tokens for gens in shared for g in gens}
    assert len(lengths) >= 4, lengths

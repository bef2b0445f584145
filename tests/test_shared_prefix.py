"""Sampled rows that share their prompt's keys and values: the same attention as sdpa over the prompt copied k ways, the
same logits as the engine that copied it, and the prompt held once."""

import types

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny
from transformers import AutoModelForCausalLM, AutoTokenizer

import uturn_train.generation as engine
from uturn_train.shared_prefix import (
    NAME,
    Owners,
    SharedPrefixLayer,
    check_attended,
    shared_attention,
    shared_prefix_attention,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()  # as test_generation: tiny models, and no spin-waiting on shared cores
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_attention_equals_sdpa_over_the_prompt_copied_per_row_as_rows_leave(dtype, tolerance):
    # The reference is kept apart from the layer: each row's prompt and own tokens, selected as the rows leave.
    torch.manual_seed(0)
    prompts, k, kv_heads, groups, dim, width = 5, 3, 2, 3, 16, 11
    keys, values = (torch.randn(prompts, kv_heads, width, dim, dtype=dtype) for _ in range(2))
    mask = torch.ones(prompts, width, dtype=torch.bool)
    for p in range(prompts):
        mask[p, : 2 * p] = False  # left padding of every length, none to 8 of 11
    layer = SharedPrefixLayer(keys, values, mask, Owners(torch.arange(prompts).repeat_interleave(k)), capacity=6)
    cache, module = types.SimpleNamespace(layers=[layer]), types.SimpleNamespace(layer_idx=0)
    prompt_of, own_keys, own_values = [p for p in range(prompts) for _ in range(k)], [], []
    # Rows leave unevenly (prompt 1 keeps one row, prompt 3 none), as compaction leaves them; tokens keep coming.
    for step, keep in enumerate([None, [0, 1, 2, 3, 6, 7, 8, 12, 13, 14], [0, 2, 3, 4, 5, 6, 8, 9], [1, 2, 7]]):
        if keep is not None:
            layer.reorder_cache(torch.tensor(keep))
            prompt_of = [prompt_of[i] for i in keep]
            own_keys, own_values = [t[keep] for t in own_keys], [t[keep] for t in own_values]
        rows = len(prompt_of)
        own_keys.append(torch.randn(rows, kv_heads, 1, dim, dtype=dtype))
        own_values.append(torch.randn(rows, kv_heads, 1, dim, dtype=dtype))
        key, value = layer.update(own_keys[-1], own_values[-1])
        query = torch.randn(rows, kv_heads * groups, 1, dim, dtype=dtype)
        ours, _ = shared_prefix_attention(module, query, key, value, None, scaling=dim**-0.5, uturn_cache=cache)
        # sdpa in fp32 from the same (rounded) inputs: half precision only rounds our matmuls' results.
        whole_keys = torch.cat([keys[prompt_of], *own_keys], dim=2).float().repeat_interleave(groups, 1)
        whole_values = torch.cat([values[prompt_of], *own_values], dim=2).float().repeat_interleave(groups, 1)
        whole_mask = torch.cat([mask[prompt_of], torch.ones(rows, step + 1, dtype=torch.bool)], dim=1)
        reference = F.scaled_dot_product_attention(query.float(), whole_keys, whole_values,
                                                   attn_mask=whole_mask[:, None, None, :]).transpose(1, 2)
        assert ours.shape == (rows, 1, kv_heads * groups, dim) and ours.dtype == dtype
        torch.testing.assert_close(ours.float(), reference, atol=tolerance, rtol=tolerance, msg=f"step {step}")
    assert prompt_of == [0, 1, 4] and len(layer.prefix_keys_t) == 3  # prompts 2 and 3 dropped from the layer


def test_what_it_cannot_compute_is_refused():
    layer = SharedPrefixLayer(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.ones(1, 2, dtype=torch.bool),
                              Owners(torch.tensor([0, 0])), capacity=2)
    cache, module = types.SimpleNamespace(layers=[layer]), types.SimpleNamespace(layer_idx=0)
    key, value = layer.update(torch.zeros(2, 1, 1, 4), torch.zeros(2, 1, 1, 4))
    with pytest.raises(RuntimeError, match="did not read the shared prompt"):  # a step the function never saw
        check_attended(cache)
    with pytest.raises(ValueError, match="uturn_cache"):
        shared_prefix_attention(module, torch.zeros(2, 1, 1, 4), key, value, None)
    with pytest.raises(ValueError, match="one token per row"):  # a prefill (two query tokens) is not for it
        shared_prefix_attention(module, torch.zeros(2, 1, 2, 4), key, value, None, uturn_cache=cache)
    with pytest.raises(ValueError, match="sliding_window"):
        shared_prefix_attention(module, torch.zeros(2, 1, 1, 4), key, value, None, uturn_cache=cache,
                                sliding_window=4096)
    shared_prefix_attention(module, torch.zeros(2, 1, 1, 4), key, value, None, uturn_cache=cache)
    check_attended(cache)


@pytest.fixture(scope="module")
def models(tiny_qwen_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    qwen = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.float32).eval()
    return {"qwen": qwen, "attention_only": tiny.tiny_llama_lm(tokenizer)}, tokenizer, tiny.conversations(tokenizer)


def test_the_attention_implementation_is_put_back_whatever_happens(models):
    model = models[0]["attention_only"]
    with pytest.raises(KeyError), shared_attention(model) as switched:
        assert switched and model.config._attn_implementation == NAME
        raise KeyError("inside")
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("which", ["qwen", "attention_only"])
def test_logits_are_those_of_the_prompt_copied_k_ways(models, which, monkeypatch):
    # Rows end apart (a frequent letter stops them), so rows leave and prompts are dropped mid-decode. The copied run
    # replays the shared run's tokens, so the two decode the same rows step for step; their logits differ in the last
    # bits only.
    by_name, tokenizer, prompts = models
    model = by_name[which]
    kwargs = {"stop": ["<|im_end|>", "y"], "max_new_tokens": 12, "temperature": 1.0, "num_samples": 3,
              "batch_size": 4, "seed": 5, "disable_progress": True}
    sample, steps, tokens, prompts_held = engine._sample, [], [], []

    def recording(logits, temperature):
        steps.append(logits.clone())
        tokens.append(sample(logits, temperature))
        return tokens[-1]

    real_reorder = SharedPrefixLayer.reorder_cache

    def reorder(layer, beam_idx):
        real_reorder(layer, beam_idx)
        prompts_held.append(len(layer.prefix_keys_t))

    monkeypatch.setattr(engine, "_sample", recording)
    monkeypatch.setattr(SharedPrefixLayer, "reorder_cache", reorder)
    shared = engine.generate(model, tokenizer, prompts, **kwargs)
    assert model.config.get_text_config()._attn_implementation == "sdpa"  # given back as it was
    assert prompts_held and min(prompts_held) < 4  # rows left, and with them whole prompts

    shared_steps, replay = list(steps), iter(tokens)
    steps.clear()
    monkeypatch.setattr(engine, "_sample", lambda logits, temperature: (steps.append(logits.clone()), next(replay))[1])
    monkeypatch.setattr(engine, "_share_prompts", lambda *args: False)
    copied = engine.generate(model, tokenizer, prompts, **kwargs)
    assert len(steps) == len(shared_steps) > 10
    for i, (a, b) in enumerate(zip(shared_steps, steps)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"step {i}")
    assert copied == shared  # the same tokens, ends and texts
    assert len({g.completion_tokens for gens in shared for g in gens}) >= 4

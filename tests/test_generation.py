"""The batched generation engine on tiny random Qwen3.5 models (fp32, CPU)."""

import re

import pytest
import torch
from helpers import tiny
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from uturn_train.chat import user_turn_prompt
from uturn_train.generation import generate


def conversations(tokenizer, n: int = 7) -> list[str]:
    """User-turn prompts of clearly different lengths, in no particular length order."""
    lines = tiny.chat_corpus(2 * n, seed=1)
    prompts = []
    for i in range(n):
        answer = " ".join(lines[2 * i + 1 : 2 * i + 2 + (i * 3) % 5])
        messages = [{"role": "user", "content": lines[2 * i]}, {"role": "assistant", "content": answer}]
        prompts.append(user_turn_prompt(tokenizer, messages))
    return prompts


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # A tiny model gains nothing from intra-op threads, and OpenMP threads spin-wait when the 2 cores are shared with
    # other work: one generate() call measured 0.3 s with 1 thread and 13 s with 2 under load.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def qwen(tiny_qwen_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    return model.eval(), tokenizer, conversations(tokenizer)


def per_example(model, tokenizer, prompt, max_new_tokens, end_ids):
    """A plain unpadded `model.generate` call: the reference the engine must reproduce."""
    input_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    output = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=end_ids,
        pad_token_id=end_ids[0],
    )
    return output[0, input_ids.shape[1] :].tolist()


def test_batched_greedy_equals_per_example_in_prompt_order(qwen):
    model, tokenizer, prompts = qwen
    lengths = [len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts]
    assert len(set(lengths)) == len(lengths) and lengths not in (sorted(lengths), sorted(lengths, reverse=True))

    batched = generate(model, tokenizer, prompts, max_new_tokens=12, batch_size=3, disable_progress=True)
    single = [generate(model, tokenizer, [p], max_new_tokens=12, disable_progress=True)[0] for p in prompts]
    assert batched == single
    assert [g[0].prompt_tokens for g in batched] == lengths
    assert len({g[0].text for g in batched}) == len(prompts)  # distinct outputs: an order mix-up would show

    end_ids = [tokenizer.pad_token_id, *tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|im_start|>"])]
    for prompt, (generation,) in zip(prompts, batched):
        ids = per_example(model, tokenizer, prompt, 12, end_ids)
        stopped = ids[-1] in end_ids
        assert generation.completion_tokens == len(ids) - stopped
        assert generation.text == tokenizer.decode(ids, skip_special_tokens=True)
        assert generation.finish_reason == ("stop" if stopped else "length")


def test_llama_template_without_pad_token(tiny_llama_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    assert tokenizer.pad_token is None  # padding falls back to eos
    prompts = conversations(tokenizer, n=4)
    batched = generate(model, tokenizer, prompts, max_new_tokens=10, batch_size=4, disable_progress=True)
    single = [generate(model, tokenizer, [p], max_new_tokens=10, disable_progress=True)[0] for p in prompts]
    assert batched == single


def test_length_and_stop_string_cut(qwen):
    model, tokenizer, prompts = qwen
    free = generate(model, tokenizer, prompts, max_new_tokens=16, stop=[], disable_progress=True)
    assert all(g.finish_reason == "length" and g.stop is None and g.completion_tokens == 16 for (g,) in free)

    # A word the random model writes for the first prompt becomes a (multi-token, non-special) stop string.
    text = free[0][0].text
    word = max(re.findall(r"[A-Za-z]{3,}", text), key=len)
    cut = generate(model, tokenizer, prompts, max_new_tokens=16, stop=[word], batch_size=4, disable_progress=True)
    first = cut[0][0]
    assert (first.text, first.finish_reason, first.stop) == (text[: text.find(word)], "stop", word)
    assert first.completion_tokens < 16
    single = [generate(model, tokenizer, [p], max_new_tokens=16, stop=[word], disable_progress=True) for p in prompts]
    assert cut == [s[0] for s in single]
    for (g,), (f,) in zip(cut, free):
        assert word not in g.text and f.text.startswith(g.text)


def test_sampling_shapes_and_seeds(qwen):
    model, tokenizer, prompts = qwen
    kwargs = {"max_new_tokens": 8, "temperature": 1.0, "num_samples": 3, "batch_size": 4, "disable_progress": True}
    first = generate(model, tokenizer, prompts, seed=1, **kwargs)
    assert [len(samples) for samples in first] == [3] * len(prompts)
    assert generate(model, tokenizer, prompts, seed=1, **kwargs) == first
    assert generate(model, tokenizer, prompts, seed=2, **kwargs) != first
    assert len({g.text for g in first[0]}) == 3
    greedy = generate(model, tokenizer, prompts, max_new_tokens=8, num_samples=3, disable_progress=True)
    assert [len(samples) for samples in greedy] == [1] * len(prompts)


def test_checkpoint_generation_config_is_ignored(qwen):
    model, tokenizer, prompts = qwen
    greedy = generate(model, tokenizer, prompts, max_new_tokens=8, disable_progress=True)
    sampled = generate(model, tokenizer, prompts, max_new_tokens=8, temperature=1.0, disable_progress=True)
    saved = model.generation_config
    # top_k=1 would turn sampling into greedy; the penalties would change greedy.
    model.generation_config = GenerationConfig(top_k=1, repetition_penalty=3.0, no_repeat_ngram_size=1, min_p=0.5)
    try:
        assert generate(model, tokenizer, prompts, max_new_tokens=8, disable_progress=True) == greedy
        assert generate(model, tokenizer, prompts, max_new_tokens=8, temperature=1.0, disable_progress=True) == sampled
    finally:
        model.generation_config = saved
    assert sampled != greedy


@pytest.mark.parametrize("training", [True, False])
def test_state_is_restored(qwen, training):
    model, tokenizer, prompts = qwen
    modes = []
    hook = model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    model.train(training)
    tokenizer.padding_side = "right"
    rng = torch.get_rng_state()
    try:
        generate(model, tokenizer, prompts[:3], max_new_tokens=4, temperature=1, num_samples=2, disable_progress=True)
    finally:
        hook.remove()
    assert modes and not any(modes)  # generated in eval mode
    assert model.training is training and all(m.training is training for m in model.modules())
    assert tokenizer.padding_side == "right"
    assert torch.equal(torch.get_rng_state(), rng)
    model.eval()


def test_bad_arguments(qwen):
    model, tokenizer, prompts = qwen
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(model, tokenizer, [prompts[0], ""], disable_progress=True)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate(model, tokenizer, prompts, temperature=-1, disable_progress=True)
    with pytest.raises(ValueError, match="num_samples, batch_size and max_new_tokens must be >= 1"):
        generate(model, tokenizer, prompts, num_samples=0, disable_progress=True)
    with pytest.raises(ValueError, match="stop strings must be non-empty"):
        generate(model, tokenizer, prompts, stop=["\n", ""], disable_progress=True)
    assert generate(model, tokenizer, [], disable_progress=True) == []

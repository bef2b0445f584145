"""The batched generation engine on tiny random Qwen3.5 models (fp32, CPU): the same turns as `model.generate`, greedy
and sampled, with each prompt computed once and ended rows dropped."""

import re

import pytest
import torch
from helpers import tiny
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from uturn_train.chat import stop_strings
from uturn_train.generation import PLAIN_SAMPLING, finish, generate


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
    return model.eval(), tokenizer, tiny.conversations(tokenizer)


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


def batched_generate(model, tokenizer, prompts, stops, *, max_new_tokens, temperature, k, batch_size, seed):
    """The engine as it was: one `model.generate(num_return_sequences=k)` per length-sorted batch, seeded once."""
    added = tokenizer.get_added_vocab()
    end_ids = {added[s] for s in stops if s in added} | {tokenizer.pad_token_id}
    strings = [s for s in stops if s not in added]
    encoded = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
    results = [None] * len(prompts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for batch in [order[i : i + batch_size] for i in range(0, len(order), batch_size)]:
            width = max(len(encoded[i]) for i in batch)
            ids = torch.full((len(batch), width), tokenizer.pad_token_id)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, width - len(encoded[i]) :], mask[row, width - len(encoded[i]) :] = torch.tensor(encoded[i]), 1
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 do_sample=temperature > 0, num_return_sequences=k, eos_token_id=sorted(end_ids),
                                 pad_token_id=tokenizer.pad_token_id, stop_strings=strings or None, tokenizer=tokenizer,
                                 **({"temperature": temperature, **PLAIN_SAMPLING} if temperature else {}))
            out = out[:, width:].tolist()
            for row, i in enumerate(batch):
                results[i] = [finish(tokenizer, o, end_ids, stops, len(encoded[i]))
                              for o in out[row * k : (row + 1) * k]]
    return results


class Forwards:
    """The rows and tokens of every forward pass of a model."""

    def __init__(self, model):
        self.shapes = []
        self.hook = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.shapes.append(tuple(kwargs["input_ids"].shape))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.hook.remove()


@pytest.fixture(scope="module")
def attention_only(tiny_qwen_dir):
    """A tiny Llama (attention layers only) with the Qwen3.5 tokenizer: the engine's one-prompt-at-a-time prefill."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    return tiny.tiny_llama_lm(tokenizer), tokenizer, tiny.conversations(tokenizer)


@pytest.mark.parametrize("which", ["qwen", "attention_only"])
def test_greedy_turns_are_generates_own_with_rows_ending_apart(request, which):
    # A frequent letter as a stop string ends the rows of a batch at different steps, so ended rows leave it; greedy
    # turns are those of `model.generate`, batched as the engine was and one prompt at a time.
    model, tokenizer, prompts = request.getfixturevalue(which)
    stops = [*stop_strings(tokenizer), "y"]
    ours = generate(model, tokenizer, prompts, stop=stops, max_new_tokens=30, batch_size=3, disable_progress=True)
    assert ours == batched_generate(model, tokenizer, prompts, stops, max_new_tokens=30, temperature=0.0, k=1,
                                    batch_size=3, seed=0)
    assert ours == [batched_generate(model, tokenizer, [p], stops, max_new_tokens=30, temperature=0.0, k=1,
                                     batch_size=1, seed=0)[0] for p in prompts]
    lengths = {g.completion_tokens for (g,) in ours}
    assert len(lengths) >= 4 and any(g.finish_reason == "stop" for (g,) in ours), lengths


@pytest.mark.parametrize("which", ["qwen", "attention_only"])
def test_sampling_draws_from_the_softmax(request, which):
    # The first token of 4,000 samples of one prompt against the model's own distribution at that position.
    model, tokenizer, prompts = request.getfixturevalue(which)
    with torch.inference_mode():
        ids = tokenizer(prompts[0], add_special_tokens=False, return_tensors="pt").input_ids
        probs = torch.softmax(model(ids).logits[0, -1].float() / 0.7, -1)
    draws = generate(model, tokenizer, prompts[:1], max_new_tokens=1, temperature=0.7, num_samples=4000, seed=3,
                     stop=[], disable_progress=True)[0]
    # A draw of an end token ends the turn with no token: the other tokens' counts are binomial all the same.
    counts = torch.bincount(torch.tensor([g.token_ids[0] for g in draws if g.token_ids]), minlength=len(probs)).float()
    top = probs.topk(5).indices
    expected = probs[top] * 4000
    assert torch.all((counts[top] - expected).abs() <= 4 * expected.sqrt() + 2), (counts[top], expected)
    rare = probs < 1e-4  # what the model barely allows is drawn as often as it allows, in total
    expected = probs[rare].sum() * 4000
    assert (counts[rare].sum() - expected).abs() <= 4 * expected.sqrt() + 2, (counts[rare].sum(), expected)


def test_each_prompt_is_computed_once_and_ended_rows_stop_costing(qwen, attention_only):
    stops = None
    for (model, tokenizer, prompts), alone in ((qwen, False), (attention_only, True)):
        prompts = prompts[:4]
        stops = [*stop_strings(tokenizer), "y"]
        with Forwards(model) as forwards:
            out = generate(model, tokenizer, prompts, stop=stops, max_new_tokens=30, temperature=1.0,
                           num_samples=4, batch_size=4, seed=4, disable_progress=True)
        lengths = [len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts]
        prefill = [(1, n) for n in sorted(lengths, reverse=True)] if alone else [(4, max(lengths))]
        assert forwards.shapes[: len(prefill)] == prefill  # 4 prompts once, not 16 rows; alone: each unpadded
        steps = forwards.shapes[len(prefill) :]
        assert all(n == 1 for _, n in steps) and steps[0][0] <= 16  # then one token per row still on
        rows = [r for r, _ in steps]
        assert rows == sorted(rows, reverse=True) and rows[-1] <= 12  # rows leave as they end
        longest = max(g.completion_tokens + (g.finish_reason == "stop") for gens in out for g in gens)
        assert len(steps) == longest - 1  # every row's tokens but the first come from a decode step
        assert sum(rows) < 16 * len(steps)


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
    prompts = tiny.conversations(tokenizer, n=4)
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


@pytest.mark.parametrize("which", ["qwen", "attention_only"])
def test_sampling_shapes_and_seeds(request, which):
    model, tokenizer, prompts = request.getfixturevalue(which)
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

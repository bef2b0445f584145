"""Batched generation for the probe: left-padded, length-sorted, seeded, with stop strings and finish reasons."""

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .chat import stop_strings

# `generate()` fills every field it is not given from `model.generation_config` (transformers
# `_prepare_generation_config`), and chat checkpoints ship sampling defaults there (Qwen3: temperature=0.6, top_k=20,
# top_p=0.95). Naming the neutral value of each knob that shapes the distribution keeps our decoding plain
# greedy / plain temperature sampling, whatever the checkpoint says, so results compare across models.
PLAIN_DECODING = {
    "num_beams": 1,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "min_new_tokens": 0,
    "use_cache": True,
}
# Only passed when sampling: greedy ignores them, and transformers warns about sampling flags set for greedy.
PLAIN_SAMPLING = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}


@dataclass
class Generation:
    """One generated continuation.

    Args:
        text (`str`): decoded with special tokens skipped, cut before the first stop string.
        finish_reason (`str`): `"stop"` (a stop string or end-of-turn token ended it), `"length"` (`max_new_tokens`) or
            `"error"` (a server request that failed for good, see `error`; no text).
        stop (`str` or `None`): the stop string or token that ended it (e.g. `"<|im_end|>"`), `None` on length, on
            error, or when a server does not say which end token it met.
        prompt_tokens (`int`): tokens in the prompt.
        completion_tokens (`int`): tokens generated before the end-of-turn token, which is not counted (the tokens of
            a stop string are).
        token_ids (`tuple[int, ...]`): those tokens' ids (empty from a server, which returns text).
        error (`str`, *optional*): why a server request failed (finish reason `"error"`); such a continuation is
            counted apart and left out of every rate.
    """

    text: str
    finish_reason: str
    stop: str | None
    prompt_tokens: int
    completion_tokens: int
    token_ids: tuple[int, ...] = ()
    error: str | None = None


def _finish(tokenizer, ids: list[int], end_ids: set[int], stops: list[str], prompt_tokens: int) -> Generation:
    # generate() pads a finished row with pad_token_id, which is one of `end_ids`: the row ends at the first of them.
    # The end token itself is not counted: after a stop string, the same position holds padding, not a token.
    end = next((i for i, token in enumerate(ids) if token in end_ids), len(ids))
    text = tokenizer.decode(ids[:end], skip_special_tokens=True)
    # Cut at the earliest stop string, also when the model spelled an end-of-turn token out in plain pieces.
    found = min(((text.find(s), s) for s in stops if s in text), default=None)
    token_ids = tuple(ids[:end])
    if found is not None:
        return Generation(text[: found[0]], "stop", found[1], prompt_tokens, end, token_ids=token_ids)
    if end < len(ids):
        stop = tokenizer.convert_ids_to_tokens(ids[end])
        return Generation(text, "stop", stop, prompt_tokens, end, token_ids=token_ids)
    return Generation(text, "length", None, prompt_tokens, end, token_ids=token_ids)


def generate(
    model,
    tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    num_samples: int = 1,
    batch_size: int = 16,
    seed: int = 0,
    stop: list[str] | None = None,
    desc: str | None = None,
    disable_progress: bool = False,
) -> list[list[Generation]]:
    """Generate continuations of already-rendered prompts in left-padded, length-sorted batches.

    Greedy results equal one-prompt-at-a-time `model.generate`. Sampling is reproducible for the same seed, inputs and
    `batch_size`, and leaves the caller's RNG state, the model's train/eval mode and the tokenizer untouched, so a
    training callback can call this.

    Args:
        model ([`~transformers.PreTrainedModel`]): causal LM (unwrapped from DDP/DeepSpeed by the caller).
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): its tokenizer.
        prompts (`list[str]`): full prompt texts (e.g. from [`~uturn_train.chat.user_turn_prompt`]); they are
            tokenized without special tokens, since a chat template already holds BOS.
        max_new_tokens (`int`, *optional*, defaults to `256`): token limit per continuation.
        temperature (`float`, *optional*, defaults to `0.0`): `0` is greedy with one continuation per prompt; above
            `0`, plain temperature sampling (no top-k/top-p) with `num_samples` continuations per prompt.
        num_samples (`int`, *optional*, defaults to `1`): continuations per prompt when sampling.
        batch_size (`int`, *optional*, defaults to `16`): prompts per `generate` call.
        seed (`int`, *optional*, defaults to `0`): sampling seed.
        stop (`list[str]`, *optional*): stop strings; defaults to [`~uturn_train.chat.stop_strings`] of the chat
            template. The eos token always stops.
        desc (`str`, *optional*): progress bar label.
        disable_progress (`bool`, *optional*, defaults to `False`): hide the progress bar.

    Returns:
        `list[list[Generation]]`: per prompt, in the order given, its continuations.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if num_samples < 1 or batch_size < 1 or max_new_tokens < 1:
        raise ValueError(
            "num_samples, batch_size and max_new_tokens must be >= 1, "
            f"got {num_samples}, {batch_size}, {max_new_tokens}"
        )
    if not prompts:
        return []
    stops = stop_strings(tokenizer) if stop is None else list(stop)
    if not all(stops):
        raise ValueError(f"stop strings must be non-empty, got {stops}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError(f"the tokenizer of {tokenizer.name_or_path!r} has neither a pad nor an eos token; set one")
    # Stops that are added tokens (`<|im_end|>`, `<|im_start|>`) can only appear as that token: stop on the id, which
    # is exact and free. Other strings (`"\nUser:"`) may span or split tokens: transformers' StopStringCriteria.
    added = tokenizer.get_added_vocab()
    end_ids = {added[s] for s in stops if s in added} | {pad_id}
    if tokenizer.eos_token_id is not None:
        end_ids.add(tokenizer.eos_token_id)
    string_stops = [s for s in stops if s not in added]

    encoded = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    for i, ids in enumerate(encoded):
        if not ids:
            raise ValueError(f"prompt {i} is empty: render it with the chat template first")
    # Longest first: similar lengths share a batch (less padding) and an out-of-memory error shows up at once.
    order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
    sampling = temperature > 0
    k = num_samples if sampling else 1
    results: list[list[Generation]] = [[] for _ in prompts]

    device = model.device
    # Seed inside a forked RNG: sampling is reproducible and the caller's (e.g. the trainer's) RNG state is untouched.
    devices = [] if device.type == "cpu" else list(range(torch.get_device_module(device.type).device_count()))
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices, device_type=device.type), torch.inference_mode():
            torch.manual_seed(seed)
            batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
            for batch in tqdm(batches, desc=desc, disable=disable_progress, unit="batch"):
                width = max(len(encoded[i]) for i in batch)
                input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
                attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
                for row, i in enumerate(batch):  # left padding: every row's last prompt token is at the same column
                    input_ids[row, width - len(encoded[i]) :] = torch.tensor(encoded[i])
                    attention_mask[row, width - len(encoded[i]) :] = 1
                output = model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention_mask.to(device),
                    max_new_tokens=max_new_tokens,
                    do_sample=sampling,
                    num_return_sequences=k,
                    eos_token_id=sorted(end_ids),
                    pad_token_id=pad_id,
                    stop_strings=string_stops or None,
                    tokenizer=tokenizer if string_stops else None,
                    **PLAIN_DECODING,
                    **({"temperature": temperature, **PLAIN_SAMPLING} if sampling else {}),
                )
                completions = output[:, width:].tolist()
                for row, i in enumerate(batch):
                    for ids in completions[row * k : (row + 1) * k]:  # num_return_sequences are contiguous per prompt
                        results[i].append(_finish(tokenizer, ids, end_ids, stops, len(encoded[i])))
    finally:
        model.train(was_training)
    return results

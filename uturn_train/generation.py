"""Batched generation for the probe: length-sorted, seeded, with stop strings and finish reasons.

The probe's cost is sampled user turns: k continuations of one long prompt (the query and the answer). Transformers'
`generate(num_return_sequences=k)` repeats every prompt k times before the prefill, pads the prompts of a batch to the
longest, concatenates the cache at every step and runs a batch until its longest row ends. Here each prompt is computed
once (alone, unpadded, for models of attention layers only) and its k rows read its keys and values where they are
(`shared_prefix`; Gated DeltaNet's states, which are small, are expanded k ways), the cache is preallocated, and rows
that have ended leave the batch.
Transformers' continuous batching (`generate_batch`) would drop finished rows, but its paged cache has no layer type for
linear attention (Qwen3.5), its scheduler thread makes sampling unreproducible, and on SmolLM2 on a CPU it ran 2x
slower than `generate`, 3x slower than this engine (`tests/benchmarks/bench_probe.py --continuous_batching`).

Decoding is plain: greedy (argmax: the same tokens as an unbatched `generate`), or softmax of the logits over the
temperature, sampled by inverse CDF with the RNG seeded by `seed` (reproducible for the same seed, prompts and
`batch_size`; not `generate`'s own draws, which spend one random number per vocabulary entry and row).
"""

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

from .chat import stop_strings
from .shared_prefix import Owners, SharedPrefixLayer, check_attended, shared_attention

# What an OpenAI-compatible server is asked for (`server.py`), so that it decodes as this engine does: checkpoints ship
# sampling defaults in `generation_config.json` (Qwen3: temperature=0.6, top_k=20, top_p=0.95) that would apply.
PLAIN_DECODING = {
    "num_beams": 1,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "min_new_tokens": 0,
    "use_cache": True,
}
# Only passed when sampling.
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


def finish(tokenizer, ids: list[int], end_ids: set[int], stops: list[str], prompt_tokens: int) -> Generation:
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


class _PreallocatedLayer(DynamicLayer):
    """A full-attention layer's keys and values written into buffers sized for the whole generation, where
    `DynamicLayer` concatenates at every step, which copies the layer's cache once per token (at 128 rows of 500
    tokens, 2.9 GB per step for SmolLM2-135M). Attention reads exactly the tokens so far, as with `DynamicLayer`.
    With `target` set to (row, offset, rows), a forward of one prompt writes that row from `offset` on: the prompts
    of a batch of `rows` are computed one by one, unpadded, into one left-padded cache."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length, self.target = capacity, 0, None

    def allocate(self, rows: int, like: torch.Tensor, value_like: torch.Tensor) -> None:
        self.device, self.is_initialized = like.device, True
        self.key_buffer = like.new_zeros((rows, like.shape[1], self.capacity, like.shape[-1]))
        self.value_buffer = value_like.new_zeros((rows, value_like.shape[1], self.capacity, value_like.shape[-1]))

    def update(self, key_states, value_states, *args, **kwargs):
        n = key_states.shape[-2]
        if self.target is not None:  # one prompt of the batch, written at its row and offset
            row, offset, rows = self.target
            if not self.is_initialized:
                self.allocate(rows, key_states, value_states)
            self.key_buffer[row, :, offset : offset + n] = key_states[0]
            self.value_buffer[row, :, offset : offset + n] = value_states[0]
            return key_states, value_states
        if not self.is_initialized:
            self.allocate(key_states.shape[0], key_states, value_states)
        self.key_buffer[:, :, self.length : self.length + n] = key_states
        self.value_buffer[:, :, self.length : self.length + n] = value_states
        self.length += n
        self.keys, self.values = self.key_buffer[:, :, : self.length], self.value_buffer[:, :, : self.length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return 0 if self.target is not None else self.length

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.key_buffer = self.key_buffer.index_select(0, beam_idx)
        self.value_buffer = self.value_buffer.index_select(0, beam_idx)
        self.keys, self.values = self.key_buffer[:, :, : self.length], self.value_buffer[:, :, : self.length]


def preallocated_cache(model, capacity: int) -> DynamicCache:
    """Transformers' `DynamicCache` for the model (Gated DeltaNet layers included), its plain attention layers
    preallocated ([`_PreallocatedLayer`])."""
    cache = DynamicCache(config=model.config)
    cache.layers = [_PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _positions(attention_mask: torch.Tensor) -> torch.Tensor:
    # As `generate` numbers a left-padded prompt: its first real token is position 0.
    return (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


def _prefill(model, prompts: list[list[int]], cache: DynamicCache, pad_id: int, device):
    """The last logits, attention mask and position of every prompt, its cache filled, left-padded to the longest.

    Prompts of a batch differ in length (by a third for GSM8K answers): a padded batch computes the padding too. With
    attention layers only, each prompt is computed alone into its row of the cache (measured 20% faster on SmolLM2, and
    the same arithmetic as an unbatched `generate`); a recurrent layer's state (Gated DeltaNet) is the batch's, so
    those models take the padded batch."""
    width = max(map(len, prompts))
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for row, ids in enumerate(prompts):
        attention_mask[row, width - len(ids) :] = 1
    if not all(isinstance(layer, _PreallocatedLayer) for layer in cache.layers):
        input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=_positions(attention_mask),
                    cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float(), attention_mask, _positions(attention_mask)[:, -1]
    logits = []
    for row, ids in enumerate(prompts):
        for layer in cache.layers:
            layer.target = (row, width - len(ids), len(prompts))
        positions = torch.arange(len(ids), device=device)[None]
        out = model(input_ids=torch.tensor([ids], device=device), position_ids=positions, cache=cache, use_cache=True,
                    logits_to_keep=1)
        logits.append(out.logits[0, -1, :].float())
    for layer in cache.layers:
        layer.target, layer.length = None, width
        layer.keys, layer.values = layer.key_buffer[:, :, :width], layer.value_buffer[:, :, :width]
    return torch.stack(logits), attention_mask, attention_mask.sum(-1) - 1


def _share_prompts(cache: DynamicCache, attention_mask: torch.Tensor, k: int, capacity: int) -> bool:
    """Turn a prefilled cache of `len(attention_mask)` prompts into one of `k` rows per prompt: full-attention layers
    become [`~uturn_train.shared_prefix.SharedPrefixLayer`]s over the prompts as they are (not copied k times),
    Gated DeltaNet's states are expanded k ways. False, changing nothing, for any other layer (sliding window)."""
    attention = [isinstance(layer, _PreallocatedLayer) for layer in cache.layers]
    linear = [type(layer) is LinearAttentionLayer for layer in cache.layers]
    if not any(attention) or not all(a or b for a, b in zip(attention, linear)):
        return False
    owner = torch.arange(len(attention_mask), device=attention_mask.device).repeat_interleave(k)
    owners = Owners(owner)
    for i, layer in enumerate(cache.layers):
        if attention[i]:
            cache.layers[i] = SharedPrefixLayer(layer.keys, layer.values, attention_mask.bool(), owners, capacity)
        else:
            layer.reorder_cache(owner)
    return True


def _sample(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """One token per row from softmax(logits / temperature), by inverse CDF: one uniform draw per row (a
    multinomial draws one per vocabulary entry, 20% of a SmolLM2 step at 128 rows). Divides `logits` in place."""
    cdf = torch.softmax(logits.div_(temperature) if temperature != 1 else logits, dim=-1).cumsum_(-1)
    u = torch.rand((len(cdf), 1), device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1).squeeze(1)


class _Rows:
    """The tokens of the rows of one batch being decoded, and how each ended."""

    def __init__(self, n: int, max_new_tokens: int):
        self.tokens = [[] for _ in range(n)]
        self.end: list[int | None] = [None] * n  # the end-of-turn token that ended a row
        self.done = [False] * n
        self.max_new_tokens = max_new_tokens

    def add(self, row: int, token: int, end_ids: set[int], string_stop) -> None:
        if token in end_ids:
            self.end[row], self.done[row] = token, True
            return
        self.tokens[row].append(token)
        self.done[row] = len(self.tokens[row]) >= self.max_new_tokens or string_stop(self.tokens[row])


def _zero3_processes() -> bool:
    """Whether this is one of several processes under DeepSpeed ZeRO-3, where every forward of the trained model is a
    collective: DeepSpeed's start-of-forward hook (`reset_step`) checks its module trace across processes whenever the
    trace is incomplete, which `distributed.never_replay_zero3_trace` keeps it (GRPO), and a model generated layer by
    layer gathers each layer. Processes then run the same forwards: the same prompts per batch (the callers pad their
    shards, `distributed.map_sharded`) and the same decode steps (here)."""
    import torch.distributed as dist
    from transformers.integrations import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled() and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _any_process(flag: bool, device) -> bool:
    import torch.distributed as dist

    t = torch.tensor([float(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _decode(model, prompts: list[list[int]], k: int, temperature: float, max_new_tokens: int, end_ids: set[int],
            string_stop, pad_id: int, device) -> _Rows:
    """Decode `k` continuations of every prompt; rows `i * k ... i * k + k - 1` are prompt `i`'s. Each prompt is
    computed once; its k rows share its keys and values (`shared_prefix`) where the model's layers allow, else its cache
    is expanded k ways. A row leaves the batch once it ended (its end token, a stop string or `max_new_tokens`), the
    batch being compacted when a quarter of it has ended (compacting copies the rows' cache)."""
    cache = preallocated_cache(model, max(map(len, prompts)) + max_new_tokens)
    logits, attention_mask, position = _prefill(model, prompts, cache, pad_id, device)
    expand = torch.arange(len(prompts), device=device).repeat_interleave(k)

    def steps(forward_kwargs: dict) -> _Rows:
        return _steps(model, cache, logits[expand], attention_mask[expand], position[expand], temperature,
                      max_new_tokens, end_ids, string_stop, device, forward_kwargs)

    if k > 1:
        with shared_attention(model) as switched:
            if switched and _share_prompts(cache, attention_mask, k, max_new_tokens):
                rows = steps({"uturn_cache": cache})
                check_attended(cache)
                return rows
        cache.reorder_cache(expand)
    return steps({})


def _steps(model, cache, logits, attention_mask, position, temperature, max_new_tokens, end_ids, string_stop, device,
           forward_kwargs: dict) -> _Rows:
    """The decode steps from the prefill's (expanded) logits until every row has ended."""
    rows = _Rows(len(logits), max_new_tokens)
    live = list(range(len(logits)))  # the batch's row of each cache row
    lockstep = _zero3_processes()
    while True:
        chosen = _sample(logits, temperature) if temperature > 0 else logits.argmax(-1)
        for row, token in zip(live, chosen.tolist()):
            if not rows.done[row]:
                rows.add(row, token, end_ids, string_stop)
        keep = [i for i, row in enumerate(live) if not rows.done[row]]
        if not _any_process(bool(keep), device) if lockstep else not keep:
            return rows
        # Under ZeRO-3 a process whose rows have all ended steps on with them (their tokens ignored) while another's
        # decode: every forward is a collective there.
        if keep and len(keep) <= 0.75 * len(live):
            index = torch.tensor(keep, device=device)
            cache.reorder_cache(index)
            attention_mask, position, chosen = attention_mask[index], position[index], chosen[index]
            live = [live[i] for i in keep]
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(live), 1))], dim=1)
        position = position + 1
        out = model(input_ids=chosen[:, None], attention_mask=attention_mask, position_ids=position[:, None],
                    cache=cache, use_cache=True, logits_to_keep=1, **forward_kwargs)
        logits = out.logits[:, -1, :].float()


def generate(
    model,
    tokenizer,
    prompts: list[str] | list[list[int]],
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
        prompts (`list[str]` or `list[list[int]]`): full prompt texts (e.g. from
            [`~uturn_train.chat.user_turn_prompt`]), tokenized without special tokens since a chat template already
            holds BOS; or their token ids (a multi-turn rollout that must train on exactly the ids it sampled from).
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
    # is exact and free. Other strings (`"\nUser:"`) may span or split tokens: a row's last tokens are decoded, enough
    # of them to hold the longest (a token is at least one character).
    added = tokenizer.get_added_vocab()
    end_ids = {added[s] for s in stops if s in added} | {pad_id}
    if tokenizer.eos_token_id is not None:
        end_ids.add(tokenizer.eos_token_id)
    string_stops = [s for s in stops if s not in added]
    tail = max(map(len, string_stops), default=0) + 1

    def string_stop(tokens: list[int]) -> bool:
        if not string_stops:
            return False
        text = tokenizer.decode(tokens[-tail:], skip_special_tokens=True)
        return any(s in text for s in string_stops)

    encoded = [list(p) for p in prompts] if not isinstance(prompts[0], str) else \
        tokenizer(prompts, add_special_tokens=False)["input_ids"]
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
        # no_grad, not inference_mode: under ZeRO-3 a parameter first gathered here stays gathered (persistent small
        # parameters), and an inference tensor later saved for backward fails the next training step.
        with torch.random.fork_rng(devices=devices, device_type=device.type), torch.no_grad():
            torch.manual_seed(seed)
            batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
            for batch in tqdm(batches, desc=desc, disable=disable_progress, unit="batch"):
                rows = _decode(model, [encoded[i] for i in batch], k, temperature, max_new_tokens, end_ids,
                               string_stop, pad_id, device)
                for row, i in enumerate(batch):
                    for j in range(row * k, (row + 1) * k):  # a prompt's k continuations are contiguous
                        ids = rows.tokens[j] + ([] if rows.end[j] is None else [rows.end[j]])
                        results[i].append(finish(tokenizer, ids, end_ids, stops, len(encoded[i])))
    finally:
        model.train(was_training)
    return results

"""Attention for k sampled continuations of one prompt: the prompt's keys and values kept once, not k times.

The engine (`generation._decode`) samples k continuations of each prompt. Expanding the prompt's cache k ways, as
`generate(num_return_sequences=k)` does, copies the prompt k times (and again at every compaction, when ended rows
leave the batch) and reads it k times per decode step: on SmolLM2-135M, 32 prompts x 4, that was 4.7 s of copies and
12 s of attention in a 40 s phase (`tests/benchmarks/bench_probe.py`). Here a full-attention layer keeps the prompts'
keys and values once ([prompts, heads, width, dim], left-padded) and the rows' own tokens apart; attention is computed
over the two parts, each as one batched matmul, and merged by their log-sum-exp (cascade attention; Hydragen, arXiv
2402.05099). It differs from sdpa in the last bits, so greedy decoding, which must equal `generate` token for token,
keeps sdpa; sampling only has to be reproducible.

Transformers picks a layer's attention function by `config._attn_implementation` (`AttentionInterface`): the engine
switches the model to `NAME` while it decodes shared rows ([`shared_attention`]) and passes the cache to the function
as a forward keyword (`uturn_cache`), which transformers hands on to the attention interface.
"""

import contextlib
import weakref

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface

NAME = "uturn_shared_prefix"


class Owners:
    """Which prompt each row continues (`owner`, non-decreasing: a prompt's rows are contiguous), each row's slot among
    its prompt's rows, and which of the previous prompts are `kept`. Every layer of a cache holds the same object; a
    compaction computes the next one once, for all layers (each would otherwise sync a GPU for it)."""

    def __init__(self, owner: torch.Tensor, kept: torch.Tensor | None = None):
        self.owner, self.kept, self._next = owner, kept, None
        starts = torch.searchsorted(owner, owner)  # the first row of each row's prompt
        self.slot = torch.arange(len(owner), device=owner.device) - starts
        self.slots = int(self.slot.max()) + 1

    def keep(self, rows: torch.Tensor) -> "Owners":
        if self._next is None or self._next[0] is not rows:
            kept, owner = torch.unique_consecutive(self.owner[rows], return_inverse=True)
            self._next = (rows, Owners(owner, kept))
        return self._next[1]


class SharedPrefixLayer(DynamicLayer):
    """A full-attention layer's cache for rows that continue shared prompts.

    Args:
        keys, values (`torch.Tensor`): the prompts' keys and values, [prompts, kv_heads, width, dim], left-padded.
        mask (`torch.Tensor`): [prompts, width], False on padding.
        owners ([`Owners`]): the prompt of each row.
        capacity (`int`): tokens a row may add.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, owners: Owners, capacity: int):
        super().__init__()
        # Keys transposed once ([prompts, kv_heads, dim, width]): a batched matmul with the transposed view ran at half
        # the rate on a CPU (513 against 256 us for 32 prompts x 4 of 350 tokens). Values copied out of the prefill's
        # buffer, which was as wide as prompt and turn.
        self.prefix_keys_t, self.prefix_values = keys.transpose(-1, -2).contiguous(), values.contiguous()
        self.prefix_bias = torch.zeros(mask.shape, device=mask.device).masked_fill_(~mask, float("-inf"))[:, None, None]
        self.device, self.is_initialized, self.length, self.attended = keys.device, True, 0, 0
        shape = (len(owners.owner), keys.shape[1], capacity, keys.shape[-1])
        self.key_buffer, self.value_buffer = keys.new_zeros(shape), values.new_zeros(shape)
        self._set_rows(owners)

    def _set_rows(self, owners: Owners) -> None:
        self.owners, n = owners, len(owners.owner)
        self.keys, self.values = self.key_buffer[:n, :, : self.length], self.value_buffer[:n, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        n, end = len(self.owners.owner), self.length + key_states.shape[-2]
        self.key_buffer[:n, :, self.length : end] = key_states
        self.value_buffer[:n, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[:n, :, :end], self.value_buffer[:n, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.prefix_keys_t.shape[-1] + self.length

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep rows `beam_idx` (in order): the rows' own tokens are copied; a prompt left without rows is dropped (the
        others' keys and values are copied then, once, rather than attended to at every step)."""
        n, end = len(beam_idx), self.length
        self.key_buffer[:n, :, :end] = self.key_buffer[beam_idx, :, :end]
        self.value_buffer[:n, :, :end] = self.value_buffer[beam_idx, :, :end]
        owners = self.owners.keep(beam_idx)
        if len(owners.kept) < len(self.prefix_keys_t):
            self.prefix_keys_t, self.prefix_values = self.prefix_keys_t[owners.kept], self.prefix_values[owners.kept]
            self.prefix_bias = self.prefix_bias[owners.kept]
        self._set_rows(owners)


def shared_prefix_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, uturn_cache=None,
                            **kwargs):
    """`AttentionInterface` function: one decode step's attention of every row over its prompt and its own tokens.
    `key`/`value` are the rows' own tokens (the layer's `update`); the prompts come from the layer in `uturn_cache`."""
    layer = uturn_cache.layers[module.layer_idx] if uturn_cache is not None else None
    if not isinstance(layer, SharedPrefixLayer) or query.shape[2] != 1 or dropout:
        raise ValueError(f"{NAME} attention decodes one token per row over a SharedPrefixLayer cache, passed as "
                         "`uturn_cache`; use the engine's generate (uturn_train.generation)")
    unsupported = [name for name in ("softcap", "s_aux", "sliding_window") if kwargs.get(name) is not None]
    if unsupported:
        raise ValueError(f"{NAME} attention computes plain softmax attention; this layer asks for {unsupported}")
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads  # query head h reads key head h // groups (as `repeat_kv`)
    scale = dim**-0.5 if scaling is None else scaling
    owners, q, dtype = layer.owners, query.reshape(rows, kv_heads, groups, dim), value.dtype
    # Softmax statistics in fp32, matmuls in the model's dtype (as transformers' eager attention); no-ops in fp32.

    # The prompt part: each prompt's rows' queries together, [prompts, kv_heads, slots * groups, dim].
    prompts = len(layer.prefix_keys_t)
    grouped = q.new_zeros((prompts, owners.slots, kv_heads, groups, dim))
    grouped[owners.owner, owners.slot] = q
    grouped = grouped.permute(0, 2, 1, 3, 4).reshape(prompts, kv_heads, owners.slots * groups, dim)
    scores = torch.matmul(grouped, layer.prefix_keys_t).float().mul_(scale).add_(layer.prefix_bias)
    prompt_max = scores.amax(-1, keepdim=True)
    weights = scores.sub_(prompt_max).exp_()
    prompt_sum = weights.sum(-1, keepdim=True)
    prompt_out = torch.matmul(weights.to(dtype), layer.prefix_values).float()
    prompt_out = torch.cat([prompt_out, prompt_max, prompt_sum], dim=-1)
    prompt_out = prompt_out.view(prompts, kv_heads, owners.slots, groups, dim + 2).permute(0, 2, 1, 3, 4)
    prompt_out = prompt_out[owners.owner, owners.slot]  # back to rows: [rows, kv_heads, groups, dim + 2]
    prompt_out, prompt_max, prompt_sum = prompt_out.split([dim, 1, 1], dim=-1)

    # The rows' own tokens (all attended: they follow the prompt), then both parts merged.
    scores = torch.matmul(q, key.transpose(-1, -2)).float().mul_(scale)
    top = torch.maximum(scores.amax(-1, keepdim=True), prompt_max)
    weights = scores.sub_(top).exp_()
    carry = (prompt_max - top).exp_()
    out = torch.matmul(weights.to(dtype), value).float().addcmul_(prompt_out, carry)
    out = out.div_(weights.sum(-1, keepdim=True).addcmul_(prompt_sum, carry)).to(dtype)
    layer.attended = layer.length
    return out.reshape(rows, heads, 1, dim).transpose(1, 2), None  # [rows, 1, heads, dim], as sdpa returns


def check_attended(cache) -> None:
    """Raise if a shared layer's last tokens were not read by [`shared_prefix_attention`] (a model whose attention
    bypasses `AttentionInterface` would have attended to the rows' own tokens only)."""
    for layer in cache.layers:
        if isinstance(layer, SharedPrefixLayer) and layer.attended != layer.length:
            raise RuntimeError(f"the model's attention did not read the shared prompt ({NAME} was not called): its "
                               "attention does not go through transformers' AttentionInterface")


AttentionInterface.register(NAME, shared_prefix_attention)
# The function masks the prompts' padding itself; transformers builds no mask for it.
AttentionMaskInterface.register(NAME, lambda *args, **kwargs: None)

_CANNOT_SWITCH = weakref.WeakSet()  # models that refused: not asked again (transformers warns at every refusal)


def _configs(model) -> list:
    """Every config whose attention implementation `set_attn_implementation` may set: the model's, its sub-configs'
    and its sub-models'."""
    found, queue = {}, [model.config] + [m.config for m in model.modules() if hasattr(m, "config")]
    while queue:
        config = queue.pop()
        if id(config) in found or not hasattr(config, "_attn_implementation_internal"):
            continue
        found[id(config)] = config
        queue += [getattr(config, key) for key in getattr(config, "sub_configs", {}) if getattr(config, key, None)]
    return list(found.values())


@contextlib.contextmanager
def shared_attention(model):
    """Decode with [`shared_prefix_attention`] inside the block; yields False (and changes nothing) for a model whose
    attention implementation cannot be set (one not written on `AttentionInterface`). Every config's implementation is
    put back as it was, whatever happens inside."""
    config = model.config.get_text_config(decoder=True)
    before = [(c, c._attn_implementation_internal) for c in _configs(model)]
    switched = False
    try:
        if model not in _CANNOT_SWITCH:
            with contextlib.suppress(ValueError, AttributeError):
                model.set_attn_implementation(NAME)
            switched = config._attn_implementation == NAME
            if not switched:
                _CANNOT_SWITCH.add(model)
        yield switched
    finally:
        for c, implementation in before:
            c._attn_implementation_internal = implementation

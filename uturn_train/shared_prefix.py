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

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface

NAME = "uturn_shared_prefix"


class SharedPrefixLayer(DynamicLayer):
    """A full-attention layer's cache for rows that continue shared prompts.

    Args:
        keys, values (`torch.Tensor`): the prompts' keys and values, [prompts, kv_heads, width, dim], left-padded.
        mask (`torch.Tensor`): [prompts, width], False on padding.
        owner (`torch.Tensor`): the prompt of each row, non-decreasing (a prompt's rows are contiguous).
        capacity (`int`): tokens a row may add.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, owner: torch.Tensor,
                 capacity: int):
        super().__init__()
        # Keys transposed once ([prompts, kv_heads, dim, width]): a batched matmul with the transposed view ran at half
        # the rate on a CPU (513 against 256 us for 32 prompts x 4 of 350 tokens).
        self.prefix_keys_t, self.prefix_values, self.prefix_mask = keys.transpose(-1, -2).contiguous(), values, mask
        self.device, self.is_initialized, self.length = keys.device, True, 0
        shape = (len(owner), keys.shape[1], capacity, keys.shape[-1])
        self.key_buffer, self.value_buffer = keys.new_zeros(shape), values.new_zeros(shape)
        self._set_rows(owner)

    def _set_rows(self, owner: torch.Tensor) -> None:
        # Each row's slot among its prompt's rows: the prompt part is computed on [prompts, slots] queries.
        self.owner, n = owner, len(owner)
        starts = torch.searchsorted(owner, owner)  # the first row of each row's prompt
        self.slot = torch.arange(n, device=owner.device) - starts
        self.slots = int(self.slot.max()) + 1
        self.keys = self.key_buffer[:n, :, : self.length]
        self.values = self.value_buffer[:n, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        n, end = len(self.owner), self.length + key_states.shape[-2]
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
        prompts, owner = torch.unique_consecutive(self.owner[beam_idx], return_inverse=True)
        if len(prompts) < len(self.prefix_keys_t):
            self.prefix_keys_t, self.prefix_values = self.prefix_keys_t[prompts], self.prefix_values[prompts]
            self.prefix_mask = self.prefix_mask[prompts]
        self._set_rows(owner)


def shared_prefix_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, uturn_cache=None,
                            **kwargs):
    """`AttentionInterface` function: one decode step's attention of every row over its prompt and its own tokens.
    `key`/`value` are the rows' own tokens (the layer's `update`); the prompts come from the layer in `uturn_cache`."""
    layer = uturn_cache.layers[module.layer_idx] if uturn_cache is not None else None
    if not isinstance(layer, SharedPrefixLayer) or query.shape[2] != 1 or dropout:
        raise ValueError(f"{NAME} attention decodes one token per row over a SharedPrefixLayer cache, passed as "
                         "`uturn_cache`; use the engine's generate (uturn_train.generation)")
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads  # query head h reads key head h // groups (as `repeat_kv`)
    scale = dim**-0.5 if scaling is None else scaling
    q, dtype = query.reshape(rows, kv_heads, groups, dim), value.dtype
    # Softmax statistics in fp32, matmuls in the model's dtype (as transformers' eager attention); no-ops in fp32.

    # The prompt part: each prompt's rows' queries together, [prompts, kv_heads, slots * groups, dim].
    prompts = len(layer.prefix_keys_t)
    grouped = q.new_zeros((prompts, layer.slots, kv_heads, groups, dim))
    grouped[layer.owner, layer.slot] = q
    grouped = grouped.permute(0, 2, 1, 3, 4).reshape(prompts, kv_heads, layer.slots * groups, dim)
    scores = torch.matmul(grouped, layer.prefix_keys_t).float().mul_(scale)
    scores.masked_fill_(~layer.prefix_mask[:, None, None, :], float("-inf"))
    prompt_max = scores.amax(-1, keepdim=True)
    weights = scores.sub_(prompt_max).exp_()
    prompt_sum = weights.sum(-1, keepdim=True)
    prompt_out = torch.matmul(weights.to(dtype), layer.prefix_values).float()
    prompt_out = torch.cat([prompt_out, prompt_max, prompt_sum], dim=-1)
    prompt_out = prompt_out.view(prompts, kv_heads, layer.slots, groups, dim + 2).permute(0, 2, 1, 3, 4)
    prompt_out = prompt_out[layer.owner, layer.slot]  # back to rows: [rows, kv_heads, groups, dim + 2]
    prompt_out, prompt_max, prompt_sum = prompt_out.split([dim, 1, 1], dim=-1)

    # The rows' own tokens (all attended: they follow the prompt), then both parts merged.
    scores = torch.matmul(q, key.transpose(-1, -2)).float().mul_(scale)
    top = torch.maximum(scores.amax(-1, keepdim=True), prompt_max)
    weights = scores.sub_(top).exp_()
    carry = (prompt_max - top).exp_()
    out = torch.matmul(weights.to(dtype), value).float().addcmul_(prompt_out, carry)
    out = out.div_(weights.sum(-1, keepdim=True).addcmul_(prompt_sum, carry)).to(dtype)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2), None  # [rows, 1, heads, dim], as sdpa returns


AttentionInterface.register(NAME, shared_prefix_attention)
# The function masks the prompts' padding itself; transformers builds no mask for it.
AttentionMaskInterface.register(NAME, lambda *args, **kwargs: None)


@contextlib.contextmanager
def shared_attention(model):
    """Decode with [`shared_prefix_attention`] inside the block; yields False (and changes nothing) for a model whose
    attention implementation cannot be set (one not written on `AttentionInterface`)."""
    config = model.config.get_text_config(decoder=True)
    before = config._attn_implementation
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError):
        pass
    switched = config._attn_implementation == NAME
    try:
        yield switched
    finally:
        if switched:
            model.set_attn_implementation(before)

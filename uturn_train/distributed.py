"""Work split across the processes of `accelerate launch` and gathered back in order on every rank; ZeRO-3's gathers."""

from collections.abc import Callable
from contextlib import nullcontext


def map_sharded(items: list, fn: Callable[[list, int], list], state=None) -> list:
    """`fn(shard, rank)` on each process's share of `items`; every rank returns all results, in the order of `items`.

    `fn` returns one result per item of its shard. Shards are padded to equal size (the last item repeated), so that a
    collective inside `fn` (generation under ZeRO-3 gathers parameters) never waits on a rank with less work; the
    padding's results are dropped. `rank` lets `fn` seed its sampling per process, so shards are independent draws.

    Args:
        items (`list`): the work.
        fn (`Callable[[list, int], list]`): the work on one shard.
        state (`accelerate.PartialState`, *optional*): the processes; every one of them must call this. None or a
            single process: `fn(items, 0)`.
    """
    if state is None or state.num_processes == 1:
        return fn(items, 0)
    from accelerate.utils import gather_object

    with state.split_between_processes(list(enumerate(items)), apply_padding=True) as shard:
        results = fn([item for _, item in shard], state.process_index)
        gathered = gather_object([(i, result) for (i, _), result in zip(shard, results)])
    by_index = {}
    for i, result in gathered:
        by_index.setdefault(i, result)  # the first copy; padding repeats an item already done
    return [by_index[i] for i in range(len(items))]


def gathered_if_zero3(model):
    """Gather ZeRO-3 partitioned parameters for generation before a trainer wraps the model (mining, RL answers).

    Before the trainer wraps it, a model loaded under ZeRO-3 (`zero3_init_flag`) holds partitions without the engine's
    hooks: gather them once for the whole generation, as TRL's `unwrap_model_for_generation` does. A collective: every
    rank gets here. Elsewhere a no-op.
    """
    from transformers.integrations import is_deepspeed_zero3_enabled

    if not is_deepspeed_zero3_enabled():
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()))


def register_conv_weights(model) -> int:
    """Under ZeRO-3, make each Gated DeltaNet gather its convolution's weights when it runs; returns how many.

    Qwen3.5's Gated DeltaNet hands `self.conv1d.weight` straight to `causal_conv1d_fn` / `causal_conv1d_update`, so
    the `conv1d` submodule's own ZeRO-3 hook never fires (transformers' `force_accelerate_hooks("conv1d")` fires
    accelerate's hooks only) and, unless ZeRO-3 happens to keep it whole, the weight is read as its empty partition:
    "Dimension out of range" in `squeeze(1)` when the probe generates layer by layer (`probe_ds3_gather` false) before
    any training step. `deepspeed.zero.register_external_parameter` is DeepSpeed's way to say that a module uses
    another's parameter. Elsewhere a no-op.
    """
    import torch
    from transformers.integrations import is_deepspeed_zero3_enabled

    if not is_deepspeed_zero3_enabled():
        return 0
    import deepspeed

    count = 0
    for module in model.modules():
        conv = getattr(module, "conv1d", None)
        if isinstance(conv, torch.nn.Conv1d) and any(hasattr(p, "ds_id") for p in conv.parameters()):
            for param in conv.parameters(recurse=False):
                deepspeed.zero.register_external_parameter(module, param)
                count += 1
    return count

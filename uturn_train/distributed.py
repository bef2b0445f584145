"""Work split across the processes of `accelerate launch`, and gathered back in order on every rank."""

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

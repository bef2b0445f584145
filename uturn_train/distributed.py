"""Work split across the processes of `accelerate launch` and gathered back in order on every rank; ZeRO-3's gathers."""

import logging
from collections.abc import Callable
from contextlib import contextmanager, nullcontext

logger = logging.getLogger(__name__)


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


@contextmanager
def outside_zero3():
    """Models built here are whole on every process, never ZeRO-3 partitions: those built or converted for the cache
    (`zoo.resolve`) and the trained judge's fixed feature model (`probe.labelers.judge.load_judge`).

    A recipe's `TrainingArguments` with a ZeRO-3 config switch transformers' model construction to
    `deepspeed.zero.Init`, a collective. `resolve` builds on the main process only (`main_process_first`) while the
    others wait at a barrier: a first SmolLM2 conversion under ZeRO-3 waited for ever. And the judge's model, built
    partitioned, failed its first forward ("Padding_idx must be within num_embeddings"). The switch is transformers'
    global (`set_hf_deepspeed_config`); it is put back on exit."""
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref  # the only handle on the config object (transformers 5.x)
    config = ref() if ref is not None else None
    if config is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(config)


def gathered_if_zero3(model, whole: bool = True):
    """Gather ZeRO-3 partitioned parameters for generation before a trainer wraps the model (mining, RL answers).

    Before the trainer wraps it, a model loaded under ZeRO-3 (`zero3_init_flag`) holds partitions without the engine's
    hooks. `whole`: gather them once for the whole generation, as TRL's `unwrap_model_for_generation` does (the whole
    model on every rank). Otherwise each decoder layer (the model's `_no_split_modules`) and each other module with
    weights of its own gathers them for its forward only and releases them after, as TRL's
    `ds3_gather_for_generation=False` generates through the engine: one layer at a time beside the partition, every
    forward gathering again. A collective: every rank gets here and runs the same forwards (`generate` syncs ranks
    under ZeRO-3, `map_sharded` pads shards). Elsewhere a no-op.
    """
    from transformers.integrations import is_deepspeed_zero3_enabled

    if not is_deepspeed_zero3_enabled():
        return nullcontext()
    import deepspeed

    if whole:
        return deepspeed.zero.GatheredParameters(list(model.parameters()))
    return _gathered_per_layer(model, deepspeed.zero.GatheredParameters)


@contextmanager
def _gathered_per_layer(model, gathered):
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (`_no_split_modules`), so it cannot be "
                         "gathered layer by layer under ZeRO-3: set --ds3_gather_for_generation true")
    # A layer gathers all its weights, its submodules' included: Qwen3.5's Gated DeltaNet reads `conv1d.weight` without
    # calling `conv1d` (see `register_conv_weights`). Any other module gathers its own (embeddings, norm, head).
    inside = {id(p) for layer in layers for p in layer.parameters()}
    units = [(layer, list(layer.parameters())) for layer in layers]
    units += [(m, own) for m in model.modules() if (own := [p for p in m.parameters(recurse=False)
                                                              if id(p) not in inside])]
    handles, open_ = [], {}

    def enter(module, params):
        open_[id(module)] = gathered(params)
        open_[id(module)].__enter__()

    for module, params in units:
        handles.append(module.register_forward_pre_hook(lambda m, args, params=params: enter(m, params)))
        handles.append(module.register_forward_hook(lambda m, args, out: open_.pop(id(m)).__exit__(None, None, None)))
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()
        for ctx in open_.values():  # a forward that raised: give its gathered weights back
            ctx.__exit__(None, None, None)


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


def keep_non_reentrant_checkpointing(trainer, requested: dict | None) -> None:
    """Under PEFT + ZeRO-3, undo TRL's switch to reentrant gradient checkpointing.

    TRL's trainers set `use_reentrant=True` whenever PEFT meets ZeRO-3 (huggingface/trl#2514: a non-reentrant
    recompute read frozen weights as empty partitions), until DeepSpeed fixed that (deepspeedai/DeepSpeed#8148, in
    0.19.8). Reentrant, DeepSpeed attributes every frozen weight it gathers to recompute a layer to the layer itself,
    whose post-backward hook never fires, so they stay gathered until the backward ends: all the base weights on every
    rank (the 2B DPO smoke under two ZeRO-3 processes: 3.4 GiB more per rank, killed). Transformers 5 reads
    `activation_checkpointing_kwargs`, so TRL's value reaches the model only when checkpointing is switched back on
    (after DPO's reference forward or the probe's generation). `requested` is the `gradient_checkpointing_kwargs` the
    user gave, read before the trainer was built: an explicit `use_reentrant` stays, and so does TRL's choice where
    DeepSpeed lacks the fix.
    """
    args = trainer.args
    forced = (args.gradient_checkpointing_kwargs or {}).get("use_reentrant") is True  # by TRL, for PEFT
    if not (forced and args.gradient_checkpointing and (requested or {}).get("use_reentrant") is None
            and trainer.is_deepspeed_enabled and trainer.accelerator.state.deepspeed_plugin.zero_stage == 3):
        return
    from deepspeed.runtime.zero import partitioned_param_coordinator

    if hasattr(partitioned_param_coordinator, "update_recompute_parameters"):  # DeepSpeed with #8148
        args.gradient_checkpointing_kwargs["use_reentrant"] = False


def never_replay_zero3_trace(trainer) -> None:
    """Under ZeRO-3, drop DeepSpeed's module trace as soon as it is complete, so that it is never replayed (GRPO).

    DeepSpeed records the order in which modules fetch their weights, then replays it to prefetch and to decide what to
    release. Under collab GRPO (LoRA, non-reentrant gradient checkpointing, generation before every step), DeepSpeed
    0.19.8 keeps every decoder layer's weights gathered through the backward of every second step:
    `tests/helpers/zero3_gathered.py` on the tiny model finds all of them held at backwards 2 and 4, none at 1 and 3,
    and none at all when no trace is ever replayed (neither the reuse distance nor prefetching is the cause: both set
    to 0, they stay held). Without replay every step releases each layer after its backward, at the cost of
    DeepSpeed's prefetching. SFT and DPO hold none (checked the same way): not needed there. Elsewhere a no-op.
    """
    from transformers import TrainerCallback
    from transformers.integrations import is_deepspeed_zero3_enabled

    if not is_deepspeed_zero3_enabled():
        return

    class NeverReplay(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):  # the DeepSpeed engine exists from here
            coordinator = trainer.model_wrapped.optimizer.parameter_offload.get_param_coordinator()
            if not hasattr(coordinator, "_invalidate_trace"):  # a private name, which a later DeepSpeed may rename
                logger.warning("this DeepSpeed has no `_invalidate_trace`: its trace replay may hold layer weights")
                return
            reset_step = coordinator.reset_step

            def reset_without_replay():  # DeepSpeed calls it at the start of every forward and after every backward
                reset_step()
                if coordinator.is_complete_trace():
                    coordinator._invalidate_trace()

            coordinator.reset_step = reset_without_replay

    trainer.add_callback(NeverReplay())

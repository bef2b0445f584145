"""`UserTurnProbeCallback`: the user-turn probe at step 0 and at every checkpoint, next to task accuracy.

    trainer = DPOTrainer(..., callbacks=[UserTurnProbeCallback(probe_args, tokenizer)])

Every rank takes part (generation under ZeRO-3 is a collective); only the main process writes and logs.
"""

import inspect
import json
import logging
import random
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import Trainer, TrainerCallback

from .io import write_jsonl
from .probe.classify import LABELS

logger = logging.getLogger(__name__)


@dataclass
class ProbeArguments:
    """Probe settings; every field starts with `probe_` so TrlParser can combine them with TRL's configs.

    Args:
        probe_task (`str`, *optional*, defaults to `"gsm8k"`): gsm8k, ifeval, ifbench, mtbench, oasst or testbed.
        probe_data (`str`, *optional*): local jsonl path or hub data set name; defaults to the task's hub data set.
        probe_limit (`int`, *optional*, defaults to `64`): prompts per probe; each costs one answer plus
            `1 + probe_samples` user turns per sampled temperature, so this sets the probe's share of wall time.
        probe_temperatures (`list[float]`, *optional*, defaults to `[0.0, 1.0]`): 0 = greedy.
    """

    probe_task: str = field(default="gsm8k", metadata={"help": "Probe task: gsm8k, ifeval, ifbench, mtbench, oasst, testbed."})
    probe_data: str | None = field(default=None, metadata={"help": "Probe data: local jsonl or hub name."})
    probe_limit: int | None = field(default=64, metadata={"help": "Prompts per probe."})
    probe_setting: str = field(default="self", metadata={"help": "self (model answers first) or heldout."})
    probe_temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0], metadata={"help": "0 = greedy."})
    probe_samples: int = field(default=4, metadata={"help": "User turns per prompt at each temperature > 0."})
    probe_max_new_tokens: int = field(default=256, metadata={"help": "Token limit of a user turn."})
    probe_answer_max_new_tokens: int = field(default=512, metadata={"help": "Token limit of an answer."})
    probe_batch_size: int = field(default=16, metadata={"help": "Prompts per generate call."})
    probe_enable_thinking: bool = field(default=False, metadata={"help": "Render prompts with thinking on."})
    probe_at_start: bool = field(default=True, metadata={"help": "Probe the untrained model at step 0."})
    probe_on_save: bool = field(default=True, metadata={"help": "Probe at every checkpoint save."})
    probe_on_evaluate: bool = field(default=False, metadata={"help": "Probe at every evaluation too."})
    probe_fail_on_error: bool = field(default=False, metadata={"help": "Re-raise an error inside the probe."})
    probe_seed: int = field(default=0, metadata={"help": "Sampling seed."})


def _find_trainer(callback) -> Trainer:
    # Callback events receive the model and tokenizer but not the trainer, whose `log` (so W&B and log_history see
    # the scalars), accelerator and wrapped model we need; the trainer running this event is up the call stack.
    frame = inspect.currentframe()
    while frame is not None:
        obj = frame.f_locals.get("self")
        if isinstance(obj, Trainer) and callback in obj.callback_handler.callbacks:
            return obj
        frame = frame.f_back
    raise RuntimeError("UserTurnProbeCallback must be passed to a transformers Trainer (callbacks=[...])")


class _PreservedState:
    """Everything the probe may touch that training depends on: restored on exit, errors included."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def __enter__(self):
        self.training = self.model.training
        self.padding_side = self.tokenizer.padding_side
        self.use_cache = getattr(self.model.config, "use_cache", None)
        self.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
                    torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
        return self

    def __exit__(self, *exc):
        self.model.train(self.training)
        self.tokenizer.padding_side = self.padding_side
        if self.use_cache is not None:
            self.model.config.use_cache = self.use_cache
        random.setstate(self.rng[0])
        np.random.set_state(self.rng[1])
        torch.set_rng_state(self.rng[2])
        if self.rng[3] is not None:
            torch.cuda.set_rng_state_all(self.rng[3])
        return False


class UserTurnProbeCallback(TrainerCallback):
    """Measures greedy and sampled follow-up rates (and accuracy on tasks with gold answers) while training.

    Records, at each probed step: scalars `probe/followup_rate/T<t>` (+ `ci_low`/`ci_high`), `probe/<label>_share/T<t>`,
    `<task>/accuracy`, `probe/seconds` through the trainer's logging; a W&B table of samples;
    `output_dir/probe_history.jsonl` (one record per step) and `output_dir/probe/step_<N>.jsonl` (the samples).

    Args:
        probe_args ([`ProbeArguments`]): what and how to probe. Bad data or options fail here, before training.
        tokenizer: the model's tokenizer (with its chat template).
    """

    def __init__(self, probe_args: ProbeArguments, tokenizer):
        from .probe.runner import check_setting
        from .tasks import load_task

        if not tokenizer.chat_template:
            raise ValueError("UserTurnProbeCallback: the tokenizer has no chat template; the probe needs one")
        if probe_args.probe_samples < 1 or any(t < 0 for t in probe_args.probe_temperatures):
            raise ValueError("UserTurnProbeCallback: probe_samples must be >= 1 and probe_temperatures >= 0")
        self.args, self.tokenizer = probe_args, tokenizer
        self.examples = load_task(probe_args.probe_task, data=probe_args.probe_data, limit=probe_args.probe_limit)
        check_setting(probe_args.probe_setting, self.examples, task=probe_args.probe_task)
        self.trainer = None
        self.probed_steps: set[int] = set()
        self.errors = 0
        self._table = None

    # --- events ---------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer = _find_trainer(self)
        history = Path(args.output_dir) / "probe_history.jsonl"
        if history.exists():
            # Resumed run: keep records up to the restored step; later ones belong to the abandoned tail and will be
            # probed again, so the file keeps exactly one record per probed step. Every rank reads it, so all skip
            # the same steps (the probe is a collective).
            records = [json.loads(line) for line in history.read_text().splitlines() if line.strip()]
            records = [r for r in records if r["step"] <= state.global_step]
            self.probed_steps.update(r["step"] for r in records)
            if state.is_world_process_zero:
                write_jsonl(history, records)
        if state.global_step == 0 and self.args.probe_at_start:
            self._probe(args, state)

    def on_save(self, args, state, control, **kwargs):
        if self.args.probe_on_save:
            self._probe(args, state)

    def on_evaluate(self, args, state, control, **kwargs):
        if self.args.probe_on_evaluate:
            self._probe(args, state)

    # --- the probe ----------------------------------------------------------------------------------------------
    def _probe(self, args, state):
        from trl.models import unwrap_model_for_generation

        from .probe.runner import run_probe

        step = state.global_step
        if self.trainer is None:
            self.trainer = _find_trainer(self)
        if step in self.probed_steps:
            return
        self.probed_steps.add(step)
        trainer, a = self.trainer, self.args
        start, run, error = time.perf_counter(), None, None
        model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
        was_checkpointing = getattr(model, "is_gradient_checkpointing", False)
        try:
            with _PreservedState(model, self.tokenizer), unwrap_model_for_generation(
                trainer.model_wrapped, trainer.accelerator,
                gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
            ) as unwrapped:
                run = run_probe(unwrapped, self.tokenizer, self.examples, setting=a.probe_setting,
                                temperatures=a.probe_temperatures, samples=a.probe_samples,
                                max_new_tokens=a.probe_max_new_tokens,
                                answer_max_new_tokens=a.probe_answer_max_new_tokens, batch_size=a.probe_batch_size,
                                seed=a.probe_seed, enable_thinking=a.probe_enable_thinking,
                                state=trainer.accelerator.state, disable_progress=True)
        except Exception as e:  # noqa: BLE001 - isolation is the point: training goes on unless asked otherwise
            self._restore_after_error(trainer, model, was_checkpointing, args)
            if a.probe_fail_on_error:
                raise
            self.errors += 1
            error = f"{type(e).__name__}: {e}"
            logger.error("user-turn probe failed at step %d (training continues): %s\n%s", step, error,
                         traceback.format_exc())
        seconds = time.perf_counter() - start
        self._record(args, state, run, error, seconds)

    @staticmethod
    def _restore_after_error(trainer, model, was_checkpointing, args):
        # TRL's unwrap context has no try/finally: an error inside it skips re-enabling gradient checkpointing and,
        # under ZeRO-3, re-adding the parameter hooks.
        from trl.distributed import DistributedBackend
        from trl.models.utils import add_hooks

        if was_checkpointing and not model.is_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
        if DistributedBackend(trainer.accelerator).is_zero3:
            add_hooks(trainer.model_wrapped)

    def _record(self, args, state, run, error, seconds):
        a, step = self.args, state.global_step
        logs = {"probe/seconds": seconds, "probe/errors": float(self.errors)}
        record = {"step": step, "epoch": state.epoch, "seconds": seconds, "accuracy": None, "settings": [],
                  "error": error}
        if run is not None:
            summary = run.summary
            record.update(accuracy=summary["accuracy"], settings=summary["settings"])
            if summary["accuracy"] is not None:
                logs[f"{a.probe_task}/accuracy"] = summary["accuracy"]
            for s in summary["settings"]:
                t = f"T{s['temperature']:.1f}"
                logs[f"probe/followup_rate/{t}"] = s["followup_rate"]
                logs[f"probe/followup_rate/{t}/ci_low"], logs[f"probe/followup_rate/{t}/ci_high"] = s["ci95"]
                for label in LABELS:
                    logs[f"probe/{label}_share/{t}"] = s["categories"][label]
        # The base class's log: TRL's SFT/DPO `log` overrides would flush their running training metrics into it.
        Trainer.log(self.trainer, logs)
        if not state.is_world_process_zero:
            return
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        if run is not None:
            (out / "probe").mkdir(exist_ok=True)
            write_jsonl(out / "probe" / f"step_{step}.jsonl", run.rows)
            self._log_table(args, step, run.rows)
        history = out / "probe_history.jsonl"
        with open(history, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def _log_table(self, args, step, rows):
        if "wandb" not in (args.report_to or []):
            return
        import wandb

        if wandb.run is None:
            return
        columns = ["step", "id", "temperature", "sample_index", "query", "answer", "user_turn", "label", "reason"]
        if self._table is None:
            # Incremental: each probe adds its rows instead of re-uploading the whole growing table.
            self._table = wandb.Table(columns=columns, log_mode="INCREMENTAL")
        for r in rows:
            self._table.add_data(step, *[r[c] for c in columns[1:]])
        wandb.run.log({"probe/samples": self._table, "train/global_step": step})

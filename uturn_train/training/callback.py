"""`UserTurnProbeCallback`: the user-turn probe at step 0 and at every checkpoint, next to task accuracy.

    trainer = DPOTrainer(...)
    trainer.add_callback(UserTurnProbeCallback(probe_args, tokenizer, trainer=trainer))

Every rank takes part (generation under ZeRO-3 is a collective); only the main process writes and logs.
"""

import logging
import random
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import Trainer, TrainerCallback

from ..collab.dialogue import log_scalars as collab_scalars
from ..io import write_jsonl
from ..probe.history import HISTORY, read_probe_history
from ..probe.record import log_scalars
from ..probe.settings import prefixed
from .selection import SelectionRule, keep_best, select_at_end

logger = logging.getLogger(__name__)


@dataclass
class ProbeArguments(prefixed("probe_")):
    """What the callback probes and when; the `probe_*` decoding fields are [`ProbeSettings`]'s, prefixed so that
    TrlParser can combine them with TRL's configs.

    Args:
        probe_task (`str`, *optional*, defaults to `"gsm8k"`): gsm8k, ifeval, ifbench, mtbench, oasst or testbed.
        probe_data (`str`, *optional*): local jsonl path or hub data set name; defaults to the task's hub data set.
        probe_limit (`int`, *optional*, defaults to `64`): prompts per probe; each costs one answer plus
            `1 + probe_samples` user turns per sampled temperature, so this sets the probe's share of wall time.
        select_metric (`str`, *optional*): end training with the probed checkpoint that maximises this figure (e.g.
            `grounded_followup_rate_T0`) as the final model, the choice in `selection.json`; see
            [`~uturn_train.training.selection`]. Without it, the final model is the last step's.
        select_max_accuracy_drop (`float`, *optional*): with `select_metric`, only among the checkpoints whose
            accuracy is at most this much below step 0's.
        select_min_distinct (`float`, *optional*): with `select_metric`, only among the checkpoints whose greedy
            follow-ups are at least this share of distinct texts (`distinct_followups` at T=0).
        probe_ds3_gather (`bool`, *optional*, defaults to `True`): under ZeRO-3, gather the whole model on every
            process to generate (fast; needs the whole model's memory on each device, `uturn plan`'s "generate");
            False generates through ZeRO-3's layer-by-layer gathers, as TRL's `ds3_gather_for_generation=False`.
        probe_collab (`str`, *optional*): also hold collaboration conversations with the oracle partner at every
            probe (`testbed`; `gsm8k`, the tasks `uturn collab --task gsm8k` draws from the hub's test split; or a
            collaboration jsonl with oracle lines; [`~uturn_train.collab`]), greedy, 3 turns.
        probe_collab_limit (`int`, *optional*, defaults to `32`): collaboration tasks per family at each probe.
    """

    probe_task: str = field(default="gsm8k", metadata={"help": "gsm8k, ifeval, ifbench, mtbench, oasst or testbed."})
    probe_data: str | None = field(default=None, metadata={"help": "Probe data: local jsonl or hub name."})
    probe_limit: int | None = field(default=64, metadata={"help": "Prompts per probe."})
    probe_at_start: bool = field(default=True, metadata={"help": "Probe the untrained model at step 0."})
    probe_on_save: bool = field(default=True, metadata={"help": "Probe at every checkpoint save."})
    probe_on_evaluate: bool = field(default=False, metadata={"help": "Probe at every evaluation too."})
    probe_fail_on_error: bool = field(default=False, metadata={"help": "Re-raise an error inside the probe."})
    select_metric: str | None = field(default=None, metadata={"help": "Final model: the probed checkpoint with the "
                                      "highest value of this, e.g. grounded_followup_rate_T0 (default: the last)."})
    select_max_accuracy_drop: float | None = field(default=None, metadata={"help": "With select_metric: only among "
                                                   "checkpoints at most this far below step 0's accuracy."})
    select_min_distinct: float | None = field(default=None, metadata={"help": "With select_metric: only among "
                                              "checkpoints whose greedy follow-ups are at least this share distinct."})
    probe_ds3_gather: bool = field(default=True, metadata={"help": "Under ZeRO-3, gather the whole model on every "
                                   "process to generate; False: layer by layer (less memory, slower)."})
    probe_collab: str | None = field(default=None, metadata={"help": "Also hold collaboration conversations at every "
                                     "probe: testbed, gsm8k (the hub's test split) or a jsonl with oracle lines."})
    probe_collab_limit: int = field(default=32, metadata={"help": "Collaboration tasks per family at each probe."})


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

    Records, at each probed step: scalars `probe/followup_rate/T<t>` and `probe/grounded_followup_rate/T<t>`
    (+ `ci_low`/`ci_high`), `probe/distinct_followups/T<t>` and `probe/distinct_templates/T<t>`,
    `probe/<label>_share/T<t>`, `<task>/accuracy`, `probe/seconds` through the trainer's logging; with `probe_collab`,
    `collab/success_rate/<family>` (+ `ci_low`/`ci_high`), `collab/success_rate/peer_check_wrong_start` and
    `collab/seconds`; with an LLM judge (`probe_labeler` `judge` or
    `both`) also `probe/judge_followup_rate/T<t>`, `probe/judge_grounded_followup_rate/T<t>` and
    `probe/judge_errors`; a W&B table of samples;
    `output_dir/probe_history.jsonl` (one record per step), `output_dir/probe/step_<N>.jsonl` (the samples) and
    `output_dir/collab/step_<N>.jsonl` (the conversations).

    It probes the trainer it is given, as TRL's callbacks that need their trainer take it (`LogCompletionsCallback`):

        trainer.add_callback(UserTurnProbeCallback(probe_args, tokenizer, trainer=trainer))
        # or made first, so that bad probe options fail before long work (mining), and bound once the trainer exists:
        callback = UserTurnProbeCallback(probe_args, tokenizer)
        trainer.add_callback(callback.bind(trainer))

    Args:
        probe_args ([`ProbeArguments`]): what and how to probe. Bad data or options, and a judge that does not answer,
            fail here, before training.
        tokenizer: the model's tokenizer (with its chat template).
        trainer ([`~transformers.Trainer`], *optional*): the trainer whose model is probed and whose `log` records
            the figures; given here or with [`bind`] before training starts.
    """

    def __init__(self, probe_args: ProbeArguments, tokenizer, trainer: Trainer | None = None):
        from ..probe.labelers.policy import make_judge
        from ..probe.runner import check_setting
        from ..tasks import load_task

        if not tokenizer.chat_template:
            raise ValueError("UserTurnProbeCallback: the tokenizer has no chat template; the probe needs one")
        self.args, self.tokenizer, self.settings = probe_args, tokenizer, \
            probe_args.settings().for_task(probe_args.probe_task)
        self.examples = load_task(probe_args.probe_task, data=probe_args.probe_data, limit=probe_args.probe_limit,
                                  data_option="--probe_data")
        check_setting(self.settings.setting, self.examples, task=probe_args.probe_task)
        # Every rank checks the judge (all fail alike); only the main process asks it, and broadcasts the verdicts.
        self.judge = make_judge(self.settings)
        graded = self.settings.setting == "self" and any(ex.gold is not None for ex in self.examples)
        self.rule = SelectionRule.from_args(probe_args.select_metric, probe_args.select_max_accuracy_drop,
                                            self.settings.temperatures, graded, probe_args.select_min_distinct)
        if self.rule is not None and not probe_args.probe_on_save:
            raise ValueError("--select_metric chooses among the checkpoints the probe sees: keep --probe_on_save")
        if self.rule is not None and self.rule.max_accuracy_drop is not None and not probe_args.probe_at_start:
            # Without step 0's accuracy no checkpoint could ever be eligible: the rule would silently do nothing.
            raise ValueError("--select_max_accuracy_drop measures the drop from step 0: keep --probe_at_start true")
        self.collab_tasks = None
        if probe_args.probe_collab is not None:
            from ..collab import CollabSettings, load_collab_tasks

            source = probe_args.probe_collab
            if source == "gsm8k":  # GSM8K's test problems from the hub, drawn as `uturn collab --task gsm8k` draws them
                from ..collab.gsm8k import gsm8k_collab_tasks

                source = gsm8k_collab_tasks(option="--probe_collab gsm8k")
            self.collab_tasks = load_collab_tasks(source, limit=probe_args.probe_collab_limit,
                                                  option="--probe_collab", oracle=True)
            self.collab_settings = CollabSettings(batch_size=self.settings.batch_size, seed=self.settings.seed)
        self.records: list[dict] = []  # this run's probe records, on every rank: what the rule chooses from
        self.trainer = trainer
        self.probed_steps: set[int] = set()
        self.errors = 0
        self._table = None

    def bind(self, trainer: Trainer) -> "UserTurnProbeCallback":
        """Probe `trainer` (its wrapped model, accelerator and `log`); returns the callback, to pass to
        `trainer.add_callback`."""
        self.trainer = trainer
        return self

    # --- events ---------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is None:  # transformers hands callbacks the model, not the trainer
            raise RuntimeError("UserTurnProbeCallback has no trainer: create it with `trainer=trainer`, or add it "
                               "with `trainer.add_callback(callback.bind(trainer))`")
        # A resumed run keeps the records up to the restored step; later ones belong to the abandoned tail and are
        # probed again, so the file holds exactly one record per probed step. A fresh run (step 0) starts over. Every
        # rank reads the same file, so all make the same decisions (the probe is a collective).
        resumed = state.global_step > 0
        records = [r for r in read_probe_history(args.output_dir) if resumed and r["step"] <= state.global_step]
        self.probed_steps.update(r["step"] for r in records)
        self.records = records
        if self.rule is not None and args.metric_for_best_model is not None:
            raise ValueError(f"select_metric ({self.rule.metric}) and metric_for_best_model "
                             f"({args.metric_for_best_model}) both choose the final checkpoint; keep one")
        if state.is_world_process_zero and (Path(args.output_dir) / HISTORY).exists():
            write_jsonl(Path(args.output_dir) / HISTORY, records)
        if state.global_step == 0 and self.args.probe_at_start:
            self._probe(args, state)
        elif resumed and self.args.probe_on_save and state.global_step not in self.probed_steps:
            # The restored checkpoint was saved but its probe was lost (a crash between the save and the record).
            logger.warning("probing the restored checkpoint of step %d: its probe record is missing", state.global_step)
            self._probe(args, state)

    def on_save(self, args, state, control, **kwargs):
        if self.args.probe_on_save:
            self._probe(args, state)

    def on_train_end(self, args, state, control, **kwargs):
        if self.rule is not None:  # before the recipe's `save_model`, which then saves the chosen weights
            select_at_end(self.trainer, args.output_dir, self.records, self.rule)

    def on_evaluate(self, args, state, control, **kwargs):
        if self.args.probe_on_evaluate:
            self._probe(args, state)

    # --- the probe ----------------------------------------------------------------------------------------------
    def _probe(self, args, state):
        from trl.models import unwrap_model_for_generation

        from ..distributed import register_conv_weights
        from ..probe.runner import run_probe

        step = state.global_step
        if step in self.probed_steps:
            return
        self.probed_steps.add(step)
        trainer, a = self.trainer, self.args
        start, run, collab, error = time.perf_counter(), None, None, None
        model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
        was_checkpointing = getattr(model, "is_gradient_checkpointing", False)
        if not a.probe_ds3_gather:
            register_conv_weights(model)  # generating layer by layer: see its docstring
        try:
            with _PreservedState(model, self.tokenizer), unwrap_model_for_generation(
                trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=a.probe_ds3_gather,
                gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
            ) as unwrapped:
                run = run_probe(unwrapped, self.tokenizer, self.examples, self.settings,
                                state=trainer.accelerator.state, disable_progress=True, judge=self.judge)
                if self.collab_tasks is not None:
                    collab = self._collab(unwrapped)
        except Exception as e:  # noqa: BLE001 - isolation is the point: training goes on unless asked otherwise
            self._restore_after_error(trainer, model, was_checkpointing, args, a.probe_ds3_gather)
            if a.probe_fail_on_error:
                raise
            self.errors += 1
            error = f"{type(e).__name__}: {e}"
            logger.error("user-turn probe failed at step %d (training continues): %s\n%s", step, error,
                         traceback.format_exc())
        seconds = time.perf_counter() - start
        self._record(args, state, run, error, seconds, collab)

    def _collab(self, model):
        # Every rank holds every conversation (greedy, same inputs): the same generate calls on every rank, which
        # layer-by-layer ZeRO-3 gathers need; the evaluation is small.
        from ..collab import OraclePartner, run_collab

        return run_collab(model, self.tokenizer, self.collab_tasks, OraclePartner(), self.collab_settings,
                          disable_progress=True)

    @staticmethod
    def _restore_after_error(trainer, model, was_checkpointing, args, gathered):
        # TRL's unwrap context has no try/finally: an error inside it skips re-enabling gradient checkpointing and,
        # under ZeRO-3, re-adding the parameter hooks (huggingface/trl#6659).
        from trl.distributed import DistributedBackend
        from trl.models.utils import add_hooks

        if was_checkpointing and not model.is_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
        if gathered and DistributedBackend(trainer.accelerator).is_zero3:  # layer by layer, the hooks stayed
            add_hooks(trainer.model_wrapped)

    def _record(self, args, state, run, error, seconds, collab=None):
        step = state.global_step
        logs = {"probe/seconds": seconds, "probe/errors": float(self.errors)}
        record = {"step": step, "epoch": state.epoch, "seconds": seconds, "accuracy": None, "settings": [],
                  "error": error}
        if collab is not None:
            record["collab"], record["collab_seconds"] = collab.summary, collab.seconds
            logs["collab/seconds"] = collab.seconds
            logs.update(collab_scalars(collab.summary))
        if run is not None:
            record.update(accuracy=run.summary["accuracy"], settings=run.summary["settings"])
            logs.update(log_scalars(run.summary, self.args.probe_task, self.settings.labeler))
        # The base class's log: TRL's SFT/DPO `log` overrides would flush their running training metrics into it.
        Trainer.log(self.trainer, logs)
        self.records.append(record)
        if self.rule is not None:
            keep_best(state, args.output_dir, self.records, self.rule)
        if not state.is_world_process_zero:
            return
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        if run is not None:
            (out / "probe").mkdir(exist_ok=True)
            write_jsonl(out / "probe" / f"step_{step}.jsonl", run.rows)
            self._log_table(args, step, run.rows)
        if collab is not None:
            (out / "collab").mkdir(exist_ok=True)
            write_jsonl(out / "collab" / f"step_{step}.jsonl", collab.conversations)
        # Rewritten whole and atomically: a kill while appending would leave half a line for the resumed run to read.
        write_jsonl(out / HISTORY, [*read_probe_history(out), record])

    def _log_table(self, args, step, rows):
        if "wandb" not in (args.report_to or []):
            return
        import wandb

        if wandb.run is None:
            return
        columns = ["step", "id", "temperature", "sample_index", "query", "answer", "user_turn", "label", "grounded",
                   "reason", *{"both": ["judge_label", "judge_grounded"], "judge": ["rules_label"],
                                  "trained": ["rules_label"]}.get(
                       self.settings.labeler, [])]
        if self._table is None:
            # Incremental: each probe adds its rows instead of re-uploading the whole growing table.
            self._table = wandb.Table(columns=columns, log_mode="INCREMENTAL")
        for r in rows:
            self._table.add_data(step, *[r[c] for c in columns[1:]])
        wandb.run.log({"probe/samples": self._table, "train/global_step": step})

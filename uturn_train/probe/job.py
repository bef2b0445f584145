"""The probe as a job: load data and model, probe, print a table, write results atomically.

Shared by `uturn probe` and the TRL-style `eval/probe.py` / `eval/gsm8k.py` scripts (which `accelerate launch`
shards across processes; every process returns the same gathered result and only the main one writes).
"""

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..io import ensure_writable_dir, write_json, write_jsonl
from .classify import LABELS
from .settings import ProbeSettings

logger = logging.getLogger(__name__)


@dataclass
class ProbeScriptArguments:
    """What `uturn probe` and `eval/probe.py` probe and where they write; how is [`ProbeSettings`].

    Args:
        model (`str`): hub id or local path of a chat model; `testbed` = the project's tiny Qwen3.5 (built if missing).
        task (`str`, *optional*, defaults to `"gsm8k"`): gsm8k, ifeval, ifbench, mtbench, oasst or testbed.
        data (`str`, *optional*): local jsonl file or hub data set name; defaults to the task's hub data set.
    """

    model: str = field(default="testbed", metadata={"help": "Hub id or local path; `testbed` = the tiny built-in one."})
    task: str = field(default="gsm8k", metadata={"help": "gsm8k, ifeval, ifbench, mtbench, oasst or testbed."})
    data: str | None = field(default=None, metadata={"help": "Local jsonl path or hub data set name."})
    limit: int | None = field(default=None, metadata={"help": "Probe the first N prompts only."})
    skip_bad_rows: bool = field(default=False, metadata={"help": "Skip and count rows with missing fields."})
    dtype: str = field(default="auto", metadata={"help": "auto (bf16 on GPU, fp32 on CPU), bfloat16, float32..."})
    out: str = field(default="uturn_probe", metadata={"help": "Output directory."})


def rate_with_ci(rate: float | None, ci: list[float] | None) -> str:
    return "-" if rate is None else f"{rate:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    short = {"followup": "follow", "acknowledgement": "ack", "identity_drift": "drift", "repetition": "repeat",
             "new_topic": "new", "empty": "empty", "degenerate": "degen"}
    table = Table(title=f"{result.get('model', '')} · {result.get('task', '')} · {result['setting']} · "
                        f"{result['n_prompts']} prompts")
    for col in ["T", "k", "n", "follow-up [95% CI]", "grounded [95% CI]", "distinct",
                *[short[label] for label in LABELS]]:
        table.add_column(col, justify="right")
    for s in result["settings"]:
        table.add_row(f"{s['temperature']:g}", str(s["samples"]), str(s["n"]),
                      rate_with_ci(s["followup_rate"], s["ci95"]),
                      rate_with_ci(s.get("grounded_followup_rate"), s.get("grounded_ci95")),
                      "-" if s.get("distinct_followups") is None else f"{s['distinct_followups']:.2f}",
                      *[f"{s['categories'][label]:.2f}" for label in LABELS])
    console = Console()
    if result["settings"]:
        console.print(table)
    if result["accuracy"] is not None:
        console.print(f"accuracy {result['accuracy']:.3f}  (lm-eval strict-match {result['accuracy_strict']:.3f}, "
                      f"flexible-extract {result['accuracy_flexible']:.3f})")


def distributed_state():
    """The launcher's processes as one group; on a machine without GPUs they form a gloo group (MULTI_CPU)."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def run_probe_job(args: ProbeScriptArguments, settings: ProbeSettings, state=None) -> dict:
    """Run the job; returns the `results.json` dict. Bad input fails before the model is loaded.

    `args.model` and `args.data` are paths or hub names: the entry points resolve `testbed` first.
    """
    import torch

    from ..models import load_model, load_tokenizer
    from ..tasks import load_task
    from .plot import plot_followup_vs_temperature
    from .runner import check_setting, run_probe

    is_main = state is None or state.is_main_process
    examples = load_task(args.task, data=args.data, limit=args.limit, skip_bad=args.skip_bad_rows)
    check_setting(settings.setting, examples, task=args.task)
    out = ensure_writable_dir(args.out) if is_main else Path(args.out)
    tokenizer = load_tokenizer(args.model)  # first: it fails fast and cheaply on a bad path
    device = str(state.device) if state is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model(args.model, dtype=args.dtype, device=device)
    run = run_probe(model, tokenizer, examples, settings, state=state)
    result = {"model": args.model, "task": args.task, **run.summary,
              "config": {"data": args.data, "limit": args.limit, **asdict(settings)}}
    if is_main:
        if run.summary["settings"]:
            plot_followup_vs_temperature(run.summary["settings"], run.summary["accuracy"],
                                         out / "followup_vs_temperature.png",
                                         title=f"{args.model} · {args.task} · {settings.setting}")
        write_jsonl(out / "samples.jsonl", run.rows)
        write_jsonl(out / "answers.jsonl", run.answers)
        write_json(out / "results.json", result)  # last: its presence marks a finished run
        print_table(result)
        logger.info("wrote %s", out)
    return result

"""`uturn validate`: controlled perturbations whose effect on the probe is predictable, each with its measured rate or
difference, a stated prediction and pass/fail (exit code 1 on a failure; [`~uturn_train.probe.validity.perturbations`]).

    uturn validate --model testbed --task testbed --out validate_testbed
    uturn validate --model smollm2-135m-instruct --task oasst --data ../shared/data/oasst/en_100_tree.jsonl --limit 24

The decisions are the rules' on the testbed and the trained judge's on other tasks (`--labeler auto`); the judge reads
every turn with SmolLM2-135M-Instruct, about 0.85 s a turn on a 2-core CPU (the checks without generation read the
task's every context: 32 generic questions each, and its real next turns four times).
"""

import logging
import sys
from dataclasses import asdict, dataclass, field, replace

from ..io import atomic_open, ensure_writable_dir, write_json, write_jsonl
from ..probe.settings import OFFLINE_LABELERS, ProbeSettings, labeler_for
from ..probe.validity.perturbations import ValidateSettings, load_contexts, markdown, validate
from . import MODEL_ALIASES, OUTPUT_ALIASES

logger = logging.getLogger(__name__)


@dataclass
class ValidateScriptArguments:
    """What `uturn validate` checks and where it writes; the decoding is [`ValidateSettings`].

    Args:
        model (`str`, *optional*, defaults to `"testbed"`): hub id or local path of a chat model; `testbed` = the
            project's tiny Qwen3.5.
        task (`str`, *optional*, defaults to `"testbed"`): a task with real answers and next user turns: `testbed`
            (its held-out triples) or `oasst`; gsm8k (answers, no next turns) leaves the real next turns' checks n/a.
        data (`str`, *optional*): local jsonl path or hub data set name (the testbed's is filled in).
        limit (`int`, *optional*): generate for the first N prompts only; the checks without generation use all.
        dtype (`str`, *optional*, defaults to `"auto"`): bf16 on GPU, fp32 on CPU.
        out (`str`, *optional*, defaults to `"uturn_validate"`): output folder.
        labeler (`str`, *optional*, defaults to `"auto"`): who decides labels and grounded: `rules`, `trained` (the
            trained judge) or `auto` (the rules on the testbed, the judge on other tasks).
    """

    model: str = field(default="testbed", metadata={
        "aliases": MODEL_ALIASES, "help": "Hub id or local path; `testbed` = the tiny built-in one."})
    task: str = field(default="testbed", metadata={"help": "testbed or oasst (tasks with answers and next turns)."})
    data: str | None = field(default=None, metadata={"help": "Local jsonl path or hub data set name."})
    limit: int | None = field(default=None, metadata={"help": "Generate for the first N prompts only."})
    dtype: str = field(default="auto", metadata={"help": "auto (bf16 on GPU, fp32 on CPU), bfloat16, float32..."})
    out: str = field(default="uturn_validate", metadata={
        "aliases": OUTPUT_ALIASES, "help": "Output directory."})
    labeler: str = field(default="auto", metadata={
        "help": "auto (rules on the testbed, the trained judge elsewhere), rules or trained."})

    def __post_init__(self):
        if self.labeler not in OFFLINE_LABELERS:
            raise ValueError(f"labeler {self.labeler!r} is not one of {OFFLINE_LABELERS} (the suite decides "
                             "thousands of turns offline)")


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"uturn validate · {report['model']} · {report['task']} · {report['n_prompts']} prompts")
    for col in ("check", "prediction", "measured", "result"):
        table.add_column(col)
    style = {"pass": "green", "fail": "bold red", "n/a": "yellow"}
    for c in report["checks"]:
        table.add_row(c["name"], c["prediction"], c["measured"], f"[{style[c['status']]}]{c['status']}")
    Console().print(table)


def run_validate_job(args: ValidateScriptArguments, settings: ProbeSettings) -> dict:
    """Load, validate, write `validate.json`, `validate.md` and `samples.jsonl` atomically; returns the report.

    `args.model` and `args.data` are paths or hub names: the entry point resolves `testbed` first.
    """
    import torch

    from ..models import load_model, load_tokenizer

    if args.limit is not None and args.limit < 3:
        raise ValueError(f"--limit must be at least 3 prompts (the shuffled answers need 3), got {args.limit}")
    examples = load_contexts(args.task, args.data)
    out = ensure_writable_dir(args.out)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, dtype=args.dtype, device="cuda" if torch.cuda.is_available() else "cpu")
    judge = None
    if labeler_for(args.labeler, args.task) == "trained":
        from ..probe.labelers.judge import load_judge

        judge = load_judge(device=str(model.device))
    report, rows = validate(model, tokenizer, examples, settings, limit=args.limit, judge=judge)
    report = {"model": args.model, "task": args.task, **report,
              "config": {"data": args.data, "limit": args.limit, **asdict(replace(settings, setting="heldout"))}}
    write_jsonl(out / "samples.jsonl", rows)
    with atomic_open(out / "validate.md") as f:
        f.write(markdown(report))
    write_json(out / "validate.json", report)  # last: its presence marks a finished run
    print_table(report)
    logger.info("wrote %s", out)
    return report


def make_parser():
    from trl import TrlParser

    return TrlParser((ValidateScriptArguments, ValidateSettings), prog="uturn validate")


def main(argv: list[str]) -> None:
    from ..zoo import resolve

    args, settings = make_parser().parse_args_and_config(argv)
    resolve(args)
    if run_validate_job(args, settings.settings())["failed"]:
        sys.exit(1)

"""`uturn collab`: load tasks, model and partner, hold the conversations, print a table, write results atomically.

    uturn collab --model testbed --task testbed --limit 100 --out outputs/collab_testbed
    uturn collab --model smollm2-135m-instruct --task testbed --partner self --out outputs/collab_smollm2_self
    uturn collab --model smollm2-135m-instruct --task gsm8k --data ../shared/data/gsm8k/test.jsonl --limit 50 \
        --out outputs/collab_smollm2_gsm8k

Writes `tasks.jsonl` (`--task gsm8k`: the tasks drawn from the problems), `conversations.jsonl` (every turn, its
success and why it ended), `collab.png` (success per family with 95% intervals) and `results.json` (last: its presence
marks a finished run).
"""

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..collab.dialogue import CollabSettings, run_collab
from ..collab.gsm8k import gsm8k_collab_tasks
from ..collab.partners import ModelPartner, OraclePartner
from ..collab.plot import plot_success
from ..collab.tasks import load_collab_tasks
from ..io import ensure_writable_dir, write_json, write_jsonl
from . import MODEL_ALIASES, OUTPUT_ALIASES

logger = logging.getLogger(__name__)


@dataclass
class CollabScriptArguments:
    """What `uturn collab` runs and where it writes; how is [`CollabSettings`].

    Args:
        model (`str`): the model under test: hub id, folder, `.gguf`, `testbed` or `smollm2-135m-instruct`.
        task (`str`, *optional*, defaults to `"testbed"`): `testbed` (the built testbed's `collab.jsonl`, from its
            held-out problems), `gsm8k` (tasks drawn from GSM8K's test problems, `uturn_train/collab/gsm8k.py`) or
            `file` (your own tasks in `--data`, see `uturn_train/collab/tasks.py`).
        data (`str`, *optional*): the tasks' jsonl; filled in for `testbed`; for `gsm8k` the problems (a local file
            in GSM8K's format, or a hub name; default the hub's `openai/gsm8k` test split).
        limit (`int`, *optional*): the first N tasks of each family.
        partner (`str`, *optional*, defaults to `"oracle"`): `oracle` (the task's own lines), `self` (the model under
            test plays the partner too), or another chat model (hub id, folder...), run here or, with
            `--partner_base_url`, on an OpenAI-compatible server that serves it.
        partner_base_url (`str`, *optional*): the partner's server API root, e.g. `http://127.0.0.1:8000/v1`.
        partner_served_model (`str`, *optional*): the partner's name on that server (default: its only model).
        dtype (`str`, *optional*, defaults to `"auto"`): the models' dtype.
        out (`str`, *optional*, defaults to `"uturn_collab"`): output folder.
    """

    model: str = field(default="testbed", metadata={
        "aliases": MODEL_ALIASES, "help": "The model under test (testbed, a folder, a hub id...)."})
    task: str = field(default="testbed", metadata={"help": "testbed, gsm8k or file (your own tasks in --data)."})
    data: str | None = field(default=None, metadata={
        "help": "The tasks' jsonl (filled in for testbed); for gsm8k the problems (default: the hub's test split)."})
    limit: int | None = field(default=None, metadata={"help": "The first N tasks of each family."})
    partner: str = field(default="oracle", metadata={"help": "oracle, self, or another chat model."})
    partner_base_url: str | None = field(default=None, metadata={"help": "The partner's OpenAI-compatible server."})
    partner_served_model: str | None = field(default=None, metadata={"help": "The partner's name on that server."})
    dtype: str = field(default="auto", metadata={"help": "auto (bf16 on GPU, fp32 on CPU), bfloat16, float32..."})
    out: str = field(default="uturn_collab", metadata={
        "aliases": OUTPUT_ALIASES, "help": "Output directory."})

    def __post_init__(self):
        if self.task not in ("testbed", "gsm8k", "file"):
            raise ValueError(f"--task {self.task!r} is not one of testbed, gsm8k, file (with --data)")
        if self.task == "file" and self.data is None:
            raise ValueError("--task file needs --data TASKS.jsonl (format: uturn_train/collab/tasks.py)")
        if self.partner_base_url and self.partner in ("oracle", "self"):
            raise ValueError("--partner_base_url serves a partner model: name it with --partner (its tokenizer "
                             "renders the prompts)")


def make_partner(args: CollabScriptArguments, settings: CollabSettings, model, tokenizer):
    """The partner `args.partner` names; a model partner decodes greedily with its own token limit."""
    from ..models import load_model, load_tokenizer
    from ..server import CompletionsClient

    kwargs = {"max_new_tokens": settings.partner_max_new_tokens, "batch_size": settings.batch_size,
              "seed": settings.seed}
    if args.partner == "oracle":
        return OraclePartner()
    if args.partner == "self":
        return ModelPartner(model, tokenizer, name="self", **kwargs)
    partner_tokenizer = load_tokenizer(args.partner)
    if args.partner_base_url:
        client = CompletionsClient(args.partner_base_url, partner_tokenizer, model=args.partner_served_model).check()
        return ModelPartner(None, partner_tokenizer, client=client, name=args.partner, **kwargs)
    return ModelPartner(load_model(args.partner, dtype=args.dtype, device=model.device.type), partner_tokenizer,
                        name=args.partner, **kwargs)


def print_table(result: dict) -> None:
    """The figures at 80 columns: each rate over its 95% interval, as the probe's table."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from ..probe.tables import rate_ci

    table = Table(title=f"{Path(str(result['model'])).name} · partner {Path(result['partner']).name} · "
                        f"{result['seconds']:.0f} s", box=box.SIMPLE_HEAD, show_lines=True, show_edge=False)
    for col in ("family", "n", "errors", "success\n[95% CI]", "wrong start\n[95% CI]", "asked\nfirst\n(named)",
                "turns\n(tokens)"):
        table.add_column(col, justify="right", no_wrap=True)
    for family, s in result["families"].items():
        wrong = s.get("wrong_start")
        table.add_row(family, str(s["n"]), str(s["errors"]), rate_ci(s["success_rate"], s["ci95"]),
                      rate_ci(wrong["success_rate"], wrong["ci95"]) if wrong else "-",
                      "-" if s.get("asked_first") is None else f"{s['asked_first']:.3f}" + (
                          "" if s.get("named_first") is None else f"\n({s['named_first']:.3f})"),
                      "-" if s["turns"] is None else f"{s['turns']:.2f}\n({s['tokens']:.0f})")
    Console().print(table)


def run_collab_job(args: CollabScriptArguments, settings: CollabSettings) -> dict:
    """Run the job; returns the `results.json` dict. Bad input fails before a model is loaded. `args.model`,
    `args.partner` and `args.data` are paths or hub names: the entry point resolves `testbed` first."""
    import torch

    from ..models import load_model, load_tokenizer

    # gsm8k: drawn from the problems (a bad file fails here, before any output), kept beside the conversations.
    source = gsm8k_collab_tasks(args.data) if args.task == "gsm8k" else args.data
    tasks = load_collab_tasks(source, settings.families, args.limit, oracle=args.partner == "oracle")
    out = ensure_writable_dir(args.out)
    if args.task == "gsm8k":
        write_jsonl(out / "tasks.jsonl", source)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, dtype=args.dtype, device="cuda" if torch.cuda.is_available() else "cpu")
    partner = make_partner(args, settings, model, tokenizer)
    run = run_collab(model, tokenizer, tasks, partner, settings)
    result = {"model": args.model, "task": args.task, "partner": args.partner, "families": run.summary,
              "seconds": run.seconds, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "torch_threads": torch.get_num_threads(), "config": {**asdict(args), **asdict(settings)}}
    plot_success(run.summary, out / "collab.png", title=f"{Path(args.model).name} · partner {args.partner}")
    write_jsonl(out / "conversations.jsonl", run.conversations)
    write_json(out / "results.json", result)  # last: its presence marks a finished run
    print_table(result)
    logger.info("wrote %s", out)
    return result


def make_parser():
    from trl import TrlParser

    return TrlParser((CollabScriptArguments, CollabSettings), prog="uturn collab")


def main(argv: list[str]) -> None:
    from ..zoo import resolve

    args, settings = make_parser().parse_args_and_config(argv)
    resolve(args)
    run_collab_job(args, settings)

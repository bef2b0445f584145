"""`uturn probe`: load data and model, probe, print a table, write results atomically.

    uturn probe --model testbed --task testbed --limit 200 --temperatures 0 1.0 --samples 4 --out probe_out

[`run_probe_job`] is shared with the TRL-style `eval/probe.py` / `eval/gsm8k.py` scripts (which `accelerate launch`
shards across processes; every process returns the same gathered result and only the main one writes).
"""

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..io import ensure_writable_dir, write_json, write_jsonl
from ..probe.settings import ProbeSettings
from . import MODEL_ALIASES, OUTPUT_ALIASES

logger = logging.getLogger(__name__)


@dataclass
class ProbeScriptArguments:
    """What `uturn probe` and `eval/probe.py` probe and where they write; how is [`ProbeSettings`].

    Args:
        model (`str`): hub id or local path of a chat model; `testbed` = the project's tiny Qwen3.5 (built if missing),
            `smollm2-135m-instruct` = SmolLM2-135M-Instruct (fetched if missing), or a `.gguf` file (see `zoo.py`).
        task (`str`, *optional*, defaults to `"gsm8k"`): gsm8k, ifeval, ifbench, mtbench, oasst or testbed.
        data (`str`, *optional*): local jsonl file or hub data set name; defaults to the task's hub data set.
        backend (`str`, *optional*, defaults to `"hf"`): `hf` generates here with transformers; `server` sends the
            prompts, rendered here with `model`'s tokenizer and chat template, to an OpenAI-compatible server that
            serves the same checkpoint (`vllm serve`, SGLang, `transformers serve`); `model`'s weights are not loaded.
        base_url (`str`, *optional*): the server's API root, e.g. `http://127.0.0.1:8000/v1` (backend `server`).
        served_model (`str`, *optional*): the model's name on the server; defaults to the only one it lists.
        concurrency (`int`, *optional*, defaults to `8`): server requests in flight at once.
        server_api_key_env (`str`, *optional*): the environment variable holding the server's key, if it wants one.
    """

    model: str = field(default="testbed", metadata={
        "aliases": MODEL_ALIASES, "help": "Hub id, local path or .gguf file; `testbed` = the tiny "
                                                    "built-in one; `smollm2-135m-instruct` (fetched once)."})
    task: str = field(default="gsm8k", metadata={"help": "gsm8k, ifeval, ifbench, mtbench, oasst or testbed."})
    data: str | None = field(default=None, metadata={"help": "Local jsonl path or hub data set name."})
    limit: int | None = field(default=None, metadata={"help": "Probe the first N prompts only."})
    skip_bad_rows: bool = field(default=False, metadata={"help": "Skip and count rows with missing fields."})
    dtype: str = field(default="auto", metadata={"help": "auto (bf16 on GPU, fp32 on CPU), bfloat16, float32..."})
    out: str = field(default="uturn_probe", metadata={
        "aliases": OUTPUT_ALIASES, "help": "Output directory."})
    backend: str = field(default="hf", metadata={"help": "hf (transformers, here) or server (OpenAI-compatible)."})
    base_url: str | None = field(default=None, metadata={"help": "Server API root, e.g. http://127.0.0.1:8000/v1."})
    served_model: str | None = field(default=None, metadata={"help": "Model name on the server (default: its only)."})
    concurrency: int = field(default=8, metadata={"help": "Server requests in flight at once."})
    server_api_key_env: str | None = field(default=None,
                                           metadata={"help": "Environment variable holding the server's key."})

    def __post_init__(self):
        if self.backend not in ("hf", "server"):
            raise ValueError(f"--backend {self.backend!r} is not one of hf, server")
        if (self.backend == "server") != (self.base_url is not None):
            raise ValueError("--backend server needs --base_url (the server's API root, e.g. http://127.0.0.1:8000/v1),"
                             " and --base_url needs --backend server")
        if self.concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {self.concurrency}")


def distributed_state():
    """The launcher's processes as one group; on a machine without GPUs they form a gloo group (MULTI_CPU)."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def _key(args: ProbeScriptArguments) -> str | None:
    if args.server_api_key_env is None:
        return None
    if args.server_api_key_env not in os.environ:
        raise ValueError(f"--server_api_key_env names {args.server_api_key_env}, which is not set; export it first")
    return os.environ[args.server_api_key_env]


def run_probe_job(args: ProbeScriptArguments, settings: ProbeSettings, state=None) -> dict:
    """Run the job; returns the `results.json` dict. Bad input fails before the model is loaded.

    `args.model` and `args.data` are paths or hub names: the entry points resolve `testbed` first.
    """
    import torch

    from ..models import load_model, load_tokenizer
    from ..probe.labelers.policy import make_judge
    from ..probe.plot import plot_followup_vs_temperature
    from ..probe.runner import check_setting, run_probe
    from ..probe.tables import print_table
    from ..server import CompletionsClient
    from ..tasks import load_task

    is_main = state is None or state.is_main_process
    settings = settings.for_task(args.task)  # labeler auto: the rules on the testbed, the trained judge elsewhere
    examples = load_task(args.task, data=args.data, limit=args.limit, skip_bad=args.skip_bad_rows)
    check_setting(settings.setting, examples, task=args.task)
    out = ensure_writable_dir(args.out) if is_main else Path(args.out)
    tokenizer = load_tokenizer(args.model)  # first: it fails fast and cheaply on a bad path
    # A wrong judge or server fails here, before any generation, on every rank alike (only the main one judges).
    judge = make_judge(settings)
    if args.backend == "server":
        if state is not None and state.num_processes > 1:
            raise ValueError("--backend server runs in one process (the server batches); run it without accelerate")
        client = CompletionsClient(args.base_url, tokenizer, model=args.served_model, api_key=_key(args),
                                   concurrency=args.concurrency).check()
        run = run_probe(None, tokenizer, examples, settings, client=client, judge=judge)
    else:
        device = str(state.device) if state is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        model = load_model(args.model, dtype=args.dtype, device=device)
        run = run_probe(model, tokenizer, examples, settings, state=state, judge=judge)
    server = {"backend": args.backend, "base_url": args.base_url, "served_model": args.served_model}
    result = {"model": args.model, "task": args.task, **run.summary,
              "config": {"data": args.data, "limit": args.limit, **server, **asdict(settings)}}
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


def make_parser():
    from trl import TrlParser

    return TrlParser((ProbeScriptArguments, ProbeSettings), prog="uturn probe")


def main(argv: list[str]) -> None:
    from ..zoo import resolve

    args, settings = make_parser().parse_args_and_config(argv)
    resolve(args, settings)
    run_probe_job(args, settings)

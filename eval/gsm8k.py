"""GSM8K accuracy (greedy answers, no user turns), with lm-eval's strict-match and flexible-extract numbers.

```bash
python eval/gsm8k.py --model testbed --task testbed --limit 200 --out gsm8k_out
accelerate launch --config_file accelerate_configs/multi_gpu.yaml eval/gsm8k.py --model Qwen/Qwen3.5-2B --out gsm8k_qwen
python eval/gsm8k.py --model ./my-ckpt --data ../shared/data/gsm8k/test.jsonl --limit 100
```
Writes `OUT/results.json` (accuracy, accuracy_strict, accuracy_flexible) and `OUT/answers.jsonl`.
"""

import argparse
from dataclasses import dataclass, field

from uturn_train.probe.job import ProbeScriptArguments


@dataclass
class Gsm8kScriptArguments(ProbeScriptArguments):
    """`ProbeScriptArguments` with no user turns: only the greedy answers are generated and graded."""

    temperatures: list[float] = field(default_factory=list, metadata={"help": "Leave empty: answers only."})
    out: str = field(default="uturn_gsm8k", metadata={"help": "Output directory."})


def main(args: Gsm8kScriptArguments) -> dict:
    from uturn_train.probe.job import distributed_state, run_probe_job

    if args.task not in ("gsm8k", "testbed"):
        raise ValueError(f"--task {args.task} has no gold answers; use gsm8k or testbed")
    if args.setting != "self":
        raise ValueError("GSM8K accuracy grades the model's own answers: use --setting self")
    return run_probe_job(args, state=distributed_state())


def make_parser(subparsers: argparse._SubParsersAction | None = None):
    from trl import TrlParser

    if subparsers is not None:
        return subparsers.add_parser("gsm8k", help="GSM8K accuracy", dataclass_types=Gsm8kScriptArguments)
    return TrlParser(Gsm8kScriptArguments)


if __name__ == "__main__":
    (args,) = make_parser().parse_args_and_config()
    main(args)

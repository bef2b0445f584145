"""GSM8K accuracy (greedy answers, no user turns), with lm-eval's strict-match and flexible-extract numbers.

```bash
python eval/gsm8k.py --model testbed --task testbed --limit 200 --out gsm8k_out
accelerate launch --config_file accelerate_configs/multi_gpu.yaml eval/gsm8k.py --model Qwen/Qwen3.5-2B --out gsm8k_qwen
python eval/gsm8k.py --model ./my-ckpt --data ../shared/data/gsm8k/test.jsonl --limit 100
```
Writes `OUT/results.json` (accuracy, accuracy_strict, accuracy_flexible) and `OUT/answers.jsonl`.
"""

from dataclasses import dataclass, field

from uturn_train.commands.probe import ProbeScriptArguments
from uturn_train.probe.settings import ProbeSettings


@dataclass
class Gsm8kScriptArguments(ProbeScriptArguments):
    out: str = field(default="uturn_gsm8k", metadata={"help": "Output directory."})


def main(args: Gsm8kScriptArguments, settings: ProbeSettings) -> dict:
    from dataclasses import replace

    from uturn_train.commands.probe import distributed_state, run_probe_job
    from uturn_train.zoo import resolve

    if args.task not in ("gsm8k", "testbed"):
        raise ValueError(f"--task {args.task} has no gold answers; use gsm8k or testbed")
    if settings.setting != "self":
        raise ValueError("GSM8K accuracy grades the model's own answers: use --setting self")
    state = distributed_state()
    with state.main_process_first():  # one process builds or fetches a named model if it is missing
        resolve(args)
    try:
        return run_probe_job(args, replace(settings, temperatures=[]), state=state)  # answers only, no user turns
    finally:  # without it gloo's threads can abort the exit (SIGABRT), pytorch/pytorch#190489
        state.destroy_process_group()


def make_parser():
    from trl import TrlParser

    return TrlParser((Gsm8kScriptArguments, ProbeSettings))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())

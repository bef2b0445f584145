"""User-turn probe as a TRL-style script; `accelerate launch` shards the prompts across processes.

# One process (CPU or one GPU)
```bash
python eval/probe.py --model testbed --task testbed --limit 200 --temperatures 0 1.0 --samples 4 --out probe_out
```

# Qwen3.5-2B on 8 GPUs (each rank probes a shard; results are gathered, identical greedy numbers to one process)
```bash
accelerate launch --config_file accelerate_configs/multi_gpu.yaml eval/probe.py \
    --model Qwen/Qwen3.5-2B --task gsm8k --limit 500 --temperatures 0 0.7 1.0 --samples 8 --out probe_qwen35_2b
```

# From a YAML file, with CLI overrides
```bash
python eval/probe.py --config my_probe.yaml --limit 50
```
"""

from uturn_train.commands.probe import ProbeScriptArguments
from uturn_train.probe.settings import ProbeSettings


def main(args: ProbeScriptArguments, settings: ProbeSettings) -> dict:
    from uturn_train.commands.probe import distributed_state, run_probe_job
    from uturn_train.zoo import resolve

    state = distributed_state()
    with state.main_process_first():  # one process builds or fetches a named model if it is missing
        resolve(args, settings)
    try:
        return run_probe_job(args, settings, state=state)
    finally:  # without it gloo's threads can abort the exit (SIGABRT), pytorch/pytorch#190489
        state.destroy_process_group()


def make_parser():
    from trl import TrlParser

    return TrlParser((ProbeScriptArguments, ProbeSettings))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())

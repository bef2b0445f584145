"""collab_dpo's training steps (probe off) against a plain TRL `DPOTrainer` script, same pairs, model and config.

    python tests/benchmarks/bench_dpo_overhead.py [--config recipes/testbed/collab_dpo.yaml] [--steps 60] [--repeats 3]

Pairs are mined once with the config's mining settings; then, alternating, in fresh processes with the same thread
count: `recipes/collab_dpo.py --dataset_name PAIRS` with the callback attached but idle (`probe_at_start` and
`probe_on_save` false, no saves), and this file's `plain` mode: `AutoModelForCausalLM`, `AutoTokenizer`,
`load_from_disk`, `DPOConfig` from the same YAML, LoRA on the same modules, `DPOTrainer(...).train()`. The step rate is
TRL's `train_steps_per_second` (training loop only: no loading, mining or tokenizing). Last line `ratio=X`
(ours / plain, median of the repeats); the goal is >= 0.95.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def plain(config: str, pairs: str, out: str, steps: int) -> None:
    """The plain TRL script, as a user would write it without uturn-train."""
    from datasets import load_from_disk
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer, ModelConfig, TrlParser

    from uturn_train.models import QWEN3_5_LORA_TARGETS
    from uturn_train.zoo import resolve

    training_args, model_args = TrlParser((DPOConfig, ModelConfig)).parse_args_and_config(
        ["--config", config, "--output_dir", out, "--max_steps", str(steps), "--save_strategy", "no",
         "--report_to", "none"], fail_with_unknown_args=False)
    resolve(model_args)  # `testbed` -> the built testbed's folder
    path = model_args.model_name_or_path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=model_args.dtype)
    lora = LoraConfig(r=model_args.lora_r, lora_alpha=model_args.lora_alpha, lora_dropout=model_args.lora_dropout,
                      target_modules=QWEN3_5_LORA_TARGETS, task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=model, args=training_args, train_dataset=load_from_disk(pairs),
                         processing_class=AutoTokenizer.from_pretrained(path), peft_config=lora)
    trainer.train()


def steps_per_second(cmd: list[str], env: dict) -> float:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} failed:\n{proc.stderr[-3000:]}")
    rates = re.findall(r"'train_steps_per_second': '?([\d.]+)", proc.stdout + proc.stderr)
    if not rates:
        sys.exit(f"no train_steps_per_second in the output of {' '.join(cmd[:3])}")
    return float(rates[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "recipes" / "testbed" / "collab_dpo.yaml"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from trl import ModelConfig, TrlParser

    from uturn_train.commands.mine import MineScriptArguments, run_mine_job
    from uturn_train.training.mining import MiningArguments

    tmp = Path(tempfile.mkdtemp(prefix="bench_dpo_"))
    model_args, mining_args = TrlParser((ModelConfig, MiningArguments)).parse_args_and_config(
        ["--config", args.config], fail_with_unknown_args=False)
    script_args = MineScriptArguments(model=model_args.model_name_or_path, out=str(tmp / "pairs"),
                                      dtype=model_args.dtype)
    from uturn_train.zoo import resolve

    resolve(script_args, mining_args)
    pairs = str(run_mine_job(script_args, mining_args))

    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    ours_cmd = [sys.executable, str(ROOT / "recipes" / "collab_dpo.py"), "--config", args.config, "--dataset_name",
                pairs, "--output_dir", str(tmp / "ours"), "--max_steps", str(args.steps), "--save_strategy", "no",
                "--probe_at_start", "false", "--probe_on_save", "false", "--report_to", "none"]
    plain_cmd = [sys.executable, __file__, "plain", args.config, pairs, str(tmp / "plain"), str(args.steps)]
    ours, base = [], []
    for i in range(args.repeats):  # alternating, so drifts in machine load hit both alike
        ours.append(steps_per_second(ours_cmd, env))
        base.append(steps_per_second(plain_cmd, env))
        print(f"repeat {i}: collab_dpo {ours[-1]:.3f} steps/s, plain DPOTrainer {base[-1]:.3f} steps/s", flush=True)
    print(f"median steps/s: collab_dpo {statistics.median(ours):.3f}, plain {statistics.median(base):.3f} "
          f"({args.steps} steps, {env['OMP_NUM_THREADS']} threads, {args.config})")
    print(f"ratio={statistics.median(ours) / statistics.median(base):.3f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "plain":
        plain(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()

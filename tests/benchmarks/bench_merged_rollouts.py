"""Rollout time of the collaboration objective with the LoRA adapters merged (`models.merged_lora`) against unmerged
(not part of the tests).

    python tests/benchmarks/bench_merged_rollouts.py [--steps 6] [--model testbed]
    python tests/benchmarks/bench_merged_rollouts.py --train_steps 60 [--repeats 2]

Rollouts only (default): holds one step's conversations of `recipes/testbed/collab_objective.yaml` (4 training tasks x
8, T=1.0, 96 tokens a turn, up to 3 turns) with a LoRA r16 adapter whose B matrices are drawn (not PEFT's zeros, so
merging changes the weights), `--steps` times each way, alternately, each step's tasks and seed the same both ways.
Prints each pair's seconds and ends with `speedup=X` = unmerged / merged over all steps, and whether the base weights
came back bit-identical.

Whole steps (`--train_steps N`): the recipe itself, `recipes/collab_grpo.py --config
recipes/testbed/collab_objective.yaml --max_steps N` without the probes, in a subprocess, alternately with the rollouts
unmerged (`collab_rl.merged_lora` replaced by a pass-through) and merged, `--repeats` times each; prints each run's mean
`step_time` (TRL's) and ends with `speedup=X` over the step times.
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model", default="testbed")
    parser.add_argument("--train_steps", type=int, default=0, help="whole training steps instead of rollouts alone")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.train_steps:
        return train_steps(args.train_steps, args.repeats)

    import torch
    from peft import LoraConfig, get_peft_model

    from uturn_train.collab import CollabSettings, OraclePartner, load_collab_tasks, run_collab
    from uturn_train.models import QWEN3_5_LORA_TARGETS, load_model, load_tokenizer, merged_lora
    from uturn_train.testbed.collab import training_collab_tasks
    from uturn_train.zoo import resolve

    config = SimpleNamespace(model_name_or_path=args.model)
    resolve(config)  # the testbed installed from its shipped weights if missing
    path = config.model_name_or_path
    tokenizer, model = load_tokenizer(path), load_model(path, dtype="float32")
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=QWEN3_5_LORA_TARGETS))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    tasks = load_collab_tasks(training_collab_tasks(Path(path), 256), ["info_gap", "peer_check"], oracle=True)
    print(f"{args.model}: {len(tasks)} training tasks; CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads")
    totals = {"unmerged": 0.0, "merged": 0.0}
    for step in range(args.steps):
        batch = [t for t in tasks[4 * step: 4 * step + 4] for _ in range(8)]
        settings = CollabSettings(max_turns=3, max_new_tokens=96, temperature=1.0, batch_size=32, seed=step)
        seconds = {}
        for way in ("unmerged", "merged") if step % 2 == 0 else ("merged", "unmerged"):
            start = time.perf_counter()
            if way == "merged":
                with merged_lora(model) as merged:
                    run_collab(merged, tokenizer, batch, OraclePartner(ordinal=False), settings, disable_progress=True)
            else:
                run_collab(model, tokenizer, batch, OraclePartner(ordinal=False), settings, disable_progress=True)
            seconds[way] = time.perf_counter() - start
            totals[way] += seconds[way]
        print(f"step {step}: unmerged {seconds['unmerged']:.2f} s, merged {seconds['merged']:.2f} s")
    same = all(torch.equal(p, base[n]) for n, p in model.named_parameters() if "lora_" not in n)
    print(f"base weights bit-identical after {args.steps} merges: {same}")
    print(f"unmerged {totals['unmerged']:.1f} s, merged {totals['merged']:.1f} s, "
          f"speedup={totals['unmerged'] / totals['merged']:.2f}")


# The recipe run as __main__, its rollouts unmerged when asked: `collab_rl.merged_lora` is looked up at each rollout.
RUN = """
import contextlib, runpy, sys
from uturn_train.training import collab_rl
sys.argv = sys.argv[1:]  # the recipe, the way, its arguments
if sys.argv.pop(1) == "unmerged":
    collab_rl.merged_lora = contextlib.nullcontext
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def train_steps(steps: int, repeats: int) -> None:
    import tempfile

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    means = {"unmerged": [], "merged": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for way in ("unmerged", "merged") if rep % 2 == 0 else ("merged", "unmerged"):
                cmd = [sys.executable, "-c", RUN, str(root / "recipes" / "collab_grpo.py"), way, "--config",
                       str(root / "recipes" / "testbed" / "collab_objective.yaml"), "--max_steps", str(steps),
                       "--save_steps", str(10 * steps), "--probe_at_start", "false", "--report_to", "none",
                       "--output_dir", str(Path(tmp) / f"{way}-{rep}")]
                done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"{way} run failed:\n{done.stderr[-3000:]}")
                log = done.stdout + done.stderr
                step_times = [float(x) for x in re.findall(r"'step_time': '([0-9.]+)'", log)]
                tokens = re.findall(r"'num_tokens': '([0-9.e+]+)'", log)[-1]
                means[way].append(sum(step_times) / len(step_times))
                print(f"{way:8s} run {rep}: mean step_time {means[way][-1]:.3f} s over {steps} steps, {tokens} tokens",
                      flush=True)
    unmerged, merged = (sum(v) / len(v) for v in (means["unmerged"], means["merged"]))
    print(f"unmerged {unmerged:.3f} s a step, merged {merged:.3f} s, speedup={unmerged / merged:.2f}")


if __name__ == "__main__":
    main()

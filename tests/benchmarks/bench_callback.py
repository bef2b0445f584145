"""Wall-time overhead of `UserTurnProbeCallback` at its default settings (not part of the tests).

    python tests/benchmarks/bench_callback.py [--max_steps 500] [--save_steps 500] [--repeats 1]

A short LoRA SFT run on the testbed's conversations, once with the callback (default `ProbeArguments`, task
`testbed`) and once without, alternately, same seed; prints both wall times and the probe's own seconds, and ends
with `overhead=X` = (with - without) / without. The default cadence is the Trainer's `save_steps=500`: probes at step 0
and at every save.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def run(model_dir, conversations, out, *, with_probe, max_steps, save_steps):
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from uturn_train import ProbeArguments, UserTurnProbeCallback

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    data = load_dataset("json", data_files=str(conversations), split="train").select_columns(["messages"])
    args = SFTConfig(output_dir=str(out), max_steps=max_steps, save_steps=save_steps, logging_steps=50,
                     per_device_train_batch_size=8, learning_rate=2e-4, report_to="none", bf16=False, seed=0,
                     max_length=256, disable_tqdm=True, use_cpu=not torch.cuda.is_available(), save_only_model=True)
    probe = ProbeArguments(probe_task="testbed", probe_data=str(Path(model_dir) / "heldout.jsonl"))
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=r".*layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|"
                      r"linear_attn\.(in_proj_qkv|in_proj_z|out_proj)|mlp\.(gate_proj|up_proj|down_proj))")
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer, peft_config=lora)
    if with_probe:
        trainer.add_callback(UserTurnProbeCallback(probe, tokenizer, trainer=trainer))
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    probe = sum(h.get("probe/seconds", 0.0) for h in trainer.state.log_history)
    return seconds, probe


def main():
    import tempfile

    from uturn_train.testbed import ensure_testbed

    parser = argparse.ArgumentParser()
    parser.add_argument("--max_steps", type=int, default=500)
    parser.add_argument("--save_steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    testbed = ensure_testbed()
    best = {True: (float("inf"), 0.0), False: (float("inf"), 0.0)}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for with_probe in (False, True):
                seconds, probe = run(testbed, testbed / "conversations.jsonl", Path(tmp) / f"{with_probe}-{r}",
                                     with_probe=with_probe, max_steps=args.max_steps, save_steps=args.save_steps)
                print(f"run {r} {'with' if with_probe else 'without'} callback: {seconds:.1f} s"
                      + (f" (probe {probe:.1f} s)" if with_probe else ""))
                best[with_probe] = min(best[with_probe], (seconds, probe))
    (with_s, probe_s), (without_s, _) = best[True], best[False]
    print(f"steps={args.max_steps} save_steps={args.save_steps} without={without_s:.1f}s with={with_s:.1f}s "
          f"probe={probe_s:.1f}s")
    print(f"overhead={(with_s - without_s) / without_s:.3f}")


if __name__ == "__main__":
    main()

"""A few LoRA SFT steps on a tiny model with the probe callback; the callback tests run it in-process and under
`accelerate launch`:

    accelerate launch --multi_gpu --num_processes 2 tests/helpers/train_with_probe.py MODEL_DIR OUT_DIR GSM8K_JSONL \
        [JUDGE_BASE_URL]

With a judge's API root (serving `judge-model`), the probe labels with the rules and the judge (`probe_labeler both`).
`PROBE_DS3_GATHER=0` makes the probe generate layer by layer under ZeRO-3.
"""

import os
import sys

LORA_TARGETS = r".*layers\.\d+\.(self_attn\.(q_proj|v_proj)|linear_attn\.(in_proj_qkv|out_proj)|mlp\.down_proj)"


def make_trainer(model_dir, output_dir, probe_data, *, with_probe=True, max_steps=4, report_to="none",
                 resume_steps=None, **probe_overrides):
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from uturn_train import ProbeArguments, UserTurnProbeCallback

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rows = [{"messages": [{"role": "user", "content": f"What is {a} + {a}?"},
                          {"role": "assistant", "content": f"{a} + {a} = {2 * a}.\n#### {2 * a}"}]} for a in range(16)]
    args = SFTConfig(output_dir=str(output_dir), max_steps=max_steps, save_steps=2, logging_steps=1,
                     per_device_train_batch_size=2, learning_rate=1e-3, report_to=report_to, bf16=False,
                     use_cpu=not torch.cuda.is_available(),  # without it, 2 CPU processes do not form a group
                     seed=0, max_length=64, disable_tqdm=True)
    probe = dict(probe_task="gsm8k", probe_labeler="rules",
        probe_data=str(probe_data), probe_limit=5, probe_temperatures=[0.0, 1.0],
                 probe_samples=2, probe_max_new_tokens=8, probe_answer_max_new_tokens=12, probe_batch_size=2)
    probe.update(probe_overrides)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         peft_config=lora)
    if with_probe:
        trainer.add_callback(UserTurnProbeCallback(ProbeArguments(**probe), tokenizer, trainer=trainer))
    return trainer


if __name__ == "__main__":
    judge = {}
    if len(sys.argv) > 4:
        judge = dict(probe_labeler="both", probe_judge_base_url=sys.argv[4], probe_judge_model="judge-model",
                     probe_judge_cache_dir=f"{sys.argv[2]}/judge_cache")
    trainer = make_trainer(*sys.argv[1:4], probe_ds3_gather=os.environ.get("PROBE_DS3_GATHER", "1") == "1", **judge)
    trainer.train()
    # Destroys the process group, as the recipes do: a gloo group left to the interpreter's exit can abort a rank
    # ("terminate called without an active exception", SIGABRT; pytorch/pytorch#179291 describes why).
    trainer.end()

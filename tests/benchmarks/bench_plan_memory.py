"""`uturn plan`'s training-step memory against a measured forward + backward of Qwen3.5-2B's shape on this CPU.

    python tests/benchmarks/bench_plan_memory.py            # builds qwen3.5-2b-random first if missing (~2 min)

LoRA r=32 on the documented targets, TRL's fused LM head, float32, for a few (rows, length) with and without gradient
checkpointing. Measured: the rise of the process's peak RSS over one step, from a fresh peak (`/proc/self/clear_refs`),
with glibc returning every freed block of 64 KiB or more to the system (`MALLOC_MMAP_THRESHOLD_`, set by re-executing),
so that RSS follows live tensors, as a GPU's allocated memory does, and not what the C allocator keeps for later.
Printed beside the plan's activations + loss + the adapter's gradients for the same shape; the ratio is the figure.
"""

import os
import sys

if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})

import torch  # noqa: E402


def status(key: str) -> float:
    text = open("/proc/self/status").read()
    return int(text.split(f"{key}:")[1].split()[0]) * 1024 / 1e9


def main():
    from peft import LoraConfig, get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    from uturn_train.commands.plan import defaults, model_config, plan, shape
    from uturn_train.models import QWEN3_5_LORA_TARGETS, load_model
    from uturn_train.zoo.qwen3_5_2b import ensure_stand_in

    model = load_model(str(ensure_stand_in()), "float32")
    add_fused_lm_head(model)
    model = get_peft_model(model, LoraConfig(r=32, lora_alpha=64, target_modules=QWEN3_5_LORA_TARGETS))
    model.train()
    model.enable_input_require_grads()
    planned_shape = shape(model_config("Qwen/Qwen3.5-2B"), 32, None)
    print(f"CPU {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, float32, LoRA r=32")
    print(f"{'ckpt':>5} {'rows':>5} {'length':>6} {'measured GB':>12} {'planned GB':>11} {'ratio':>6}")
    for ckpt in (True, False):
        if ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
        for rows, length in ((8, 64), (8, 128), (16, 64)):
            ids = torch.randint(0, 1000, (rows, length))
            open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from the current RSS
            base = status("VmRSS")
            model(input_ids=ids, labels=ids, fused_lm_head=True).loss.backward()
            measured = status("VmHWM") - base
            model.zero_grad(set_to_none=True)
            values = {"recipe": "sft", "dtype": "float32", "per_device_train_batch_size": rows, "max_length": length,
                      "gradient_checkpointing": ckpt}
            parts = plan({**defaults("sft"), "prompt_tokens": 256, **values}, 1, "single", planned_shape)
            # The step also allocates the adapter's fp32 gradients (the plan's LoRA states count them).
            planned = (parts["activations"] + parts["logits"] + 4 * planned_shape.lora_params) / 1e9
            print(f"{'on' if ckpt else 'off':>5} {rows:>5} {length:>6} {measured:>12.2f} {planned:>11.2f} "
                  f"{measured / planned:>6.2f}")


if __name__ == "__main__":
    main()

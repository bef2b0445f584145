"""Under ZeRO-3, before any trainer: the probe's greedy answers with the model gathered whole and layer by layer
(`distributed.gathered_if_zero3`, as collab GRPO writes its prompts' answers), and the largest share of the model's
weights gathered at once on this rank while generating. Every parameter is partitioned (persistence threshold 0).

    accelerate launch --multi_gpu --num_processes 2 tests/helpers/zero3_answers.py MODEL_DIR OUT_PREFIX

Writes OUT_PREFIX.<rank>.json: {"whole": {"answers", "max_share", "share_after"}, "per_layer": {...}}.
"""

import json
import sys

import deepspeed
import torch
from accelerate import PartialState
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.integrations import HfDeepSpeedConfig

from uturn_train.distributed import gathered_if_zero3
from uturn_train.probe.runner import run_probe
from uturn_train.probe.settings import ProbeSettings
from uturn_train.tasks.base import Example

model_dir, prefix = sys.argv[1:3]
state = PartialState(cpu=True)  # gloo, as the recipes get it with `use_cpu`
deepspeed.init_distributed(dist_backend="gloo")
ds = HfDeepSpeedConfig({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
                        "train_micro_batch_size_per_gpu": 1})  # kept alive: transformers reads it while loading
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
params = list(model.parameters())
total = sum(p.ds_numel for p in params)
# Unequal lengths, 5 prompts over 2 ranks: `map_sharded` pads the shards, `generate` keeps the ranks in step.
queries = ["What is 2 + 3?", "Tom has 4 apples and buys 7 more. How many now?", "Name a colour.",
           "A train goes 60 km in 1 hour. How far in 3 hours?", "Why?"]
examples = [Example(id=str(i), query=q) for i, q in enumerate(queries)]
settings = ProbeSettings(labeler="rules", temperatures=[], answer_max_new_tokens=12, batch_size=2)
result, peak = {}, {}


def count(module, args):
    peak["numel"] = max(peak["numel"], sum(p.ds_numel for p in params if p.ds_status == ZeroParamStatus.AVAILABLE))


for name, whole in (("whole", True), ("per_layer", False)):
    peak["numel"] = 0
    with gathered_if_zero3(model, whole=whole):
        hooks = [m.register_forward_pre_hook(count) for m in model.modules()]  # after the gathering hooks: they ran
        answers = [a["answer"] for a in run_probe(model, tokenizer, examples, settings, state=state).answers]
        for hook in hooks:
            hook.remove()
    after = sum(p.ds_numel for p in params if p.ds_status == ZeroParamStatus.AVAILABLE)
    result[name] = {"answers": answers, "max_share": peak["numel"] / total, "share_after": after / total}
with open(f"{prefix}.{state.process_index}.json", "w") as f:
    json.dump(result, f)
state.destroy_process_group()  # as `train_with_probe.py` does, and why

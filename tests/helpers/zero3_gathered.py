"""Run a recipe under DeepSpeed ZeRO-3 and record, at the end of every backward, how many decoder-layer weights are
still gathered (full size on this rank) before DeepSpeed's end-of-backward clean-up releases them:

    GATHERED_LOG=out.jsonl accelerate launch --config_file accelerate_configs/deepspeed_zero3.yaml --num_processes 2 \
        tests/helpers/zero3_gathered.py recipes/collab_dpo.py --config ... [recipe options]

One JSON line per rank and backward: {"rank", "backward", "layer_numel", "gathered_numel"}. A weight still gathered
there was held through the backward; in a well-behaved run each layer's weights are released after its backward.
"""

import json
import os
import runpy
import sys

from deepspeed.runtime.zero import parameter_offload, stage3
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

state = {"module": None, "backward": 0}
_init = parameter_offload.DeepSpeedZeRoOffload.__init__
_epilogue = stage3.DeepSpeedZeroOptimizer_Stage3.backward_epilogue


def init(self, module, *args, **kwargs):
    state["module"] = module
    return _init(self, module, *args, **kwargs)


def epilogue(self):
    layers = [p for n, p in state["module"].named_parameters() if ".layers." in n and not p.ds_persist]
    gathered = sum(p.ds_numel for p in layers if p.ds_status == ZeroParamStatus.AVAILABLE)
    state["backward"] += 1
    with open(os.environ["GATHERED_LOG"], "a") as f:
        f.write(json.dumps({"rank": int(os.environ.get("RANK", 0)), "backward": state["backward"],
                            "layer_numel": sum(p.ds_numel for p in layers), "gathered_numel": gathered}) + "\n")
    return _epilogue(self)


parameter_offload.DeepSpeedZeRoOffload.__init__ = init
stage3.DeepSpeedZeroOptimizer_Stage3.backward_epilogue = epilogue
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")

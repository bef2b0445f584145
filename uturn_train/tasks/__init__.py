"""Probe data: the tasks `uturn probe --task` knows, from the Hugging Face hub by name or from a local file."""

import logging
from collections.abc import Iterator
from pathlib import Path

from . import gsm8k, instructions, mtbench, oasst
from .base import Example
from .jsonl import BadRow, read_jsonl

__all__ = ["TASKS", "Example", "ExampleList", "load_task"]

logger = logging.getLogger(__name__)

TASKS = ("gsm8k", "ifeval", "ifbench", "mtbench", "oasst", "testbed")

# (hub data set, config, split) of each task; a hub name given as `data` is loaded with the same config and split.
HUB = {
    "gsm8k": ("openai/gsm8k", "main", "test"),
    "ifeval": ("google/IFEval", None, "train"),
    "ifbench": ("allenai/IFBench_test", None, "train"),
    "mtbench": ("HuggingFaceH4/mt_bench_prompts", None, "train"),
    "oasst": ("OpenAssistant/oasst1", None, "validation"),
    "testbed": ("openai/gsm8k", "main", "test"),  # GSM8K format: only used when a hub name is passed as data
}


class ExampleList(list):
    """The examples of a task: a plain `list` of `Example`s, plus `skipped`, the number of bad rows left out."""

    def __init__(self, examples: list[Example], skipped: int = 0):
        super().__init__(examples)
        self.skipped = skipped


def load_task(task: str, data: str | None = None, limit: int | None = None, skip_bad: bool = False,
              split: str | None = None, data_option: str = "--data") -> ExampleList:
    """Loads the probe examples of a task, in the order of its data.

    Args:
        task (`str`):
            One of `TASKS`.
        data (`str`, *optional*):
            A local `.jsonl` (or `.json`) file in the task's format, or a hub data set name. Defaults to the task's
            hub data set (see `HUB`).
        limit (`int`, *optional*):
            Keep only the first `limit` examples.
        skip_bad (`bool`, *optional*, defaults to `False`):
            Skip rows with missing or empty fields instead of raising; their number is logged and kept in
            `ExampleList.skipped`. Malformed JSON is an error either way.
        split (`str`, *optional*):
            The split of a hub data set, instead of the task's (see `HUB`); training data takes `train`.
        data_option (`str`, *optional*, defaults to `"--data"`):
            The option the user gave `data` with (`--probe_data`, `--mine_data`...), named in the errors.

    Returns:
        `ExampleList`: a `list` of `Example`s with a `skipped` count.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of examples, got {limit}")
    if task == "testbed" and data is None:
        raise ValueError("task `testbed` reads the held-out problems of a built testbed: pass its heldout.jsonl as "
                         "data (the uturn commands and recipes fill it in, see `uturn_train.testbed.resolve`)")
    source, rows = _rows(task, data, split, data_option)
    if task == "oasst":
        rows = oasst.trees(rows)

    examples, seen, skipped, n_rows = [], {}, [], 0
    for index, (where, row) in enumerate(rows):
        n_rows += 1
        try:
            new = _to_examples(task, row, index, where)
            for example in new:
                if example.id in seen:
                    raise BadRow(f"{where}: duplicate id {example.id!r}, first given at {seen[example.id]}")
        except BadRow as err:
            if not skip_bad:
                raise BadRow(f"{err}. Fix the data, or leave bad rows out (--skip_bad_rows / skip_bad=True)") from None
            skipped.append(str(err))
            continue
        seen.update((example.id, where) for example in new)
        examples.extend(new)
        if limit is not None and len(examples) >= limit:
            del examples[limit:]
            break

    if n_rows == 0:
        raise ValueError(f"{source} is empty: no rows to probe")
    if skipped:
        logger.warning("%s: skipped %d bad rows (first: %s)", source, len(skipped), skipped[0])
    if not examples:
        raise ValueError(f"{source}: no {task} examples in {n_rows} rows ({len(skipped)} skipped as bad)")
    return ExampleList(examples, skipped=len(skipped))


def _to_examples(task: str, row: dict, index: int, where: str) -> list[Example]:
    if task in ("gsm8k", "testbed"):
        return [gsm8k.to_example(row, index, where, prefix=task)]
    if task in ("ifeval", "ifbench"):
        return [instructions.to_example(row, where, prefix=task)]
    if task == "mtbench":
        return [mtbench.to_example(row, where)]
    return oasst.to_examples(row, where)


def _rows(task: str, data: str | None, split: str | None = None,
          data_option: str = "--data") -> tuple[str, Iterator[tuple[str, dict]]]:
    """The source's name for messages, and its `(where, row)` pairs."""
    name, config, task_split = HUB[task]
    split = split or task_split
    if data is not None:
        path = Path(data).expanduser()
        if path.is_file():
            return str(path), read_jsonl(path)
        # A hub name is `owner/name`; anything that looks like a file or exists as a folder is a path gone wrong.
        if path.exists() or path.suffix in (".jsonl", ".json"):
            raise ValueError(f"{data_option}: data file {path} "
                             f"{'is a folder' if path.exists() else 'does not exist'}")
        name = data
    return f"{name} ({split})", hub_rows(name, config, split, data_option)


def hub_rows(name: str, config: str | None, split: str, data_option: str = "--data") -> Iterator[tuple[str, dict]]:
    import datasets  # slow to import, and only the hub path needs it

    try:
        dataset = datasets.load_dataset(name, config, split=split)
    except (ConnectionError, datasets.exceptions.DatasetNotFoundError) as err:
        raise ValueError(
            f"cannot load the data set {name!r} from the Hugging Face hub: {err}. Offline (HF_HUB_OFFLINE=1) or "
            f"without access, point at a local copy instead: {data_option} PATH.jsonl"
        ) from err
    return ((f"{name} ({split}) row {i}", row) for i, row in enumerate(dataset))

"""IFEval and IFBench: prompts with verifiable formatting instructions (`google/IFEval`, `allenai/IFBench_test`).

Both use one format, `{key, prompt, instruction_id_list, kwargs}`: `kwargs[i]` holds the arguments of instruction
`i` (IFBench lists every argument name, null where unused). The probe uses the prompt; the instruction ids and
their arguments are kept in `meta` for the instruction checkers.
"""

from .base import Example
from .jsonl import BadRow, require


def to_example(row: dict, where: str, prefix: str) -> Example:
    """One `{key, prompt, instruction_id_list, kwargs}` row; `prefix` (`"ifeval"` or `"ifbench"`) starts the id."""
    key = require(row, "key", where)
    prompt = require(row, "prompt", where)
    instruction_ids = require(row, "instruction_id_list", where)
    kwargs = require(row, "kwargs", where)
    if not isinstance(kwargs, list) or len(kwargs) != len(instruction_ids):
        raise BadRow(f"{where}: field 'kwargs' must be a list with one entry per instruction in 'instruction_id_list'")
    return Example(
        id=f"{prefix}-{key}",
        query=prompt,
        meta={"instruction_id_list": instruction_ids, "kwargs": kwargs},
    )

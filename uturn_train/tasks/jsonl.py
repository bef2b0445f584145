"""Reading probe rows: local JSON Lines with `file:line` locations, and field checks that name them."""

import json
from collections.abc import Iterator
from pathlib import Path


class BadRow(ValueError):
    """A row that cannot become an example; `load_task(..., skip_bad=True)` skips and counts these."""


def read_jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    """Yields `(where, row)` for each non-blank line of a JSON Lines file, `where` being `"path:line"`.

    A file holding one JSON list of objects (a `.json` export) is read too, its items located as `"path[i]"`.
    Malformed JSON is always an error, even with `skip_bad`: the rest of the file cannot be trusted.
    """
    with path.open(encoding="utf-8") as f:
        # `Dataset.to_json` writes JSON Lines even to `.json` names, so a `.json` file is a list only if it opens one.
        is_list = path.suffix == ".json" and f.read(4096).lstrip().startswith("[")
    if is_list:
        with path.open(encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{err.lineno}: malformed JSON ({err.msg} at column {err.colno})") from err
        rows = ((f"{path}[{i}]", row) for i, row in enumerate(data))
    else:
        rows = _jsonl_rows(path)
    for where, row in rows:
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        yield where, row


def _jsonl_rows(path: Path) -> Iterator[tuple[str, object]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: malformed JSON ({err.msg} at column {err.colno})") from err


def require(row: dict, field: str, where: str):
    """Returns `row[field]`, raising `BadRow` naming `where` and the field when it is missing or empty."""
    if field not in row or row[field] is None:
        raise BadRow(f"{where}: missing field {field!r} (fields present: {', '.join(map(repr, row)) or 'none'})")
    value = row[field]
    if value == [] or (isinstance(value, str) and not value.strip()):
        raise BadRow(f"{where}: empty field {field!r}")
    return value

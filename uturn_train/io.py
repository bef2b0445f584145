"""Atomic file writes: a reader never sees a half-written output, and a failed job leaves none behind."""

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it: once, at import, not while threads write files
    os.umask(mask)
    return mask


UMASK = _umask()


@contextmanager
def atomic_open(path: str | Path, mode: str = "w"):
    """Open a temporary file beside `path`; it replaces `path` only if the block finishes without error."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp makes it 0600; give the mode a plain open() would
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, obj) -> None:
    with atomic_open(path) as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_jsonl(path: str | Path, rows) -> None:
    with atomic_open(path) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path, fields: tuple[str, ...] = (), check=None) -> list[dict]:
    """The rows of a jsonl file (blank lines skipped); a row that is not JSON, lacks one of the string `fields`, or for
    which `check(row)` returns a message, fails with its line number."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
            missing = [k for k in fields if not isinstance(row.get(k), str)]
            if missing:
                raise ValueError(f"{path}:{line_no}: missing string field(s) {missing}; every row needs "
                                 + ", ".join(f"`{k}`" for k in fields))
            problem = check(row) if check is not None else None
            if problem:
                raise ValueError(f"{path}:{line_no}: {problem}")
            rows.append(row)
    return rows


def ensure_writable_dir(path: str | Path, option: str = "--out") -> Path:
    """Create `path` if needed and check that files can be written there, before any long work starts."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check."):
            pass
    except OSError as e:
        raise ValueError(f"{option} {path} is not a writable directory ({e.strerror}); pass another {option}") from e
    return path


@contextmanager
def atomic_dir(path: str | Path, *, replace: bool = False):
    """Yield a temporary folder beside `path` that becomes `path` only if the block finishes without error.

    An existing `path` is an error unless `replace`; it is then swapped out by two renames and deleted only once the new
    folder is in place, so a reader finds the old folder or the new one, never a mix, and an interrupted write leaves
    nothing behind.
    """
    path = Path(path).expanduser()
    if path.exists() and not replace:
        raise ValueError(f"{path} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        yield tmp
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.old-"))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

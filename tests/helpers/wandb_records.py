"""Read back what an offline W&B run recorded (wandb 0.31 ships no reader for its `.wandb` files).

The file is a LevelDB-style log: a 7-byte header (`:W&B`, magic 0xBEE1, version), then 32 KiB blocks of chunks
`crc32c (4) | length (2, little-endian) | type (1: full, 2: first, 3: middle, 4: last) | data`, each record a
serialized `wandb_internal_pb2.Record`.
"""

import json
import struct
import time
from pathlib import Path

BLOCK, HEADER = 32768, 7


def read_records(path: str | Path):
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B datastore file"
    pos, pending = HEADER, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def history_rows(run_dir: str | Path, timeout: float = 60) -> list[dict]:
    """Every `wandb.log` row of the offline run in `run_dir` (the folder holding `run-<id>.wandb`), once the file
    holds the run's exit record: wandb-core writes the file in its own process and may still be writing it after
    `wandb.finish()` returns (a test that read it at once found no probe row that the same file held afterwards)."""
    (path,) = Path(run_dir).glob("run-*.wandb")
    deadline = time.monotonic() + timeout
    records = list(read_records(path))
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, f"{path}: no exit record after {timeout} s; did the run call finish()?"
        time.sleep(0.5)
        records = list(read_records(path))
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            rows.append({("/".join(item.nested_key) or item.key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows

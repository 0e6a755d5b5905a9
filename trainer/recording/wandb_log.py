"""What a W&B offline run's transaction log (`run-<id>.wandb`) durably holds: the steps of its history.

The log is LevelDB-style: a 7-byte file header (":W&B", version), then 32 KiB blocks of records, each
with a 7-byte header (crc32, length, kind: 1 full, 2 first, 3 middle, 4 last piece); each record is one
of wandb's protobuf `Record`s. A copy taken while W&B was still writing may end in a torn record: what is
cut short is not there. The trackers read it to know which steps W&B really has (trainer/recording/trackers.py).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

HEADER = 7
BLOCK = 32768
MAGIC = b":W&B"


def records(data: bytes) -> Iterator[Any]:
    """wandb's protobuf Records in a transaction log, in order, up to the first one cut short."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    if data[: len(MAGIC)] != MAGIC:
        return
    pos, parts = HEADER, b""
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:  # zero padding to the block's end
            pos += left
            continue
        if pos + HEADER + length > len(data):
            return
        parts += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(parts)
            except DecodeError:
                return
            yield record
            parts = b""


def history_steps(data: bytes) -> list[int]:
    """The steps of the history rows a transaction log holds."""
    return [r.history.step.num for r in records(data) if r.HasField("history")]

"""The job's data as a launch reads it: checked once, every row, and kept for the rest of the launch.

`check_data` reads each source the way the trainer will (every JSONL line, other sources' columns and
records, the splits, the held-out set); `load_rows` keeps what it read in this process, so the planner's
token count (orchestrator/sizing/throughput.py) reads no file a second time. `quick_fail` is the one set of
S3 client settings that answers in seconds when a store is unreachable (the launch's data check and the
SkyPilot preflight both use it). No torch here.
"""

from __future__ import annotations

import os
from typing import Any

from orchestrator.errors import SpecError
from trainer.config import JobSpec

#: (path, format, split, subset, the local file's size and mtime) -> the rows as `datasets` read them
_ROWS: dict[tuple[Any, ...], Any] = {}


def quick_fail(path: str, options: dict[str, Any], read_timeout_s: float = 10.0) -> dict[str, Any]:
    """`options` for reading `path`, with short S3 connect/read timeouts and two tries when it is on S3 (a
    dead endpoint answers in seconds, not after botocore's minutes of retries); the user's own
    config_kwargs win."""
    if not path.startswith(("s3://", "s3a://")):
        return dict(options)
    config = {"connect_timeout": 3, "read_timeout": read_timeout_s, "retries": {"max_attempts": 2}}
    return {**options, "config_kwargs": {**config, **options.get("config_kwargs", {})}}


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None  # remote or missing: one process reads it once anyway
    return info.st_size, info.st_mtime_ns


def load_rows(
    path: str,
    fmt: str,
    split: str = "train",
    subset: str | None = None,
    options: dict[str, Any] | None = None,
    field: str = "data.path",
) -> Any:
    """trainer/data/source.py `load`, once per source and process (a file changed since is read again)."""
    from trainer.data import source as data_source

    key = (path, fmt, split, subset, _stamp(path))
    if key not in _ROWS:
        _ROWS[key] = data_source.load(path, fmt, split, subset, quick_fail(path, options or {}), field)
    return _ROWS[key]


def check_data(spec: JobSpec) -> list[str]:
    """The data, checked at launch as the trainer will read it: every JSONL line (encoding, JSON, the
    format's keys), other sources' columns and records, the splits, the held-out set. Local data must pass;
    remote data is checked when it can be read now (when it cannot, the trainer reports it, with the same
    messages); a hub data set is not fetched here. Returns notes on what was not checked."""
    from trainer.data import source as data_source
    from trainer.data.check import DataError, check_chat_template, check_row

    data = spec.data
    options = dict(spec.checkpoint.storage_options)
    notes: list[str] = []
    sources = [("data.path", data.path, data.split, data.subset)]
    held = data.eval_source()
    if held is not None:
        sources.append(("data.eval_path", held[0], held[1], data.subset if held[0] == data.path else None))
    for field, path, split, subset in sources:
        remote = data_source.is_remote(path)
        if data_source.looks_like_hub_id(path):
            notes.append(f"{field}: {path} is taken as a Hugging Face Hub data set (not fetched to check it)")
            continue
        try:
            rows = load_rows(path, data.format, split, subset, options, field)
            if "_line" not in rows.column_names:  # JSONL lines were checked as they were read
                for number, row in enumerate(rows, start=1):
                    check_row({**row, "_line": number}, data.format, path)
            if field == "data.path":
                data_source.held_out_split(data, len(rows))
                if data.format == "chat" and data.chat_template:  # one record rendered, as the trainer will
                    check_chat_template(data.chat_template, {"_line": 1, **next(iter(rows))}, path)
        except DataError as exc:
            raise SpecError(exc.field, str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - unreadable now: the trainer reads (and reports) it
            if not remote:
                raise SpecError(field, f"cannot read {path}: {exc.__class__.__name__}: {exc}") from None
            notes.append(f"{field}: {path} could not be read from here ({exc.__class__.__name__})")
    return notes

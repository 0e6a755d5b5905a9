"""Where the data comes from, read into a `datasets.Dataset`: a JSONL, JSON or parquet file or a folder of
them, a `save_to_disk` folder, an fsspec URL of any of these (s3://, gs://), or a Hugging Face Hub id.

The one reader for the trainer, `ftorch validate`/`launch` (orchestrator/jobs/lifecycle.py) and the planner's token
count (orchestrator/sizing/throughput.py). No torch here, and `datasets` is imported only when data is read.
JSONL goes through `data_check.iter_jsonl` (its `file:line` messages); the rest through `datasets`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from fsspec.core import url_to_fs

from trainer.data.check import FORMATS, DataError, iter_jsonl
from trainer.runstore import scratch

#: data file suffixes and the `datasets` builder that reads each
SUFFIXES = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet"}
#: markers of a `save_to_disk` folder (a Dataset, or a DatasetDict of splits)
SAVED = ("dataset_info.json", "state.json", "dataset_dict.json")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
#: the columns each format reads (others are dropped) and those it cannot do without
COLUMNS = {"text": ("text",), "instruction": ("instruction", "input", "output"), "chat": ("messages",)}
REQUIRED = {"text": ("text",), "instruction": ("instruction", "output"), "chat": ("messages",)}


def looks_like_hub_id(path: str) -> bool:
    """'owner/name' or 'name', not a URL or a path-like string, with no data-file suffix."""
    if "://" in path or path.startswith((".", "/", "~")) or os.path.exists(path):
        return False
    return PurePosixPath(path).suffix.lower() not in SUFFIXES and bool(HUB_ID.match(path))


def is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def load(
    path: str,
    fmt: str,
    split: str = "train",
    subset: str | None = None,
    storage_options: dict[str, Any] | None = None,
    field: str = "data.path",
) -> Any:
    """The records of one source as a `datasets.Dataset` holding only the columns `fmt` reads.

    Raises DataError (its `field` names the job-file field) for a missing source, an unknown split or
    subset, a column the format needs, or (JSONL) a bad line."""
    try:
        if looks_like_hub_id(path):
            ds = _hub(path, split, subset, field)
        else:
            if subset is not None:
                raise DataError(f"{subset!r}: a subset applies to hub data sets, not {path}", "data.subset")
            ds = _files(path, fmt, split, storage_options or {}, field)
    except DataError as exc:  # a JSONL line's error names data.path; this source may be another field
        if exc.field == "data.path" and field != "data.path":
            raise DataError(str(exc), field) from None
        raise
    if fmt == "chat" and "conversations" in ds.column_names and "messages" not in ds.column_names:
        ds = _sharegpt_columns(ds, path, field)
    missing = [c for c in REQUIRED[fmt] if c not in ds.column_names]
    if missing:
        raise DataError(
            f"{path} has no column {missing[0]!r}, which data.format {fmt} needs ({FORMATS[fmt]}; its "
            f"columns: {', '.join(ds.column_names) or 'none'})",
            field,
        )
    if len(ds) == 0:
        raise DataError(f"{path}: no examples", field)
    return ds.select_columns([c for c in (*COLUMNS[fmt], "_line") if c in ds.column_names])


def _sharegpt_columns(ds: Any, path: str, field: str) -> Any:
    """A ShareGPT data set (a `conversations` column) as chat records (`messages`)."""
    from trainer.data.check import from_sharegpt

    rows = [
        from_sharegpt({"conversations": turns}, f"{path}:{i + 1}")
        for i, turns in enumerate(ds["conversations"])
    ]
    import datasets

    kept = {c: ds[c] for c in ds.column_names if c != "conversations"}
    return datasets.Dataset.from_dict({**kept, "messages": [r["messages"] for r in rows]})


def _files(path: str, fmt: str, split: str, options: dict[str, Any], field: str) -> Any:
    fs, where = url_to_fs(path, **options)
    if not fs.exists(where):
        if is_remote(path):  # perhaps only from here (other credentials): launch goes on, the trainer tells
            raise FileNotFoundError(f"{field}: {path} does not exist")
        raise DataError(f"{path} does not exist", field)
    if fs.isdir(where) and any(fs.exists(f"{where.rstrip('/')}/{m}") for m in SAVED):
        return _saved(path, split, options, field)
    files = sorted(f for f in fs.find(where) if _suffix(f)) if fs.isdir(where) else [where]
    kinds = {SUFFIXES.get(_suffix(f), "") for f in files}
    if not files:
        raise DataError(f"{path}: no .jsonl, .json or .parquet files in this folder", field)
    if "" in kinds:
        raise DataError(f"{path}: not a .jsonl, .json or .parquet file (nor a folder of them)", field)
    if len(kinds) > 1:
        raise DataError(f"{path}: mixes {' and '.join(sorted(kinds))} files; keep one kind per folder", field)
    if split != "train":
        raise DataError(
            f"{split!r}: files are one split ('train'); splits apply to hub data sets and saved DatasetDicts",
            field.replace("path", "split"),
        )
    urls = [f if fs.unstrip_protocol(f).startswith("file://") else fs.unstrip_protocol(f) for f in files]
    kind = kinds.pop()
    if kind == "jsonl":
        return _from_rows([row for url in urls for row in iter_jsonl(url, options, fmt)], fmt)
    import datasets

    with scratch.folder("ftorch-data-") as tmp:
        if is_remote(path):  # fetched through fsspec (not `datasets`' downloader, which offline mode stops)
            local = [os.path.join(tmp, f"{n:05d}-{PurePosixPath(f).name}") for n, f in enumerate(files)]
            for remote, here in zip(files, local, strict=True):
                fs.get(remote, here)
            urls = local
        if kind == "parquet":
            _check_parquet(urls, path, field)
        try:  # the Arrow result lives in the `datasets` cache: the fetched copies can go
            with quiet_datasets():
                return datasets.load_dataset(kind, data_files=urls, split="train")
        except Exception as exc:  # noqa: BLE001 - a malformed file, told on one line
            raise DataError(f"{path}: cannot be read as {kind} ({_first_line(exc)})", field) from None


def _check_parquet(files: list[str], path: str, field: str) -> None:
    """Each parquet file opens (else DataError naming it) and together they hold rows (else "no
    examples", not a reader's error about batch sizes)."""
    import pyarrow.parquet as pq

    rows = 0
    for name in files:
        try:
            rows += pq.ParquetFile(name).metadata.num_rows
        except Exception as exc:  # noqa: BLE001 - a damaged or foreign file, told on one line
            # a fetched copy is named after the remote file (00003-<name>)
            shown = f"{path}: {PurePosixPath(name).name.split('-', 1)[-1]}" if is_remote(path) else name
            raise DataError(f"{shown}: not a readable parquet file ({_first_line(exc)})", field) from None
    if rows == 0:
        raise DataError(f"{path}: no examples (its parquet files hold no rows)", field)


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """`datasets` without its log lines and progress bars (restored after), around a call that imported
    it: a bad source is reported by ftorch's own one line, not after a reader's error log and bars."""
    import logging

    import datasets.utils.logging as ds_logging

    logger = logging.getLogger("datasets")
    level = logger.level
    bars = ds_logging.is_progress_bar_enabled()
    logger.setLevel(logging.CRITICAL + 1)
    ds_logging.disable_progress_bar()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            ds_logging.enable_progress_bar()


def _suffix(name: str) -> str:
    return PurePosixPath(name).suffix.lower() if PurePosixPath(name).suffix.lower() in SUFFIXES else ""


class Rows:
    """JSONL records in memory with the few `datasets.Dataset` methods the readers use. A small data set
    is tokenised from these in this process, without importing `datasets` (about 2 s at every trainer
    start); a larger one becomes a Dataset (`to_dataset`) for `datasets.map` in several processes."""

    def __init__(self, rows: list[dict[str, Any]], columns: list[str]) -> None:
        self.rows, self.column_names = rows, columns

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Any:
        return ({c: row.get(c) for c in self.column_names} for row in self.rows)

    def select(self, indices: Any) -> Rows:
        return Rows([self.rows[i] for i in indices], self.column_names)

    def select_columns(self, columns: list[str]) -> Rows:
        return Rows(self.rows, [c for c in columns if c in self.column_names])

    def columns(self) -> dict[str, list[Any]]:
        return {c: [row.get(c) for row in self.rows] for c in self.column_names}

    def to_dataset(self) -> Any:
        import datasets

        return datasets.Dataset.from_dict(self.columns())


def _from_rows(rows: list[dict[str, Any]], fmt: str) -> Rows:
    """JSONL records (already checked), with the format's columns only (others could clash in types)."""
    if fmt == "chat":
        for row in rows:
            row["messages"] = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
    return Rows(rows, [c for c in (*COLUMNS[fmt], "_line") if any(c in row for row in rows)])


def _saved(path: str, split: str, options: dict[str, Any], field: str) -> Any:
    import datasets

    with quiet_datasets():
        saved = datasets.load_from_disk(path, storage_options=options or None)
    if isinstance(saved, datasets.DatasetDict):
        if split not in saved:
            raise DataError(
                f"{split!r} is not a split of {path} (its splits: {', '.join(saved)})", _split_field(field)
            )
        return saved[split]
    if split != "train":
        raise DataError(
            f"{split!r}: {path} is one saved Dataset, not a DatasetDict of splits", _split_field(field)
        )
    return saved


def _split_field(field: str) -> str:
    return "data.eval_split" if field == "data.eval_path" else "data.split"


def _hub(path: str, split: str, subset: str | None, field: str) -> Any:
    """A Hub data set, through `datasets.load_dataset` (downloaded into the Hugging Face cache)."""
    import datasets

    try:
        with quiet_datasets():
            return datasets.load_dataset(path, name=subset, split=split)
    except datasets.exceptions.DatasetNotFoundError:
        raise DataError(
            f"{path}: not a local file or folder, nor a data set on the Hugging Face Hub", field
        ) from None
    except ValueError as exc:
        text = _first_line(exc)
        if "split" in text.lower():
            raise DataError(f"{split!r} is not a split of {path} ({text})", _split_field(field)) from None
        if "config" in text.lower():
            raise DataError(f"{subset!r} is not a subset of {path} ({text})", "data.subset") from None
        raise DataError(f"{path}: cannot load from the Hub ({text})", field) from None
    except Exception as exc:  # noqa: BLE001 - unreachable hub, gated data set...: one line
        raise DataError(
            f"{path}: cannot load from the Hub ({exc.__class__.__name__}: {_first_line(exc)})", field
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


def fingerprint(
    path: str, split: str, subset: str | None, storage_options: dict[str, Any] | None
) -> str | None:
    """What identifies a source's content without reading it all: sha256 of local files, ETags and sizes of
    remote ones, the commit of a hub data set. None when it cannot be told (the Hub is unreachable)."""
    if looks_like_hub_id(path):
        try:
            from huggingface_hub import HfApi

            sha = HfApi().dataset_info(path).sha
        except Exception:  # noqa: BLE001 - no cache entry then; the data is tokenised again
            return None
        return f"hub:{path}:{subset}:{split}:{sha}"
    fs, where = url_to_fs(path, **(storage_options or {}))
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    files = sorted(fs.find(where, detail=True).items()) if fs.isdir(where) else [(where, fs.info(where))]
    digest = hashlib.sha256(split.encode())
    for name, info in files:
        digest.update(name.removeprefix(where).encode())
        if "file" in protocols:
            with open(name, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
        else:
            tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("LastModified")
            digest.update(f"{str(tag).strip(chr(34))}:{info.get('size')}".encode())
    return f"{protocols[0]}:{digest.hexdigest()}"


def held_out_split(spec: Any, rows: int) -> tuple[list[int], list[int]]:
    """(training rows, held-out rows) of data.path: the last data.eval_examples, or a data.eval_fraction
    chosen at random with a fixed seed (the same rows for the same data); training keeps the file's order."""
    import numpy as np

    held = 0
    if spec.eval_examples:
        held = spec.eval_examples
        if held >= rows:
            raise DataError(
                f"{held} leaves no training examples ({spec.path} has {rows})", "data.eval_examples"
            )
        return list(range(rows - held)), list(range(rows - held, rows))
    if spec.eval_fraction is not None:
        held = round(spec.eval_fraction * rows)
        if held < 1 or held >= rows:
            raise DataError(
                f"{spec.eval_fraction} of {rows} examples is {held}: it must leave at least one to hold "
                "out and one to train on",
                "data.eval_fraction",
            )
        chosen = np.random.default_rng(0).permutation(rows)[:held]
        mask = np.zeros(rows, dtype=bool)
        mask[chosen] = True
        return np.flatnonzero(~mask).tolist(), np.flatnonzero(mask).tolist()
    return list(range(rows)), []

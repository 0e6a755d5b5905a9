"""The run store: one folder per run on any fsspec filesystem. No torch here.

Layout under `run_uri` (= `<checkpoint.uri>/<run_id>`):

    spec.json                       the resolved job spec (written once at launch)
    progress.json                   the latest progress snapshot (rewritten every few seconds)
    metrics/<attempt>-<part>.jsonl  the metric history, one row per logged step
    checkpoints/step-00000020/      one folder per checkpoint; MANIFEST.json is written last
    output/                         the final adapter (or HF model), unless output.uri says otherwise

A checkpoint exists only once its MANIFEST.json (files, sizes, sha256) is there and parses; readers
verify the files against it before trusting them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import fsspec
from fsspec.core import url_to_fs
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from trainer.faults import maybe_die

MANIFEST = "MANIFEST.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "step-"
PROGRESS = "progress.json"
SPEC = "spec.json"
METRICS = "metrics"
OUTPUT = "output"
LOGS = "logs"

T = TypeVar("T")


class StoreError(RuntimeError):
    """The store failed in a way retrying did not fix."""


class CorruptCheckpoint(StoreError):
    """A checkpoint's files do not match its manifest."""


_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: network trouble, throttling, server errors. Not: missing, denied, full."""
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    name = type(exc).__name__
    text = str(exc)
    transient_names = (
        "ClientConnectorError",
        "ServerDisconnectedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ClientOSError",
        "ClientPayloadError",
        "IncompleteReadError",
        "ResponseStreamingError",
    )
    if name in transient_names:
        return True
    markers = (
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "503",
        "500",
        "RequestTimeout",
        "Throttl",
        "Connection reset",
        "Please reduce your request rate",
    )
    return isinstance(exc, OSError) and any(m in text for m in markers)


def _retrying(max_seconds: float) -> Callable[[Callable[..., T]], Callable[..., T]]:
    return retry(
        retry=retry_if_exception(is_transient),
        wait=wait_random_exponential(multiplier=0.2, max=10.0),
        stop=stop_after_attempt(8) | stop_after_delay(max_seconds),
        reraise=True,
    )


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def step_of(name: str) -> int | None:
    base = name.rstrip("/").rsplit("/", 1)[-1]
    if not base.startswith(CHECKPOINT_PREFIX):
        return None
    try:
        return int(base[len(CHECKPOINT_PREFIX) :])
    except ValueError:
        return None


@dataclass
class CheckpointInfo:
    step: int
    path: str
    created_at: float
    files: dict[str, dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files.values())


class RunStore:
    """A run's folder on an fsspec filesystem, with retried operations and manifest-last checkpoints."""

    def __init__(
        self, run_uri: str, storage_options: dict[str, Any] | None = None, retry_seconds: float = 120.0
    ) -> None:
        self.run_uri = run_uri.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = url_to_fs(self.run_uri, **self.storage_options)
        self.root = self.root.rstrip("/")
        self._retry = _retrying(retry_seconds)
        self.is_local = "file" in _protocols(self.fs)

    # ---- paths ---------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.root, *[p.strip("/") for p in parts if p]])

    def uri(self, *parts: str) -> str:
        return "/".join([self.run_uri, *[p.strip("/") for p in parts if p]])

    # ---- primitive operations, retried ---------------------------------------------------------
    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._retry(fn)(*args, **kwargs)

    def write_bytes(self, rel: str, data: bytes, atomic: bool = True) -> None:
        """Write one object. On a local disk, through a temporary file and a rename (atomic)."""
        target = self.path(rel)
        if self.is_local:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
            try:
                with open(tmp, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    if atomic:
                        os.fsync(handle.fileno())
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            if atomic:
                _fsync_dir(os.path.dirname(target))
            return
        self._call(self.fs.pipe_file, target, data)

    def read_bytes(self, rel: str) -> bytes:
        return self._call(self.fs.cat_file, self.path(rel))

    def exists(self, rel: str) -> bool:
        return self._call(self.fs.exists, self.path(rel))

    def write_json(self, rel: str, payload: Any, atomic: bool = True) -> None:
        self.write_bytes(rel, json.dumps(payload, indent=1, sort_keys=True).encode(), atomic=atomic)

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_bytes(rel))

    def read_json_or_none(self, rel: str) -> Any:
        try:
            return self.read_json(rel)
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return None

    def listdir(self, rel: str) -> list[str]:
        """Names (not paths) directly under `rel`; empty if it does not exist."""
        try:
            entries = self._call(self.fs.ls, self.path(rel), detail=False, refresh=True)
        except FileNotFoundError:
            return []
        except TypeError:  # filesystems without `refresh`
            entries = self._call(self.fs.ls, self.path(rel), detail=False)
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def remove_tree(self, rel: str) -> None:
        target = self.path(rel)
        try:
            self._call(self.fs.rm, target, recursive=True)
        except FileNotFoundError:
            pass

    def remove_file(self, rel: str) -> None:
        try:
            self._call(self.fs.rm_file, self.path(rel))
        except FileNotFoundError:
            pass

    # ---- checkpoints ---------------------------------------------------------------------------
    def commit_checkpoint(
        self, step: int, blobs: dict[str, bytes], meta: dict[str, Any] | None = None
    ) -> str:
        """Write a checkpoint's files, then its manifest. Returns the checkpoint's folder name."""
        name = checkpoint_name(step)
        folder = f"{CHECKPOINTS}/{name}"
        # a leftover of an earlier, interrupted write of the same step is not trusted: start clean
        self.remove_file(f"{folder}/{MANIFEST}")
        files: dict[str, dict[str, Any]] = {}
        for rel, data in blobs.items():
            self.write_bytes(f"{folder}/{rel}", data, atomic=False)
            files[rel] = {"size": len(data), "sha256": sha256_bytes(data)}
            maybe_die("checkpoint-partial", step)
        maybe_die("before-manifest", step)
        if self.is_local:
            _fsync_tree(self.path(folder))
        manifest = {"format": 1, "step": step, "created_at": time.time(), "files": files, "meta": meta or {}}
        self.write_json(f"{folder}/{MANIFEST}", manifest)
        return name

    def _manifest(self, name: str) -> CheckpointInfo | None:
        manifest = self.read_json_or_none(f"{CHECKPOINTS}/{name}/{MANIFEST}")
        step = step_of(name)
        if not isinstance(manifest, dict) or step is None or manifest.get("step") != step:
            return None
        files = manifest.get("files")
        if not isinstance(files, dict) or not files:
            return None
        return CheckpointInfo(
            step=step,
            path=f"{CHECKPOINTS}/{name}",
            created_at=float(manifest["created_at"]),
            files=files,
            meta=manifest.get("meta") or {},
        )

    def checkpoint_names(self) -> list[str]:
        names = [n for n in self.listdir(CHECKPOINTS) if step_of(n) is not None]
        return sorted(names, key=lambda n: step_of(n) or 0)

    def complete_checkpoints(self) -> list[CheckpointInfo]:
        """Checkpoints with a readable manifest, oldest first (files not verified yet)."""
        found = [self._manifest(n) for n in self.checkpoint_names()]
        return [c for c in found if c is not None]

    def read_checkpoint(self, info: CheckpointInfo) -> dict[str, bytes]:
        """All files of a checkpoint, verified against its manifest (size and sha256)."""
        blobs: dict[str, bytes] = {}
        for rel, expected in info.files.items():
            try:
                data = self.read_bytes(f"{info.path}/{rel}")
            except FileNotFoundError:
                raise CorruptCheckpoint(f"{info.path}/{rel} is missing") from None
            if len(data) != int(expected["size"]) or sha256_bytes(data) != expected["sha256"]:
                raise CorruptCheckpoint(f"{info.path}/{rel} does not match its manifest")
            blobs[rel] = data
        return blobs

    def newest_valid_checkpoint(
        self, on_skip: Callable[[CheckpointInfo | str, str], None] | None = None
    ) -> tuple[CheckpointInfo, dict[str, bytes]] | None:
        """The newest checkpoint whose files verify; corrupt or incomplete ones are skipped."""
        complete = {c.path.rsplit("/", 1)[-1]: c for c in self.complete_checkpoints()}
        for name in reversed(self.checkpoint_names()):
            info = complete.get(name)
            if info is None:
                if on_skip:
                    on_skip(name, "incomplete (no manifest)")
                continue
            try:
                return info, self.read_checkpoint(info)
            except CorruptCheckpoint as exc:
                if on_skip:
                    on_skip(info, str(exc))
        return None

    def prune_checkpoints(self, keep: int, protect_above: int | None = None) -> list[str]:
        """Keep the newest `keep` complete checkpoints; delete older ones and incomplete leftovers.

        The manifest goes first, so a checkpoint that is half deleted is never taken for complete.
        Incomplete folders newer than the newest complete one are left alone (a save may be running).
        """
        names = self.checkpoint_names()
        complete = [c.path.rsplit("/", 1)[-1] for c in self.complete_checkpoints()]
        doomed = complete[:-keep] if keep > 0 else complete
        newest_complete = step_of(complete[-1]) if complete else None
        leftovers = [
            n
            for n in names
            if n not in complete and newest_complete is not None and (step_of(n) or 0) < newest_complete
        ]
        removed = []
        for name in [*doomed, *leftovers]:
            if protect_above is not None and (step_of(name) or 0) > protect_above:
                continue
            self.remove_file(f"{CHECKPOINTS}/{name}/{MANIFEST}")
            self.remove_tree(f"{CHECKPOINTS}/{name}")
            removed.append(name)
        return removed

    # ---- progress and metrics ------------------------------------------------------------------
    def write_progress(self, progress: dict[str, Any]) -> None:
        self.write_json(PROGRESS, progress, atomic=False)

    def read_progress(self) -> dict[str, Any] | None:
        return self.read_json_or_none(PROGRESS)

    def write_metrics_part(self, attempt: int, part: int, rows: Iterable[dict[str, Any]]) -> None:
        body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
        self.write_bytes(f"{METRICS}/{attempt:04d}-{part:04d}.jsonl", body.encode(), atomic=False)

    def read_metrics(self) -> list[dict[str, Any]]:
        """The metric history across attempts; for a step logged by several attempts, the latest wins."""
        by_step: dict[int, dict[str, Any]] = {}
        for name in self.listdir(METRICS):
            if not name.endswith(".jsonl"):
                continue
            try:
                text = self.read_bytes(f"{METRICS}/{name}").decode()
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("step"), int):
                    by_step[row["step"]] = row
        return [by_step[s] for s in sorted(by_step)]

    # ---- spec ----------------------------------------------------------------------------------
    def write_spec(self, spec: dict[str, Any]) -> None:
        self.write_json(SPEC, spec)

    def read_spec(self) -> dict[str, Any]:
        return self.read_json(SPEC)


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(dirpath)


def join_uri(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])

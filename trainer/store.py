"""The run store: one folder per run on any fsspec filesystem. No torch here.

Layout under `run_uri` (= `<checkpoint.uri>/<run_id>`):

    spec.json                       the resolved job spec (written once at launch)
    progress.json                   the latest progress snapshot (rewritten every few seconds)
    metrics/<attempt>-<part>.jsonl  the metric history, one row per logged step
    checkpoints/step-00000020/      one folder per checkpoint; MANIFEST.json is written last
        e00000003/<files>           the files, in a folder of the epoch that wrote them (fenced attempts)
    fence/epoch-00000003.json       one object per attempt that claimed the run (created conditionally)
    cache/                          derived data that later attempts reuse (the tokenised data set)
    output/                         the final adapter (or HF model), unless output.uri says otherwise

A checkpoint exists only once its MANIFEST.json (files, sizes, sha256) is there and parses; readers
verify the files against it before trusting them.

Fencing: an attempt claims the next epoch with a conditional create (If-None-Match on S3, O_EXCL on a
local disk). Before every commit, prune and progress write it checks that no newer epoch exists, and
raises `Fenced` if one does. Its files go under its own epoch folder and the manifest is created
conditionally, so even a write racing past the check can neither overwrite a newer attempt's files nor
replace its manifest; deletions re-read the manifest and never touch a newer epoch's checkpoint.
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

from trainer.faults import maybe_die, maybe_disk_full
from trainer.runfiles import checked_progress

MANIFEST = "MANIFEST.json"
FENCE = "fence"
EPOCH_PREFIX = "epoch-"
CACHE = "cache"
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


class Fenced(StoreError):
    """A newer attempt claimed this run: this attempt must stop writing."""


class StoreUnavailable(StoreError):
    """The store kept failing for longer than the outage bound."""


def is_exists_error(exc: BaseException) -> bool:
    """A failed conditional create: FileExistsError (AWS, moto), OSError(EINVAL) 412 (SeaweedFS)."""
    if isinstance(exc, FileExistsError):
        return True
    text = str(exc)
    return isinstance(exc, OSError) and (
        "PreconditionFailed" in text or "pre-conditions you specified did not hold" in text
    )


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
    epoch: int = 0
    dir: str = ""

    @property
    def size_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files.values())


class RunStore:
    """A run's folder on an fsspec filesystem, with retried operations and manifest-last checkpoints."""

    def __init__(
        self,
        run_uri: str,
        storage_options: dict[str, Any] | None = None,
        retry_seconds: float | None = None,
    ) -> None:
        if retry_seconds is None:
            retry_seconds = float(os.environ.get("FTORCH_STORE_RETRY_S", "120"))
        self.run_uri = run_uri.rstrip("/")
        self.epoch = 0  # 0: not fenced (tools, tests); the trainer claims one with claim_epoch()
        self.fenced_by: int | None = None
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

    def write_bytes(self, rel: str, data: bytes, atomic: bool = True, create: bool = False) -> None:
        """Write one object. On a local disk, through a temporary file and a rename (atomic).

        `create=True` writes only if nothing is there yet (S3 If-None-Match, a hard link locally) and
        raises FileExistsError otherwise.
        """
        target = self.path(rel)
        if self.is_local:
            _makedirs_private(os.path.dirname(target))
            self._guard(target)
            tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
            try:
                # owner-only, whatever the umask: a run store holds weights and the resolved job
                with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    if atomic or create:
                        os.fsync(handle.fileno())
                if create:
                    os.link(tmp, target)  # atomic, and fails if the target exists
                else:
                    os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            if atomic or create:
                _fsync_dir(os.path.dirname(target))
            return
        if not create:
            self._call(self.fs.pipe_file, target, data)
            return
        try:
            self._call(self.fs.pipe_file, target, data, mode="create")
        except OSError as exc:
            if is_exists_error(exc):
                raise FileExistsError(f"{target} exists") from None
            raise

    def write_many(self, blobs: dict[str, bytes]) -> None:
        """Write several objects; on object stores concurrently (one request each, retried together)."""
        if self.is_local or len(blobs) < 2:
            for rel, data in blobs.items():
                self.write_bytes(rel, data, atomic=False)
            return
        self._call(self.fs.pipe, {self.path(rel): data for rel, data in blobs.items()})

    def read_bytes(self, rel: str) -> bytes:
        self._guard(self.path(rel))
        return self._call(self.fs.cat_file, self.path(rel))

    def _guard(self, target: str) -> None:
        """A local path that a link leads out of the run store is refused: never read, written or deleted."""
        if not self.is_local:
            return
        base = os.path.realpath(self.root)
        real = os.path.realpath(target)
        if real != base and not real.startswith(base + os.sep):
            raise StoreError(f"{target} leads outside the run store {self.root} (a link); not following it")

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
        if self.is_local and os.path.islink(target):
            os.unlink(target)  # the link only, never what it points to
            return
        self._guard(target)
        try:
            self._call(self.fs.rm, target, recursive=True)
        except FileNotFoundError:
            pass

    def remove_file(self, rel: str) -> None:
        self._guard(self.path(rel))
        try:
            self._call(self.fs.rm_file, self.path(rel))
        except FileNotFoundError:
            pass

    # ---- fencing ------------------------------------------------------------------------------
    def epochs(self) -> list[int]:
        found = []
        for name in self.listdir(FENCE):
            stem = name.removeprefix(EPOCH_PREFIX).removesuffix(".json")
            if name.startswith(EPOCH_PREFIX) and stem.isdigit():
                found.append(int(stem))
        return sorted(found)

    def epoch_records(self) -> dict[int, dict[str, Any]]:
        return {n: self.read_json_or_none(_epoch_rel(n)) or {} for n in self.epochs()}

    def claim_epoch(self, record: dict[str, Any] | None = None) -> int:
        """Claim the next epoch of this run for this attempt (a conditional create: one winner)."""
        candidate = (self.epochs() or [0])[-1] + 1
        while True:
            payload = {"epoch": candidate, "claimed_at": time.time(), **(record or {})}
            try:
                self.write_bytes(_epoch_rel(candidate), json.dumps(payload).encode(), create=True)
            except FileExistsError:
                candidate = max(candidate + 1, (self.epochs() or [0])[-1] + 1)
                continue
            self.epoch = candidate
            return candidate

    def update_epoch_record(self, **fields: Any) -> None:
        """Add to this attempt's own epoch record (e.g. how it ended). Best effort."""
        if not self.epoch:
            return
        try:
            record = self.read_json_or_none(_epoch_rel(self.epoch)) or {}
            self.write_json(_epoch_rel(self.epoch), {**record, **fields}, atomic=False)
        except Exception:  # advisory
            pass

    def check_fence(self) -> None:
        """Raise Fenced if a newer attempt claimed the run (sticky once seen)."""
        if not self.epoch:
            return
        if self.fenced_by is None:
            newest = (self.epochs() or [0])[-1]
            if newest > self.epoch:
                self.fenced_by = newest
        if self.fenced_by is not None:
            raise Fenced(
                f"attempt epoch {self.epoch} was replaced by epoch {self.fenced_by} of the same run; "
                "this attempt stops without writing"
            )

    # ---- checkpoints ---------------------------------------------------------------------------
    def commit_checkpoint(
        self, step: int, blobs: dict[str, bytes], meta: dict[str, Any] | None = None
    ) -> str:
        """Write a checkpoint's files, then its manifest. Returns the checkpoint's folder name.

        The files go to this epoch's own folder; the manifest is created only if none is there, or
        replaces one written by this or an older epoch (never a newer one's).
        """
        self.check_fence()
        name = checkpoint_name(step)
        folder = f"{CHECKPOINTS}/{name}"
        sub = _epoch_dir(self.epoch)
        files: dict[str, dict[str, Any]] = {
            rel: {"size": len(data), "sha256": sha256_bytes(data)} for rel, data in blobs.items()
        }
        if _POINTS_ACTIVE():
            for rel, data in blobs.items():  # one at a time, so a kill can land between files
                self.write_bytes(_join(folder, sub, rel), data, atomic=False)
                maybe_die("checkpoint-partial", step)
                maybe_disk_full("store-full", step)
        else:
            self.write_many({_join(folder, sub, rel): data for rel, data in blobs.items()})
        maybe_die("before-manifest", step)
        if self.is_local:
            _fsync_tree(self.path(folder))
        manifest = {
            "format": 2,
            "step": step,
            "epoch": self.epoch,
            "dir": sub,
            "created_at": time.time(),
            "files": files,
            "meta": meta or {},
        }
        self.check_fence()
        body = json.dumps(manifest, indent=1, sort_keys=True).encode()
        rel = f"{folder}/{MANIFEST}"
        try:
            self.write_bytes(rel, body, create=True)
        except FileExistsError:
            existing = self.read_json_or_none(rel)
            theirs = int(existing.get("epoch") or 0) if isinstance(existing, dict) else 0
            if theirs > self.epoch:
                self.fenced_by = theirs
                raise Fenced(
                    f"{folder} was committed by epoch {theirs}; epoch {self.epoch} does not replace it"
                ) from None
            # ours or older (e.g. a corrupt one the resume skipped): replace it
            self.remove_file(rel)
            self.write_bytes(rel, body, create=True)
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
            epoch=int(manifest.get("epoch") or 0),
            dir=str(manifest.get("dir") or ""),
        )

    def checkpoint_names(self) -> list[str]:
        names = [n for n in self.listdir(CHECKPOINTS) if step_of(n) is not None]
        if self.is_local:  # a linked folder is not part of this run store
            names = [n for n in names if not os.path.islink(self.path(CHECKPOINTS, n))]
        return sorted(names, key=lambda n: step_of(n) or 0)

    def linked_checkpoint_names(self) -> list[str]:
        """Step folders that are links (local stores): never followed; pruning removes the link."""
        if not self.is_local:
            return []
        return [n for n in self.listdir(CHECKPOINTS) if os.path.islink(self.path(CHECKPOINTS, n))]

    def complete_checkpoints(self) -> list[CheckpointInfo]:
        """Checkpoints with a readable manifest, oldest first (files not verified yet)."""
        found = [self._manifest(n) for n in self.checkpoint_names()]
        return [c for c in found if c is not None]

    def read_checkpoint(self, info: CheckpointInfo) -> dict[str, bytes]:
        """All files of a checkpoint, verified against its manifest (size and sha256)."""
        blobs: dict[str, bytes] = {}
        for rel, expected in info.files.items():
            where = _join(info.path, info.dir, rel)
            try:
                data = self.read_bytes(where)
            except FileNotFoundError:
                raise CorruptCheckpoint(f"{where} is missing") from None
            if len(data) != int(expected["size"]) or sha256_bytes(data) != expected["sha256"]:
                raise CorruptCheckpoint(f"{where} does not match its manifest")
            blobs[rel] = data
        return blobs

    def newest_valid_checkpoint(
        self,
        on_skip: Callable[[CheckpointInfo | str, str], None] | None = None,
        decode: Callable[[dict[str, bytes]], Any] | None = None,
    ) -> tuple[CheckpointInfo, Any] | None:
        """The newest checkpoint whose files verify; corrupt or incomplete ones are skipped.

        With `decode`, (info, decode(files)): a checkpoint whose decode raises CorruptCheckpoint is
        skipped the same way (e.g. one that cannot be loaded safely)."""
        complete = {c.path.rsplit("/", 1)[-1]: c for c in self.complete_checkpoints()}
        for name in reversed(self.checkpoint_names()):
            info = complete.get(name)
            if info is None:
                if on_skip:
                    on_skip(name, "incomplete (no manifest)")
                continue
            try:
                blobs = self.read_checkpoint(info)
                return info, (decode(blobs) if decode else blobs)
            except CorruptCheckpoint as exc:
                if on_skip:
                    on_skip(info, str(exc))
        return None

    def remove_partial_checkpoints(self) -> list[str]:
        """At the start of an attempt: delete the files older epochs left in step folders without a
        manifest (a kill or a full disk mid-save). Only epochs older than this one's are touched, so a
        save of a newer attempt is never disturbed; on a full disk this is what frees the space."""
        self.check_fence()
        if not self.epoch:
            return []
        removed = []
        for name in self.checkpoint_names():
            if self._manifest(name) is not None:
                continue
            folder = f"{CHECKPOINTS}/{name}"
            entries = self.listdir(folder)
            older = [e for e in entries if e.startswith("e") and e[1:].isdigit() and int(e[1:]) < self.epoch]
            for entry in older:
                self.remove_tree(f"{folder}/{entry}")
            if older and self._manifest(name) is None:
                removed.append(name)
                if len(older) == len(entries):
                    self.remove_tree(folder)
        return removed

    def prune_checkpoints(self, keep: int, protect_above: int | None = None) -> list[str]:
        """Keep the newest `keep` complete checkpoints; delete older ones and incomplete leftovers.

        The manifest goes first, so a checkpoint that is half deleted is never taken for complete.
        Incomplete folders newer than the newest complete one are left alone (a save may be running).
        A fenced attempt deletes nothing, and a checkpoint of a newer epoch is never deleted.
        """
        self.check_fence()
        names = self.checkpoint_names()
        complete = self.complete_checkpoints()
        complete_names = [c.path.rsplit("/", 1)[-1] for c in complete]
        doomed = complete_names[:-keep] if keep > 0 else complete_names
        newest_complete = complete[-1].step if complete else None
        leftovers = [
            n
            for n in names
            if n not in complete_names and newest_complete is not None and (step_of(n) or 0) < newest_complete
        ]
        removed = []
        for name in self.linked_checkpoint_names():
            self.remove_tree(f"{CHECKPOINTS}/{name}")
            removed.append(name)
        for name in [*doomed, *leftovers]:
            if protect_above is not None and (step_of(name) or 0) > protect_above:
                continue
            current = self._manifest(name)  # read again right before deleting
            if current is not None and current.epoch > self.epoch:
                continue
            if name in leftovers and current is not None:
                continue  # it became complete meanwhile
            self.remove_file(f"{CHECKPOINTS}/{name}/{MANIFEST}")
            self.remove_tree(f"{CHECKPOINTS}/{name}")
            removed.append(name)
        return removed

    # ---- progress and metrics ------------------------------------------------------------------
    def write_progress(self, progress: dict[str, Any]) -> None:
        self.check_fence()
        self.write_json(PROGRESS, progress, atomic=False)

    def read_progress(self) -> dict[str, Any] | None:
        """The progress snapshot, or None when there is none or it does not check out (runfiles)."""
        return checked_progress(self.read_json_or_none(PROGRESS))

    def write_metrics_part(self, attempt: int, part: int, rows: Iterable[dict[str, Any]]) -> None:
        self.check_fence()
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
                if (
                    isinstance(row, dict)
                    and isinstance(row.get("step"), int)
                    and isinstance(row.get("loss"), (int, float, type(None)))
                ):
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


def _makedirs_private(path: str) -> None:
    """Create `path` and any missing parents owner-only (0700); existing folders are left as they are."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        _makedirs_private(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


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


def _epoch_rel(epoch: int) -> str:
    return f"{FENCE}/{EPOCH_PREFIX}{epoch:08d}.json"


def _epoch_dir(epoch: int) -> str:
    """Where an epoch's checkpoint files go inside the step folder ('' for unfenced writers)."""
    return f"e{epoch:08d}" if epoch else ""


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p)


def _POINTS_ACTIVE() -> bool:  # noqa: N802 - reads like the constant it stands for
    return bool(os.environ.get("FTORCH_FAULTS"))


def join_uri(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


def preflight(uri: str, storage_options: dict[str, Any] | None = None, budget_s: float = 8.0) -> None:
    """Write, read back and delete a probe object under `uri`; StoreError with one clear line if not.

    Catches what would otherwise surface an hour into a run: no such bucket, access denied, a wrong
    endpoint, a read-only location.
    """
    options = dict(storage_options or {})
    probe_name = f".ftorch-preflight-{uuid.uuid4().hex[:12]}"
    try:
        fs, _root = url_to_fs(uri, **options)
        if "s3" in _protocols(fs) or "s3a" in _protocols(fs):
            # fewer retries inside botocore: a wrong endpoint answers in seconds, not minutes
            config = {"connect_timeout": 3, "read_timeout": 10, "retries": {"max_attempts": 2}}
            options["config_kwargs"] = {**config, **options.get("config_kwargs", {})}
        store = RunStore(uri, options, retry_seconds=budget_s)
        payload = uuid.uuid4().hex.encode()
        store.write_bytes(probe_name, payload, atomic=False)
        if store.read_bytes(probe_name) != payload:
            raise StoreError("the probe object read back differs from what was written")
        store.remove_file(probe_name)
    except StoreError as exc:
        raise StoreError(f"{uri}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line for the user
        raise StoreError(f"{uri}: {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    """A short reason for a store failure, without a traceback."""
    text = " ".join(str(exc).split()) or exc.__class__.__name__
    if isinstance(exc, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        return (
            f"access denied ({text}); check that the bucket exists and that the credentials in the "
            "environment may write there"
        )
    if "NoSuchBucket" in text or (isinstance(exc, FileNotFoundError) and "bucket" in text.lower()):
        return f"no such bucket ({text})"
    if "Could not connect" in text or isinstance(exc, ConnectionError) or "EndpointConnection" in text:
        return f"cannot reach the store ({text}); check the endpoint (AWS_ENDPOINT_URL or storage_options)"
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EROFS, errno.EACCES):
        return f"cannot write ({text})"
    return f"{exc.__class__.__name__}: {text}"

"""A folder on any fsspec filesystem (a local path, s3://, gs://): file access with bounded retries.

What the run store stands on, and nothing about runs: every operation is retried on transient errors
(network trouble, throttling, server errors; tenacity, jittered exponential backoff within a time
bound), local writes go through a temporary file, fsync and a rename (atomic), `create=True` writes only
where nothing is yet (S3 If-None-Match, a hard link locally), local files and folders are owner-only,
and a local path that a link leads out of the folder is never read, written or deleted.
`preflight` probes a location once, before a run depends on it. No torch here.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import uuid
from collections.abc import Callable
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

from trainer.runstore import finite_json

T = TypeVar("T")


class StoreError(RuntimeError):
    """The store failed in a way retrying did not fix."""


class LinkRefused(StoreError):
    """A local path that a link leads out of the folder it must stay in: never followed."""


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


class Storage:
    """A folder on an fsspec filesystem; every operation retried within `retry_seconds`."""

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, Any] | None = None,
        retry_seconds: float | None = None,
        within: str | None = None,
    ) -> None:
        """`within`: a local folder that links must not lead out of (default: this folder itself); e.g.
        the run store for an `output/` inside it, so that a linked `output/` is refused."""
        if retry_seconds is None:
            retry_seconds = float(os.environ.get("FTORCH_STORE_RETRY_S", "120"))
        self.root_uri = uri.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = url_to_fs(self.root_uri, **self.storage_options)
        self.root = self.root.rstrip("/")
        self._retry = _retrying(retry_seconds)
        self.is_local = "file" in _protocols(self.fs)
        self.within = within

    # ---- paths ---------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.root, *[p.strip("/") for p in parts if p]])

    def uri(self, *parts: str) -> str:
        return "/".join([self.root_uri, *[p.strip("/") for p in parts if p]])

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
            self._guard(target)  # before any folder is made: never through a link
            _makedirs_private(os.path.dirname(target))
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
                fsync_dir(os.path.dirname(target))
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
        self._forget(self.path(rel))
        return self._call(self.fs.cat_file, self.path(rel))

    def _forget(self, target: str) -> None:
        """Drop what the filesystem object remembers of `target` (s3fs/gcsfs keep listings, shared by every
        store of this process): another process (the trainer) writes these files, so a listing taken before
        a file existed would answer "not found" for it."""
        forget = getattr(self.fs, "invalidate_cache", None)
        if forget is not None and not self.is_local:
            forget(target)

    def _guard(self, target: str) -> None:
        """A local path that a link leads out of the run store is refused: never read, written or deleted."""
        if not self.is_local:
            return
        folder = self.within or self.root
        base = os.path.realpath(folder)
        real = os.path.realpath(target)
        if real != base and not real.startswith(base + os.sep):
            raise LinkRefused(f"{target} leads outside the run store {folder} (a link); not following it")

    def exists(self, rel: str) -> bool:
        self._forget(self.path(rel))
        return self._call(self.fs.exists, self.path(rel))

    def write_json(self, rel: str, payload: Any, atomic: bool = True) -> None:
        body = finite_json.dumps(payload, indent=1, sort_keys=True)  # NaN/inf as null with a flag
        self.write_bytes(rel, body.encode(), atomic=atomic)

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

    def sync_tree(self, rel: str) -> None:
        """On a local disk, flush every file under `rel` and the folders themselves (else nothing)."""
        if self.is_local:
            _fsync_tree(self.path(rel))

    def remove_file(self, rel: str) -> None:
        self._guard(self.path(rel))
        try:
            self._call(self.fs.rm_file, self.path(rel))
        except FileNotFoundError:
            pass


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


def fsync_dir(path: str) -> None:
    """fsync a folder, so that a rename or a new file in it survives a power loss (best effort)."""
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
        fsync_dir(dirpath)


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
        store = Storage(uri, options, retry_seconds=budget_s)
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

"""Checkpoint saves that cost the training as little as possible.

Training blocks only while the state is copied off the training tensors into host memory
(`checkpoint.snapshot`). A background thread serialises it, optionally stages it on local disk
(FTORCH_STAGING_DIR), uploads it (manifest last) and prunes old checkpoints. At most one upload is in
flight: a save that comes due while one is still running is skipped (training goes on). `wait()` lets
a preemption notice finish the upload in flight before it writes the final checkpoint.

Failures: a fenced attempt (`Fenced`) and a full staging disk (`StagingError`) stop the trainer at
its next step boundary. Any other store failure is retried (the store's bounded, jittered backoff);
if it still fails, training goes on and the next checkpoint tries again, until the store has been
failing for longer than FTORCH_STORE_OUTAGE_S (default 900 s): then `StoreUnavailable`. The last good
checkpoint is never touched by a failed save (old ones are pruned only after a new one is committed).
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from trainer.checkpoints.checkpoint import (
    SaveResult,
    Snapshot,
    StagingError,
    TrainerState,
    serialize,
    snapshot,
)
from trainer.faults import maybe_crash
from trainer.health.rules import manifest_meta as health_meta
from trainer.runstore.progress import debug
from trainer.runstore.storage import StoreUnavailable
from trainer.runstore.store import Fenced, RunStore, checkpoint_name


class AsyncCheckpointer:
    """Snapshot on the training thread, upload in one background thread (a `CheckpointWriter`)."""

    def __init__(
        self,
        store: RunStore,
        keep: int,
        log: Callable[[str], None],
        meta: dict[str, Any] | None = None,
        asynchronous: bool = True,
        staging_dir: str | None = None,
        outage_s: float | None = None,
    ) -> None:
        self.store = store
        self.keep = keep
        self.log = log
        #: the steps whose "saved" line is logged (the Checkpointer chooses); None: every step's
        self.loud_steps: set[int] | None = None
        #: the manifest's `meta` (checkpointer.manifest_meta: fingerprint, versions, attempt), handed to
        #: `RunStore.commit_checkpoint` with each checkpoint
        self.meta = dict(meta or {})
        self.asynchronous = asynchronous
        self.staging_dir = staging_dir if staging_dir is not None else os.environ.get("FTORCH_STAGING_DIR")
        self.outage_s = (
            float(os.environ.get("FTORCH_STORE_OUTAGE_S", "900")) if outage_s is None else outage_s
        )
        self.durable_step: int | None = None
        self.failing_since: float | None = None
        self.last: SaveResult | None = None
        self._thread: threading.Thread | None = None
        self._fatal: BaseException | None = None
        self._lock = threading.Lock()

    # ---- the training thread -------------------------------------------------------------------
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll(self) -> None:
        """Raise what the background upload found fatal (fenced, staging disk full, outage too long)."""
        with self._lock:
            fatal = self._fatal
        if fatal is not None:
            raise fatal
        if self.failing_since is not None and time.time() - self.failing_since > self.outage_s:
            raise StoreUnavailable(
                f"the run store {self.store.run_uri} has failed every checkpoint for "
                f"{time.time() - self.failing_since:.0f}s (bound: FTORCH_STORE_OUTAGE_S={self.outage_s:.0f}); "
                f"the last good checkpoint is {self.last_good()}"
            )

    def save(
        self, model: Any, optimizer: Any, scheduler: Any, state: TrainerState, wait: bool = False
    ) -> SaveResult | None:
        """Start a checkpoint of `state`. Returns None (skipped) if an upload is still in flight."""
        self.poll()
        if self.busy() and not wait:
            self.log(f"checkpoint at step {state.step} skipped: the previous upload is still in flight")
            return None
        self.wait()
        started = time.perf_counter()
        snap = snapshot(model, optimizer, scheduler, state)
        meta = {**self.meta, **health_meta(state.health)}  # this state's: whether it is healthy
        result = SaveResult(step=state.step, blocking_s=time.perf_counter() - started, nbytes=snap.nbytes)
        if not self.asynchronous or wait:
            self._upload(snap, result, meta)
            self.poll()
            return result
        self._thread = threading.Thread(
            target=self._upload, args=(snap, result, meta), daemon=True, name="ckpt-upload"
        )
        self._thread.start()
        return result

    def wait(self) -> None:
        """Let the upload in flight finish (a notice, the end of the run)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.poll()

    # ---- the upload thread ---------------------------------------------------------------------
    def _upload(self, snap: Snapshot, result: SaveResult, meta: dict[str, Any]) -> None:
        started = time.perf_counter()
        name = checkpoint_name(snap.step)
        try:
            blobs = self._stage(snap)
            maybe_crash("upload-crash", snap.step)
            self.store.commit_checkpoint(snap.step, blobs, meta=meta)
            result.upload_s = time.perf_counter() - started
            self.durable_step = snap.step
            self.failing_since = None
            try:
                self.store.prune_checkpoints(self.keep)
            except Fenced:
                raise
            except Exception as exc:  # noqa: BLE001 - pruning is housekeeping; the next save retries it
                self.log(f"pruning old checkpoints failed ({exc.__class__.__name__}: {exc}); will retry")
            size = sum(len(b) for b in blobs.values())
            loud = self.loud_steps is None or snap.step in self.loud_steps
            (self.log if loud else debug)(f"checkpoint {snap.step} saved ({_size(size)})")
            if self.loud_steps is not None:
                self.loud_steps.discard(snap.step)
            debug(
                f"checkpoint {name}: training blocked {result.blocking_s * 1000:.0f} ms, "
                f"upload {result.upload_s * 1000:.0f} ms, {size} bytes"
            )
        except (Fenced, StagingError) as exc:
            result.error = exc
            with self._lock:
                self._fatal = exc
        except Exception as exc:  # noqa: BLE001 - kept; training goes on and the next save retries
            result.error = exc
            if self.failing_since is None:
                self.failing_since = time.time()
            self.log(
                f"checkpoint {name} NOT saved ({exc.__class__.__name__}: {' '.join(str(exc).split())[:300]}); "
                f"training goes on and the next checkpoint retries; the last good checkpoint is "
                f"{self.last_good()}"
            )
        finally:
            self.last = result

    def _stage(self, snap: Snapshot) -> dict[str, bytes]:
        """Serialise the snapshot; with a staging folder, through local files (disk, not memory, holds it)."""
        blobs = serialize(snap)
        if not self.staging_dir:
            return blobs
        folder = os.path.join(self.staging_dir, f"ftorch-stage-{os.getpid()}-{checkpoint_name(snap.step)}")
        try:
            os.makedirs(folder, exist_ok=True)
            _maybe_disk_full(snap.step)
            for rel, data in blobs.items():
                with open(os.path.join(folder, rel), "wb") as handle:
                    handle.write(data)
            del blobs
            staged: dict[str, bytes] = {}
            for rel in sorted(os.listdir(folder)):
                with open(os.path.join(folder, rel), "rb") as handle:
                    staged[rel] = handle.read()
            return staged
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
                raise StagingError(
                    f"cannot stage checkpoint {checkpoint_name(snap.step)} in {self.staging_dir}: "
                    f"{os.strerror(exc.errno)} (it needs about {snap.nbytes / 2**20:.1f} MiB); "
                    f"the last good checkpoint {self.last_good()} is intact"
                ) from None
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def last_good(self) -> str:
        if self.durable_step is not None:
            return checkpoint_name(self.durable_step)
        return "the newest one in the store (none from this attempt)"


def _maybe_disk_full(step: int) -> None:
    """FTORCH_FAULTS=disk-full@N: the staging disk is full at step N (tests)."""
    try:
        maybe_crash("disk-full", step)
    except Exception:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from None


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"

"""When the training loop checkpoints, and what a failed save means for the attempt.

The policy (`Checkpointer`): a checkpoint is due every N steps, every D seconds, or, for
`checkpoint.every: auto`, after the Young/Daly interval (`trainer.checkpoints.interval`); the loop also
saves on a preemption notice and at the end of the run (`save(wait=True)`, then `finish()`).

The writing goes through a `CheckpointWriter`: `AsyncCheckpointer` for one process (a snapshot, then a
background upload) or `ShardedWriter` for several ranks (DCP). The loop picks one; the policy does not
know which. Under several ranks the decision is agreed (`agree`: any rank due -> every rank saves).

Failures that must end the attempt become exit codes (`stop_for`): a fenced attempt -> FENCED, a store
outage beyond its bound -> STORE_UNAVAILABLE, a full staging disk -> ERROR. No torch here.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from trainer import exitcodes
from trainer.checkpoints.interval import AutoInterval, History
from trainer.config import JobSpec
from trainer.runstore.progress import debug, log
from trainer.runstore.storage import StoreUnavailable
from trainer.runstore.store import Fenced, RunStore, checkpoint_name


class StagingError(RuntimeError):
    """The local staging disk could not take the checkpoint (full, read-only)."""


@dataclass
class SaveResult:
    """One save: how long training blocked for it and, once it is written, how long the upload took."""

    step: int
    blocking_s: float
    upload_s: float = 0.0
    nbytes: int = 0
    error: BaseException | None = None


class CheckpointWriter(Protocol):
    """Writes checkpoints of the training state into the run store (one process, or sharded)."""

    #: the newest step whose checkpoint is committed (manifest written), or None
    durable_step: int | None
    #: the newest save whose upload has finished (its `upload_s` is measured), or None
    last: SaveResult | None

    def poll(self) -> None:
        """At a step boundary: finish background work that is done; raise what it found fatal."""

    def save(
        self, model: Any, optimizer: Any, scheduler: Any, state: Any, wait: bool = False
    ) -> SaveResult | None:
        """Start a checkpoint of `state` (all of it when `wait`); None when the save was skipped."""

    def wait(self) -> None:
        """Finish the save in flight (committed, or its error raised)."""

    def last_good(self) -> str:
        """The newest checkpoint known to be good, in words (for error messages)."""


class Checkpointer:
    """The loop's checkpoint policy over a writer: `due`, `save`, `poll`, `finish`."""

    def __init__(
        self,
        store: RunStore,
        spec: JobSpec,
        writer: CheckpointWriter,
        last_step: int,
        agree: Callable[[bool], bool] | None = None,
    ) -> None:
        self.store = store
        self.spec = spec
        self.writer = writer
        self.agree = agree or (lambda value: value)
        self.last_step = last_step
        self.last_time = time.time()
        writer.durable_step = last_step if last_step > 0 else None
        self.auto = AutoInterval(history=History.from_epochs(store.epoch_records(), store.epoch, time.time()))
        self.interval_s: float | None = None
        self._uploaded = writer.last

    @property
    def durable_step(self) -> int | None:
        return self.writer.durable_step

    def due(self, step: int, now: float) -> bool:
        """Whether to save after `step` (agreed by every rank). Finishes background work first."""
        self.poll()
        return self.agree(self._due(step, now))

    def _due(self, step: int, now: float) -> bool:
        every_steps = self.spec.checkpoint.every_steps()
        if every_steps is not None:
            return step % every_steps == 0
        interval = self.spec.checkpoint.every_seconds()
        if interval is None:
            interval = self._auto_interval()
        return now - self.last_time >= interval

    def _auto_interval(self) -> float:
        interval, why = self.auto.choose()
        if self.interval_s is None:  # the first choice; later re-estimates only at debug level
            log(f"checkpoint every {interval:.0f} s (auto; FTORCH_LOG_LEVEL=debug says why)")
        if self.interval_s is None or abs(interval - self.interval_s) > 0.2 * self.interval_s:
            debug(f"checkpoint interval (auto) {why}")
        self.interval_s = interval
        return interval

    def poll(self) -> None:
        try:
            self.writer.poll()
        except BaseException as exc:  # noqa: BLE001 - mapped to an exit code
            stop_for(exc)
        self._observe_upload()

    def save(self, model: Any, optimizer: Any, scheduler: Any, state: Any, wait: bool = False) -> None:
        """Checkpoint this step (`wait`: until it is committed)."""
        try:
            result = self.writer.save(model, optimizer, scheduler, state, wait=wait)
            if wait:
                self.writer.wait()
        except BaseException as exc:  # noqa: BLE001 - mapped to an exit code
            stop_for(exc)
        if result is None:
            return
        self.last_step = state.step
        self.last_time = time.time()
        self.auto.observe(result.blocking_s, self.auto.upload_s)
        self._observe_upload()

    def _observe_upload(self) -> None:
        """The newest finished upload's time feeds the auto interval (it is never below 2 uploads)."""
        done = self.writer.last
        if done is not None and done is not self._uploaded:
            self._uploaded = done
            self.auto.upload_s = done.upload_s

    def finish(self) -> None:
        """Wait for the upload in flight; fail the attempt if its checkpoint is not durable."""
        try:
            self.writer.wait()
            if self.writer.durable_step != self.last_step and self.last_step > 0:
                error = self.writer.last.error if self.writer.last is not None else None
                raise StoreUnavailable(
                    f"checkpoint {checkpoint_name(self.last_step)} could not be saved{_cause(error)}; "
                    f"the last good checkpoint is {self.writer.last_good()}"
                )
        except BaseException as exc:  # noqa: BLE001 - mapped to an exit code
            stop_for(exc)


def _cause(error: BaseException | None) -> str:
    """Why a save failed, for the one line the supervisor shows: a full disk is named as such."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f": the run store's disk is full ({errno.errorcode[error.errno]}); free space, then resume"
    if error is not None:
        return f" ({error.__class__.__name__}: {' '.join(str(error).split())[:200]})"
    return ""


def stop_for(exc: BaseException) -> None:
    """Fenced -> FENCED, store outage -> STORE_UNAVAILABLE, full staging disk -> ERROR; else re-raise."""
    if isinstance(exc, Fenced):
        log(f"fenced: {exc}")
        raise SystemExit(exitcodes.FENCED) from None
    if isinstance(exc, StoreUnavailable):
        log(f"error: {exc}" if "disk is full" in str(exc) else f"error: store unavailable: {exc}")
        raise SystemExit(exitcodes.STORE_UNAVAILABLE) from None
    if isinstance(exc, StagingError):
        log(f"error: {exc}")
        raise SystemExit(exitcodes.ERROR) from None
    raise exc

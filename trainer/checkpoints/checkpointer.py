"""The trainer's one checkpoint object (`Checkpointer`): what it reads at the start, when it saves, how,
and what a failed save means for the attempt.

Built from (parallelism, store, spec, and the start's checked fingerprint and versions, `start_meta`, which
its writers record in every manifest), it alone knows which kind of checkpoint is read and written:
sharded DCP checkpoints from every rank (`sharded_checkpoint`) when the run is sharded, else whole ones
from one process (`async_checkpoint`: a snapshot, then a background upload); FTORCH_ASYNC_CHECKPOINT=0
makes either synchronous. The loop calls

- `load_newest` and `clean_up` at the start, on the one listing of the store this start takes
  (`RunStore.list_checkpoints`, rank 0's shared with the other ranks);
- `due` and `save` at step boundaries: every N steps, every D seconds, or for `checkpoint.every: auto`
  the Young/Daly interval (`trainer.stops.interval`); under several ranks the decision is agreed
  (any rank due -> every rank saves);
- `save(wait=True)` and `wait` on a preemption notice and at the end of the run.

Before every save it calls `before_save` (the loop adds the metrics rows' and the trackers' flushes): the
records up to the checkpoint's step reach the store before its manifest, so a resume from it neither loses
nor repeats them.

Failures that must end the attempt become exit codes (`stop_for`): a fenced attempt -> FENCED, a store
outage beyond its bound -> STORE_UNAVAILABLE, a full staging disk -> ERROR.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import Any

from trainer import exitcodes
from trainer.checkpoints.async_save import AsyncCheckpointer
from trainer.checkpoints.checkpoint import (
    CheckpointWriter,
    StagingError,
    TrainerState,
    decode_or_corrupt,
    restore,
)
from trainer.checkpoints.sharded import ShardedWriter
from trainer.checkpoints.sharded import load_newest as load_newest_sharded
from trainer.config import JobSpec
from trainer.distributed import Parallel, Sharded
from trainer.faults import maybe_slow
from trainer.runstore.progress import debug, log
from trainer.runstore.storage import StoreUnavailable
from trainer.runstore.store import (
    CheckpointInfo,
    CheckpointListing,
    Fenced,
    RunStore,
    checkpoint_name,
    healthy_listing,
)
from trainer.stops.interval import AutoInterval, History


def manifest_meta(attempt: int, start_meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """What every checkpoint's manifest records about the run in its `meta`: what the start checked
    (`start_meta`: the spec fingerprint and the library versions) and the attempt (a writer adds the
    state's health, and a sharded one its kind, world size and files, beside them)."""
    return {**(start_meta or {}), "attempt": attempt}


def async_saves() -> bool:
    """Saves go on in the background unless FTORCH_ASYNC_CHECKPOINT=0."""
    return os.environ.get("FTORCH_ASYNC_CHECKPOINT", "1") != "0"


class Checkpointer:
    """The loop's checkpoints: `load_newest`, `clean_up`, `due`, `save`, `poll`, `wait`."""

    def __init__(
        self,
        par: Parallel,
        store: RunStore,
        spec: JobSpec,
        attempt: int = 1,
        listing: CheckpointListing | None = None,
        writer: CheckpointWriter | None = None,
        start_meta: dict[str, Any] | None = None,
    ) -> None:
        self.par = par
        self.store = store
        self.spec = spec
        self.attempt = attempt
        #: what this start checked (trainer/loop.py `_check_unchanged`: the spec fingerprint and the
        #: library versions), recorded in every checkpoint manifest its writers commit
        self.start_meta = dict(start_meta or {})
        self._listing = par.share(listing)  # every rank works from rank 0's listing
        self.writer = writer if writer is not None else self._make_writer()
        self.agree = par.any
        self.last_step = 0
        self.last_time = time.time()
        #: the checkpoint `load_newest` resumed from
        self.resumed_from: CheckpointInfo | None = None
        self.auto = AutoInterval(history=History.from_epochs(store.epoch_records(), store.epoch, time.time()))
        self.interval_s: float | None = None
        # "checkpoint N saved" at info level for the first save, a save that ends the attempt and the first
        # after the interval changes; the rest at debug (they were most of a run's log)
        self._loud_next = True
        self._told_interval: float | None = None
        if hasattr(self.writer, "loud_steps"):
            self.writer.loud_steps = set()
        self._uploaded = self.writer.last
        #: called before each save: what must be in the store before the checkpoint's manifest
        self.before_save: list[Callable[[], None]] = []

    def _make_writer(self) -> CheckpointWriter:
        """DCP shards from every rank, or one process's files (snapshot, then a background upload)."""
        meta = manifest_meta(self.attempt, self.start_meta)
        if isinstance(self.par, Sharded):
            return ShardedWriter(self.store, self.spec, self.par, meta, async_saves=async_saves())
        return AsyncCheckpointer(self.store, self.spec.checkpoint.keep, log, meta, asynchronous=async_saves())

    @property
    def listing(self) -> CheckpointListing:
        """The store's checkpoints as listed at this start (listed here if none was given)."""
        if self._listing is None:
            self._listing = self.store.list_checkpoints()
        return self._listing

    @property
    def durable_step(self) -> int | None:
        return self.writer.durable_step

    # ---- the start ---------------------------------------------------------------------------------
    def load_newest(self, model: Any, optimizer: Any, scheduler: Any) -> TrainerState | None:
        """Load the newest checkpoint this world can read into model, optimizer and scheduler; None if
        there is none. Damaged, incomplete and unloadable ones are skipped (logged)."""
        listing = healthy_listing(self.listing, log)  # train.health: an unhealthy one is never resumed
        planned = _job_hyperparameters(optimizer, scheduler)  # the job's, before a checkpoint's replace them
        if isinstance(self.par, Sharded):  # sharded (DCP) or single-process ones, resharded onto these ranks
            args = (self.store, self.spec, self.par, model, optimizer, scheduler)
            loaded = load_newest_sharded(*args, on_skip=_skipped, listing=listing)
        else:
            found = self.store.newest_valid_checkpoint(_skipped, decode_or_corrupt, listing=listing)
            loaded = found and (found[0], restore(found[1], model, optimizer, scheduler))
        if not loaded:
            return None
        _keep_job_hyperparameters(planned, optimizer, scheduler)
        self.resumed_from, state = loaded
        self.last_step = state.step
        self.writer.durable_step = state.step if state.step > 0 else None
        self.last_time = time.time()
        return state

    def load_newest_healthy(self, model: Any, optimizer: Any, scheduler: Any) -> TrainerState | None:
        """A rollback (trainer/health/guard.py): the store listed again, the newest healthy checkpoint
        loaded (the upload in flight first); None when there is none."""
        self.wait()
        self._listing = self.par.share(self.store.list_checkpoints() if self.par.is_main else None)
        return self.load_newest(model, optimizer, scheduler)

    def newest_healthy_step(self) -> int | None:
        """The step of the newest complete healthy checkpoint in the store (rank 0; None on the others)."""
        if not self.par.is_main:
            return None
        healthy = self.store.list_checkpoints().newest_healthy
        return healthy.step if healthy is not None else None

    def clean_up(self) -> None:
        """Rank 0 at the start: remove what earlier attempts left half-written; keep `checkpoint.keep`."""
        if not self.par.is_main:
            return
        partial = self.store.remove_partial_checkpoints(self.listing)
        if partial:
            log(f"removed incomplete checkpoint(s) left by earlier attempts: {', '.join(partial)}")
        self.store.prune_checkpoints(self.spec.checkpoint.keep, listing=self.listing)

    # ---- during training ---------------------------------------------------------------------------
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
        told = self._told_interval
        if told is None:
            log(f"checkpoint every {interval:.0f} s (auto; FTORCH_LOG_LEVEL=debug says why)")
        elif abs(interval - told) > 0.2 * told:  # the log's figure stays the interval in use
            log(f"checkpoint every {interval:.0f} s now (auto, from the measured save and upload times)")
        if told is None or abs(interval - told) > 0.2 * told:
            debug(f"checkpoint interval (auto) {why}")
            self._told_interval = interval
            self._loud_next = True
        self.interval_s = interval
        return interval

    def poll(self) -> None:
        try:
            self.writer.poll()
        except BaseException as exc:  # noqa: BLE001 - mapped to an exit code
            stop_for(exc)
        self._observe_upload()

    def save(self, model: Any, optimizer: Any, scheduler: Any, state: Any, wait: bool = False) -> None:
        """Checkpoint this step (`wait`: until it is committed), after the records up to it."""
        for flush in self.before_save:
            flush()
        maybe_slow("slow-save")  # FTORCH_FAULTS=slow-save@MS (tests: a slow store on demand)
        loud = getattr(self.writer, "loud_steps", None)
        if loud is not None and (wait or self._loud_next):
            loud.add(state.step)
            self._loud_next = False
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

    def wait(self) -> None:
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


def _skipped(what: CheckpointInfo | str, why: str) -> None:
    name = what if isinstance(what, str) else what.path
    log(f"not using checkpoint {name}: {why}")


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


#: the optimizer settings a job sets (trainer/optim/build.py) that a checkpoint's param groups also hold
_GROUP_SETTINGS = ("weight_decay", "momentum", "betas", "eps")


def _job_hyperparameters(optimizer: Any, scheduler: Any) -> tuple[list[float], list[dict[str, Any]]]:
    """The freshly built optimizer's and schedule's settings: the job's as it is now."""
    groups = [{k: g[k] for k in _GROUP_SETTINGS if k in g} for g in optimizer.param_groups]
    return list(getattr(scheduler, "base_lrs", [])), groups


def _keep_job_hyperparameters(
    planned: tuple[list[float], list[dict[str, Any]]], optimizer: Any, scheduler: Any
) -> None:
    """A checkpoint restores its optimizer's param groups and its schedule's base learning rates with its
    state, so a `ftorch resume --set train.lr=... --allow-change` (or train.weight_decay) would resume at
    the old figures while saying it changed them: the job's own are put back, the schedule's position kept.
    Unchanged settings (every resume but an allowed change) are left alone, so exact resume holds."""
    base_lrs, groups = planned
    for group, settings in zip(optimizer.param_groups, groups, strict=False):
        for key, value in settings.items():
            if group.get(key) != value:
                group[key] = value
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if not base_lrs or list(scheduler.base_lrs) == base_lrs or lambdas is None:
        return
    scheduler.base_lrs = list(base_lrs)
    lrs = [base * factor(scheduler.last_epoch) for factor, base in zip(lambdas, base_lrs, strict=True)]
    for group, base, lr in zip(optimizer.param_groups, base_lrs, lrs, strict=False):
        group["initial_lr"], group["lr"] = base, lr
    scheduler._last_lr = lrs

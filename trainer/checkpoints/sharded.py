"""Sharded checkpoints: torch.distributed.checkpoint (DCP) into the run store through fsspec.

A sharded checkpoint is the run store's usual step folder:

    checkpoints/step-00000020/[e<epoch>/]  .metadata, __<rank>_<n>.distcp    DCP: model + optimizer shards
                                           trainer_state.json               step, data position, scheduler
                                           rng-rank-00000.json ...          each rank's RNG streams
                                           MANIFEST.json (one level up)     written last, by rank 0

Every rank writes its DCP shards (FsspecWriter: local paths, s3://, ...); after they are all written
rank 0 commits the small files and the manifest through `RunStore.commit_checkpoint`, so "complete only
when the manifest is there" holds as for single-process checkpoints. The manifest's `meta` says
`kind: dcp`, the world size, and the DCP files with their sizes (checked on load; the small files carry
sha256 like any checkpoint file). Only trainable state is saved (LoRA: the adapters and their optimizer
state; the frozen base comes from the model again).

Saves are asynchronous (`dcp.async_save` on a gloo group of its own, at most one in flight): the state
is copied to host memory at the step boundary, written in a background thread, and committed by rank 0
at a later step boundary (or at `wait`). Loading reshards: DCP maps the saved shards onto however many
ranks load them. A single-process checkpoint is loaded into a sharded model too (1 -> N).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from trainer.checkpoints import dcp_io
from trainer.checkpoints.checkpoint import (
    OPTIMIZER,
    STATE,
    WEIGHTS,
    SaveResult,
    TrainerState,
    decode_or_corrupt,
)
from trainer.checkpoints.rng import RngState
from trainer.config import JobSpec
from trainer.distributed import Sharded, seed_rank
from trainer.health.rules import manifest_meta as health_meta
from trainer.runstore.progress import debug, log
from trainer.runstore.store import (
    CheckpointInfo,
    CheckpointListing,
    CorruptCheckpoint,
    RunStore,
    checkpoint_name,
)

KIND = "dcp"
DCP_METADATA = dcp_io.DCP_METADATA


def rank_file(rank: int) -> str:
    return f"rng-rank-{rank:05d}.json"


def is_sharded(info: CheckpointInfo | None) -> bool:
    return info is not None and info.meta.get("kind") == KIND


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p)


def _epoch_dir(epoch: int) -> str:
    """Where this attempt's files go inside a step folder (mirrors RunStore.commit_checkpoint)."""
    return f"e{epoch:08d}" if epoch else ""


def _options(spec: JobSpec, **extra: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=spec.method != "full", **extra)


@dataclass
class _Pending:
    step: int
    future: Future
    blobs: dict[str, bytes]
    meta: dict[str, Any]
    started: float
    stager: Any
    result: SaveResult
    committed: bool = False


class ShardedWriter:
    """The `CheckpointWriter` of sharded runs: every rank writes its DCP shards, rank 0 commits.

    All ranks call `save`/`wait`/`poll` at the same step boundaries (the policy's decision is agreed).
    """

    def __init__(
        self,
        store: RunStore,
        spec: JobSpec,
        par: Sharded,
        meta: dict[str, Any] | None = None,
        async_saves: bool = True,
    ) -> None:
        self.store = store
        self.spec = spec
        self.par = par
        #: the manifest's `meta` (checkpointer.manifest_meta: fingerprint, versions, attempt); the DCP kind,
        #: world and files are added here, and rank 0 hands it to `RunStore.commit_checkpoint`
        self.meta = dict(meta or {})
        self.async_saves = async_saves
        self.pending: _Pending | None = None
        #: the newest committed step (rank 0 knows it first; the others after `wait`)
        self.durable_step: int | None = None
        #: the newest committed save (rank 0), with its measured upload time
        self.last: SaveResult | None = None
        #: the steps whose "saved" line is logged (the Checkpointer chooses); None: every step's
        self.loud_steps: set[int] | None = None

    def poll(self) -> None:
        """Rank 0 commits a finished background save at the next step boundary."""
        pending = self.pending
        if pending is not None and pending.future.done() and pending.future.exception() is None:
            self._commit(pending)

    def last_good(self) -> str:
        if self.durable_step is not None:
            return checkpoint_name(self.durable_step)
        return "the newest one in the store (none from this attempt)"

    # ---- saving --------------------------------------------------------------------------------
    def save(
        self, model: torch.nn.Module, optimizer: Any, scheduler: Any, state: TrainerState, wait: bool = False
    ) -> SaveResult:
        """Start writing a checkpoint of this step (all ranks); the result says how long it blocked."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
        from torch.distributed.checkpoint.state_dict import get_state_dict

        started = time.time()
        self.wait()  # at most one save in flight
        step = state.step
        result = SaveResult(step=step, blocking_s=0.0)
        folder = _join("checkpoints", checkpoint_name(step), _epoch_dir(self.par.epoch))
        rngs = self._gather(RngState.capture(every_device=False).to_json())
        blobs: dict[str, bytes] = {}
        if self.par.is_main:
            saved = {**state.to_json(), "scheduler": scheduler.state_dict(), "world_size": self.par.world}
            blobs[STATE] = json.dumps(saved).encode()
            for rank, rng in enumerate(rngs):
                blobs[rank_file(rank)] = json.dumps(rng).encode()
        model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(self.spec))
        writer = FsspecWriter(self.store.uri(folder), **self.store.storage_options)
        meta = {**self.meta, "kind": KIND, "world_size": self.par.world, **health_meta(state.health)}
        payload = {"model": model_sd, "optim": optim_sd}
        if self.async_saves and not wait:
            staging = _plain_staging()
            future = dcp.async_save(
                payload, storage_writer=writer, process_group=self.par.io_group, **staging
            )
            self.pending = _Pending(step, future, blobs, meta, started, staging.get("async_stager"), result)
        else:
            dcp.save(payload, storage_writer=writer, process_group=self.par.io_group)
            self.pending = _Pending(step, _done(), blobs, meta, started, None, result)
            self.wait()
        result.blocking_s = time.time() - started
        return result

    def wait(self) -> None:
        """Finish the save in flight (all ranks) and commit it (rank 0)."""
        pending = self.pending
        if pending is None:
            return
        error: BaseException | None = None
        try:
            pending.future.result()
        except BaseException as exc:  # noqa: BLE001 - reported once every rank has finished
            error = exc
        finally:
            if pending.stager is not None:
                pending.stager.close()
        self.pending = None
        if self.par.any(error is not None):
            raise RuntimeError(f"sharded checkpoint of step {pending.step} failed: {error}") from error
        self._commit(pending)
        self.par.barrier()  # the manifest is there before any rank goes on (or exits)
        self.durable_step = pending.step

    def _commit(self, pending: _Pending) -> None:
        if not self.par.is_main or pending.committed:
            return
        pending.committed = True
        meta = {**pending.meta, "dcp_files": self._dcp_files(pending.step)}
        self.store.commit_checkpoint(pending.step, pending.blobs, meta=meta)
        self.store.prune_checkpoints(self.spec.checkpoint.keep)
        elapsed = time.time() - pending.started
        self.durable_step = pending.step
        pending.result.upload_s = elapsed
        self.last = pending.result
        size = sum(meta["dcp_files"].values()) + sum(len(b) for b in pending.blobs.values())
        loud = self.loud_steps is None or pending.step in self.loud_steps
        (log if loud else debug)(
            f"checkpoint {pending.step} saved ({size / 1024:.0f} KiB, sharded over {self.par.world} ranks)"
        )
        if self.loud_steps is not None:
            self.loud_steps.discard(pending.step)
        debug(f"checkpoint {checkpoint_name(pending.step)}: {elapsed * 1000:.0f} ms from save to commit")

    def _dcp_files(self, step: int) -> dict[str, int]:
        folder = _join("checkpoints", checkpoint_name(step), _epoch_dir(self.par.epoch))
        entries = self.store.fs.ls(self.store.path(folder), detail=True)
        files = {
            e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
            for e in entries
            if e.get("type") != "directory"
        }
        return {n: s for n, s in files.items() if n == DCP_METADATA or n.endswith(".distcp")}

    def _gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.par.world
        self.par.dist.all_gather_object(out, obj)
        return out


def load_newest(
    store: RunStore,
    spec: JobSpec,
    par: Sharded,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    on_skip: Callable[[CheckpointInfo | str, str], None] | None = None,
    listing: CheckpointListing | None = None,
) -> tuple[CheckpointInfo, TrainerState] | None:
    """Load the newest checkpoint every rank can read, sharded (any world size) or single-process."""
    loader = _Loader(store, spec, par, model, optimizer, scheduler)
    return store.newest_good(loader.load, on_skip if par.is_main else None, agree=par.any, listing=listing)


@dataclass
class _Loader:
    store: RunStore
    spec: JobSpec
    par: Sharded
    model: torch.nn.Module
    optimizer: Any
    scheduler: Any

    def load(self, info: CheckpointInfo) -> TrainerState:
        """One checkpoint into the model; any failure is a CorruptCheckpoint (the next older is tried)."""
        try:
            if is_sharded(info):
                return self._load_sharded(info, self.model, self.optimizer, self.scheduler)
            return self._load_single(info, self.model, self.optimizer, self.scheduler)
        except CorruptCheckpoint:  # damaged, or refused by safe loading (one line)
            raise
        except Exception as exc:  # noqa: BLE001
            raise CorruptCheckpoint(f"{exc.__class__.__name__}: {exc}") from None

    def _load_sharded(
        self, info: CheckpointInfo, model: torch.nn.Module, optimizer: Any, scheduler: Any
    ) -> TrainerState:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        data_dir = dcp_io.data_dir(self.store, info)  # sizes as in the manifest
        blobs = self.store.read_checkpoint(info)  # the small files, verified (sha256)
        saved = json.loads(blobs[STATE])
        options = _options(self.spec, strict=self.spec.method == "full")
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        payload = {"model": model_sd, "optim": optim_sd}
        dcp_io.load(self.store, data_dir, payload, process_group=self.par.io_group)  # safe unpickling
        set_state_dict(
            model,
            optimizer,
            model_state_dict=payload["model"],
            optim_state_dict=payload["optim"],
            options=options,
        )
        scheduler.load_state_dict(saved["scheduler"])
        same_world = int(saved.get("world_size") or 0) == self.par.world
        if same_world and rank_file(self.par.rank) in blobs:
            RngState.from_json(json.loads(blobs[rank_file(self.par.rank)])).restore()
        else:  # resharded: rank r's old stream does not exist; start a fresh one for this point
            seed_rank(self.spec.train.seed, self.par.rank, int(saved["step"]))
            if self.par.is_main:
                log(f"resharding: saved by {saved.get('world_size')} ranks, resumed by {self.par.world}")
        return TrainerState.from_json(saved)

    def _load_single(
        self, info: CheckpointInfo, model: torch.nn.Module, optimizer: Any, scheduler: Any
    ) -> TrainerState:
        """A single-process checkpoint into the sharded model: every rank takes its slice."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        from trainer.model.load import trainable_parameters

        blobs = self.store.read_checkpoint(info)
        if WEIGHTS not in blobs or OPTIMIZER not in blobs:
            raise CorruptCheckpoint(f"{info.path}: neither a sharded nor a single-process checkpoint")

        def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            if isinstance(like, DTensor) and full.dim() > 0:
                return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
            return full

        decoded = decode_or_corrupt(blobs)  # parsed safely (weights_only), nothing applied yet
        weights = decoded.weights
        params = trainable_parameters(model)
        if set(params) != set(weights):
            raise CorruptCheckpoint(f"{info.path}: the checkpoint's weights do not fit the model")
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(shard_like(weights[name].to(param.dtype), param))
        states = decoded.states
        ordered = [p for p in model.parameters() if p.requires_grad]
        optim = states["optimizer"]
        optim["state"] = {
            index: {k: shard_like(v, ordered[int(index)]) for k, v in slot.items()}
            for index, slot in optim["state"].items()
        }
        optimizer.load_state_dict(optim)
        scheduler.load_state_dict(states["scheduler"])
        state = TrainerState.from_json(decoded.saved)
        seed_rank(self.spec.train.seed, self.par.rank, state.step)
        if self.par.is_main:
            log(f"resharding: a single-process checkpoint resumed by {self.par.world} ranks")
        return state


def _done() -> Future:
    future: Future = Future()
    future.set_result(None)
    return future


def _plain_staging() -> dict[str, Any]:
    """async_save's staging as a plain blocking copy to CPU (no pinned or shared memory, no background
    copy). torch >= 2.9 takes it as a stager; torch 2.8 has no stager argument and stages exactly so."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError:  # torch 2.8
        return {}
    return {"async_stager": DefaultStager(StagingOptions(False, False, False, False))}

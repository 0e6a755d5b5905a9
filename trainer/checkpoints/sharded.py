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

import base64
import io
import json
import os
import random
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trainer.checkpoints import dcp_io
from trainer.checkpoints.checkpoint import OPTIMIZER, STATE, WEIGHTS, TrainerState
from trainer.checkpoints.checkpointer import SaveResult
from trainer.config import JobSpec
from trainer.distributed import Sharded, seed_rank
from trainer.runstore.progress import debug, log
from trainer.runstore.store import CheckpointInfo, CorruptCheckpoint, RunStore, checkpoint_name

KIND = "dcp"
TRAINER_STATE = "trainer_state.json"
DCP_METADATA = dcp_io.DCP_METADATA


def rank_file(rank: int) -> str:
    return f"rng-rank-{rank:05d}.json"


def is_sharded(info: CheckpointInfo | None) -> bool:
    return info is not None and info.meta.get("kind") == KIND


def newest_is_sharded(store: RunStore) -> bool:
    complete = store.complete_checkpoints()
    return bool(complete) and is_sharded(complete[-1])


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p)


def _epoch_dir(epoch: int) -> str:
    """Where this attempt's files go inside a step folder (mirrors RunStore.commit_checkpoint)."""
    return f"e{epoch:08d}" if epoch else ""


# ---- what each rank contributes besides its shards ------------------------------------------------
def rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch_cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    if torch.cuda.is_available():
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    raw = base64.b64decode(state["torch_cpu"])
    torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(
            torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8)
        )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


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

    def __init__(self, store: RunStore, spec: JobSpec, par: Sharded, async_saves: bool | None = None) -> None:
        self.store = store
        self.spec = spec
        self.par = par
        if async_saves is None:
            async_saves = os.environ.get("FTORCH_ASYNC_CHECKPOINT", "1") != "0"
        self.async_saves = async_saves
        self.pending: _Pending | None = None
        #: the newest committed step (rank 0 knows it first; the others after `wait`)
        self.durable_step: int | None = None
        #: the newest committed save (rank 0), with its measured upload time
        self.last: SaveResult | None = None

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
        rngs = self._gather(rng_state())
        blobs: dict[str, bytes] = {}
        if self.par.is_main:
            blobs[TRAINER_STATE] = json.dumps(
                {
                    "step": step,
                    "micro_batches": state.micro_batches,
                    "tokens_seen": state.tokens_seen,
                    "extra": state.extra,
                    "scheduler": scheduler.state_dict(),
                    "world_size": self.par.world,
                }
            ).encode()
            for rank, rng in enumerate(rngs):
                blobs[rank_file(rank)] = json.dumps(rng).encode()
        model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(self.spec))
        writer = FsspecWriter(self.store.uri(folder), **self.store.storage_options)
        meta = {"kind": KIND, "world_size": self.par.world, "attempt": state.extra.get("attempt")}
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
        log(f"checkpoint {pending.step} saved ({size / 1024:.0f} KiB, sharded over {self.par.world} ranks)")
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
    on_skip: Any = None,
) -> tuple[CheckpointInfo, TrainerState] | None:
    """Load the newest checkpoint every rank can read, sharded (any world size) or single-process."""
    return _Loader(store, spec, par).load_newest(model, optimizer, scheduler, on_skip)


@dataclass
class _Loader:
    store: RunStore
    spec: JobSpec
    par: Sharded

    def load_newest(
        self, model: torch.nn.Module, optimizer: Any, scheduler: Any, on_skip: Any = None
    ) -> tuple[CheckpointInfo, TrainerState] | None:
        """Load the newest checkpoint that every rank can read (sharded or single-process)."""
        for info in reversed(self.store.complete_checkpoints()):
            error: str | None = None
            state: TrainerState | None = None
            try:
                if is_sharded(info):
                    state = self._load_sharded(info, model, optimizer, scheduler)
                else:
                    state = self._load_single(info, model, optimizer, scheduler)
            except CorruptCheckpoint as exc:  # damaged, or refused by safe loading (one line)
                error = str(exc)
            except Exception as exc:  # noqa: BLE001 - the next older checkpoint is tried
                error = f"{exc.__class__.__name__}: {exc}"
            if self.par.any(error is not None):
                if on_skip is not None and self.par.is_main:
                    on_skip(info, error or "another rank could not read it")
                continue
            assert state is not None
            return info, state
        return None

    def _load_sharded(
        self, info: CheckpointInfo, model: torch.nn.Module, optimizer: Any, scheduler: Any
    ) -> TrainerState:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        data_dir = dcp_io.data_dir(self.store, info)  # sizes as in the manifest
        blobs = self.store.read_checkpoint(info)  # the small files, verified (sha256)
        saved = json.loads(blobs[TRAINER_STATE])
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
            set_rng_state(json.loads(blobs[rank_file(self.par.rank)]))
        else:  # resharded: rank r's old stream does not exist; start a fresh one for this point
            seed_rank(self.spec.train.seed, self.par.rank, int(saved["step"]))
            if self.par.is_main:
                log(f"resharding: saved by {saved.get('world_size')} ranks, resumed by {self.par.world}")
        return TrainerState(
            step=int(saved["step"]),
            micro_batches=int(saved["micro_batches"]),
            tokens_seen=int(saved["tokens_seen"]),
            extra=saved.get("extra") or {},
        )

    def _load_single(
        self, info: CheckpointInfo, model: torch.nn.Module, optimizer: Any, scheduler: Any
    ) -> TrainerState:
        """A single-process checkpoint into the sharded model: every rank takes its slice."""
        from safetensors.torch import load as safetensors_load
        from torch.distributed.tensor import DTensor, distribute_tensor

        from trainer.model import trainable_parameters

        blobs = self.store.read_checkpoint(info)
        if WEIGHTS not in blobs or OPTIMIZER not in blobs:
            raise CorruptCheckpoint(f"{info.path}: neither a sharded nor a single-process checkpoint")

        def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            if isinstance(like, DTensor) and full.dim() > 0:
                return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
            return full

        weights = safetensors_load(blobs[WEIGHTS])
        params = trainable_parameters(model)
        if set(params) != set(weights):
            raise CorruptCheckpoint(f"{info.path}: the checkpoint's weights do not fit the model")
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(shard_like(weights[name].to(param.dtype), param))
        states = torch.load(io.BytesIO(blobs[OPTIMIZER]), map_location="cpu", weights_only=True)
        ordered = [p for p in model.parameters() if p.requires_grad]
        optim = states["optimizer"]
        optim["state"] = {
            index: {k: shard_like(v, ordered[int(index)]) for k, v in slot.items()}
            for index, slot in optim["state"].items()
        }
        optimizer.load_state_dict(optim)
        scheduler.load_state_dict(states["scheduler"])
        saved = json.loads(blobs[STATE])
        seed_rank(self.spec.train.seed, self.par.rank, int(saved["step"]))
        if self.par.is_main:
            log(f"resharding: a single-process checkpoint resumed by {self.par.world} ranks")
        return TrainerState(
            step=int(saved["step"]),
            micro_batches=int(saved["micro_batches"]),
            tokens_seen=int(saved["tokens_seen"]),
            extra=saved.get("extra") or {},
        )


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

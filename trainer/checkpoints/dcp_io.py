"""Reading torch.distributed.checkpoint (DCP) folders safely, on any number of ranks or in one process.

DCP's own reader unpickles `.metadata` with `pickle.load`, and its default planner loads non-tensor items
(e.g. the optimizer's hyperparameters) with `torch.load(weights_only=False)`: a tampered checkpoint could
run code. Here `.metadata` goes through an unpickler that knows only DCP's metadata classes and torch's
sizes, dtypes and layouts, and non-tensor items through `torch.load(weights_only=True)` (tensors already
are). Any failure (a refused pickle, a damaged shard, a rank that could not read) becomes a one-line
CorruptCheckpoint, so a resume skips the checkpoint like any corrupt one and an export names it; no
message suggests loading unsafely.
"""

from __future__ import annotations

import io
import pickle
import warnings
from typing import Any

import torch

from trainer.runstore.store import CheckpointInfo, CorruptCheckpoint, RunStore

DCP_METADATA = ".metadata"
_DCP_CLASSES = {
    "torch.distributed.checkpoint.metadata": (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    ),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo",),
    "torch.serialization": ("_get_layout",),
    "torch": ("Size",),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Only what DCP's metadata is made of (the "restricting globals" recipe of Python's pickle docs)."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def _reader(store: RunStore, data_dir: str) -> Any:
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    class SafeReader(FsspecReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            rank = kwargs.get("rank")  # per-rank metadata files exist from torch 2.9 on; 2.8 has one
            name = DCP_METADATA if rank is None else f"__{rank}{DCP_METADATA}"
            path = self.fs.concat_path(self.path, name)
            with self.fs.create_stream(path, "rb") as handle:
                metadata = _MetadataUnpickler(handle).load()
            if not isinstance(metadata, Metadata):
                raise pickle.UnpicklingError(f"{DCP_METADATA} does not hold DCP metadata")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(store.uri(data_dir), **store.storage_options)


def _planner() -> Any:
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            loaded = torch.load(value, map_location="cpu", weights_only=True)
            fqn = read_item.dest_index.fqn
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], loaded)
            else:
                self.state_dict[fqn] = loaded

    return SafePlanner()


def reason(exc: BaseException) -> str:
    """One line for why a DCP read failed (the first failing rank's error; no unsafe-loading advice)."""
    from trainer.checkpoints.checkpoint import _refusal

    failures = getattr(exc, "failures", None)
    where = ""
    if isinstance(failures, dict) and failures:
        rank = min(failures)
        where, exc = f"rank {rank}: ", failures[rank][0]
    if isinstance(exc, pickle.UnpicklingError):
        return f"{where}{_refusal(exc)}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{where}{exc.__class__.__name__}: {lines[0][:200] if lines else ''}".rstrip(": ")


def data_dir(store: RunStore, info: CheckpointInfo) -> str:
    """The checkpoint's DCP folder, its files checked against the manifest's sizes."""
    folder = "/".join(p.strip("/") for p in (info.path, getattr(info, "dir", "")) if p)
    files = info.meta.get("dcp_files") or {}
    if DCP_METADATA not in files:
        raise CorruptCheckpoint(f"{folder}: no DCP metadata in the manifest")
    for name, size in files.items():
        try:
            found = store.fs.info(store.path(f"{folder}/{name}")).get("size")
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{folder}/{name} is missing") from None
        if int(found or 0) != int(size):
            raise CorruptCheckpoint(f"{folder}/{name}: {found} bytes, the manifest says {size}")
    return folder


def load(store: RunStore, folder: str, payload: dict[str, Any], process_group: Any = None) -> None:
    """Fill `payload` (a state dict, DTensors allowed) from the DCP folder, on every rank of the group."""
    import torch.distributed.checkpoint as dcp

    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
            dcp.load(
                payload,
                storage_reader=_reader(store, folder),
                planner=_planner(),
                process_group=process_group,
                no_dist=process_group is None and not torch.distributed.is_initialized(),
            )
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise CorruptCheckpoint(f"cannot be loaded safely: {reason(exc)}") from None


def read_tensors(store: RunStore, info: CheckpointInfo, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """Every tensor saved under `prefix` (the model's trainable state), whole, in this one process."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    folder = data_dir(store, info)
    try:
        metadata = _reader(store, folder).read_metadata()
    except Exception as exc:  # noqa: BLE001 - a damaged or refused metadata file
        raise CorruptCheckpoint(f"cannot be loaded safely: {DCP_METADATA}: {reason(exc)}") from None
    tensors = {
        key[len(prefix) :]: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
    }
    if not tensors:
        raise CorruptCheckpoint(f"{folder}: no tensors under {prefix!r}")
    load(store, folder, {prefix.rstrip("."): tensors})
    return tensors

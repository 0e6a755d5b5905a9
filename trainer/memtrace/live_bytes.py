"""Recording every storage that torch ops create and free (a TorchDispatchMode), for the traces on fake
tensors: trainer/memtrace/steptrace.py (one training step) and trainer/memtrace/loadtrace.py (loading)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Event:
    handle: int
    nbytes: int
    phase: str
    tag: str = "other"
    freed_phase: str | None = None


class LiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Records each new storage an op returns, and its release when the storage dies."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "load"
        self.stream: list[tuple[bool, int]] = []  # (is_alloc, handle) in order
        self.events: list[Event] = []
        self.handles: dict[int, int] = {}  # id(storage) -> handle, while alive
        self.param_storages: set[int] = set()
        self.autocast_cast_ops = 0

    def _free(self, key: int, handle: int) -> None:
        self.handles.pop(key, None)
        self.stream.append((False, handle))
        self.events[handle].freed_phase = self.phase

    def track(self, tensor: torch.Tensor, tag: str = "other") -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self.handles:
            return
        handle = len(self.events)
        self.events.append(Event(handle, storage.nbytes(), self.phase, tag))
        self.handles[key] = handle
        self.stream.append((True, handle))
        weakref.finalize(storage, self._free, key, handle)

    def handle_of(self, tensor: torch.Tensor) -> int | None:
        return self.handles.get(id(tensor.untyped_storage()))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.phase == "forward" and torch._C._current_graph_task_id() != -1:
            self.phase = "backward"
        if func is torch.ops.aten._local_scalar_dense.default:  # .item(): a logged number, no memory
            return False if args[0].dtype == torch.bool else 1
        out = func(*args, **(kwargs or {}))
        cast = (
            func is torch.ops.aten._to_copy.default
            and self.phase == "forward"
            and isinstance(args[0], torch.Tensor)
            and id(args[0].untyped_storage()) in self.param_storages
        )
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t, "cast" if cast else "other")
        return out

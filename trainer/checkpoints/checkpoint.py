"""What a checkpoint holds, and how it is turned into bytes and back without unpickling objects.

- `weights.safetensors`: the trainable parameters by name (LoRA adapters, or every weight for full FT)
- `optimizer.pt`: optimizer and LR-scheduler state dicts (tensors and numbers only; read back with
  `torch.load(weights_only=True)`)
- `rng.safetensors`: torch CPU and CUDA generator states
- `trainer_state.json`: step, data position, python and numpy RNG, and `TrainerState`'s named parts
  (evaluations, attempt, loss scaler, health counters)

Also the contract of the two checkpoint writers (`CheckpointWriter`, `SaveResult`, `StagingError`):
`AsyncCheckpointer` (one process) and `ShardedWriter` (DCP, several ranks); `Checkpointer` picks one.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from trainer.checkpoints.rng import RngState
from trainer.health.rules import HealthState
from trainer.model.load import trainable_parameters
from trainer.runstore.store import CorruptCheckpoint

WEIGHTS = "weights.safetensors"
OPTIMIZER = "optimizer.pt"
RNG = "rng.safetensors"
STATE = "trainer_state.json"
#: the key of `trainer_state.json` that holds the named parts, as `extra` held them before they were named
#: (`eval_before`, `eval_after`, `eval_cut_short`, `attempt`, `grad_scaler`, `health`)
EXTRA = "extra"


@dataclass
class Evals:
    """The held-out evaluations (trainer/loop.py `evaluate`: loss, exact match, examples)."""

    #: before the first step (a fresh start with held-out examples); None when not made
    before: dict[str, float] | None = None
    #: after the last step (`finish`); None until then
    after: dict[str, float] | None = None
    #: the step whose mid-run evaluation a notice cut short: the attempt resuming there makes it up first
    cut_short_at: int | None = None


@dataclass
class TrainerState:
    """Where the run is (the optimizer step, the data position in the job's micro-batches, the tokens
    seen) and the bookkeeping that travels with the checkpoint, each part named."""

    step: int
    micro_batches: int
    tokens_seen: int
    #: the held-out evaluations made so far
    evals: Evals = field(default_factory=Evals)
    #: the attempt that wrote the checkpoint (set at each attempt's start); None before
    attempt: int | None = None
    #: fp16-mixed's loss scaler state (`GradScaler.state_dict()`: scale, growth tracker); None otherwise
    scaler: dict[str, Any] | None = None
    #: train.health's counters (trainer/health/rules.py; the rollbacks name the data windows stepped
    #: over), `healthy` also covering the weights at the save; None until the health guard records them
    health: HealthState | None = None

    def to_json(self) -> dict[str, Any]:
        """The fields of `trainer_state.json` this class owns (a writer adds its own beside them). The
        named parts go under `extra`, as in checkpoints written before they were named; unset ones are
        left out."""
        parts = {
            "eval_before": self.evals.before,
            "eval_after": self.evals.after,
            "eval_cut_short": self.evals.cut_short_at,
            "attempt": self.attempt,
            "grad_scaler": self.scaler,
            "health": self.health.to_json() if self.health is not None else None,
        }
        return {
            "step": self.step,
            "micro_batches": self.micro_batches,
            "tokens_seen": self.tokens_seen,
            EXTRA: copy.deepcopy({k: v for k, v in parts.items() if v is not None}),
        }

    @classmethod
    def from_json(cls, saved: dict[str, Any]) -> TrainerState:
        """The state of a `trainer_state.json` (any checkpoint's: keys under `extra` that name no part
        are dropped)."""
        parts = saved.get(EXTRA)
        parts = parts if isinstance(parts, dict) else {}
        health = _dict(parts.get("health"))
        return cls(
            step=int(saved["step"]),
            micro_batches=int(saved["micro_batches"]),
            tokens_seen=int(saved["tokens_seen"]),
            evals=Evals(
                before=_dict(parts.get("eval_before")),
                after=_dict(parts.get("eval_after")),
                cut_short_at=_int(parts.get("eval_cut_short")),
            ),
            attempt=_int(parts.get("attempt")),
            scaler=_dict(parts.get("grad_scaler")),
            health=HealthState.from_json(health) if health is not None else None,
        )


def _dict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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


@dataclass
class Snapshot:
    """A checkpoint's state copied off the training path (host memory), not yet serialised."""

    step: int
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: dict[str, torch.Tensor]
    trainer_state: dict[str, Any]

    @property
    def nbytes(self) -> int:
        tensors = [*self.weights.values(), *_tensors(self.optimizer)]
        return sum(t.numel() * t.element_size() for t in tensors)


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return []


def _copied(tree: Any) -> Any:
    """A deep copy in which every tensor is a fresh CPU copy (so training can go on changing its own)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _copied(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copied(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_copied(v) for v in tree)
    return copy.deepcopy(tree)


def snapshot(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, state: TrainerState
) -> Snapshot:
    """Copy everything that decides the rest of the run off the training tensors: the blocking part."""
    weights = {
        name: p.detach().to("cpu", copy=True).contiguous() for name, p in trainable_parameters(model).items()
    }
    rng = RngState.capture()
    return Snapshot(
        step=state.step,
        weights=weights,
        optimizer=_copied(optimizer.state_dict()),
        scheduler=_copied(scheduler.state_dict()),
        rng=rng.tensors(),
        trainer_state={**state.to_json(), **rng.json_fields()},
    )


def serialize(snap: Snapshot) -> dict[str, bytes]:
    """A snapshot as the checkpoint's files (safe to run in a background thread)."""
    buffer = io.BytesIO()
    torch.save({"optimizer": snap.optimizer, "scheduler": snap.scheduler}, buffer)
    return {
        WEIGHTS: safetensors_save(snap.weights),
        OPTIMIZER: buffer.getvalue(),
        RNG: safetensors_save(snap.rng),
        STATE: json.dumps(snap.trainer_state).encode(),
    }


class UnloadableCheckpoint(ValueError):
    """A checkpoint whose files verify but cannot be loaded safely (e.g. refused by weights_only)."""


@dataclass
class Decoded:
    """A checkpoint's files parsed (nothing applied to the model yet)."""

    weights: dict[str, torch.Tensor]
    states: dict[str, Any]
    rng: dict[str, torch.Tensor]
    saved: dict[str, Any]


def _refusal(exc: BaseException) -> str:
    """What torch's weights_only loader refused, without its advice to load the file unsafely."""
    advice = ("weights_only", "Weights only load failed", "trusted source", "documentation", "https://")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    kept = [line for line in lines if not any(a in line for a in advice)]
    return kept[0] if kept else "it holds objects that are not plain tensors or numbers"


def decode(blobs: dict[str, bytes]) -> Decoded:
    """Parse a verified checkpoint's files; UnloadableCheckpoint (one line) if any cannot be read safely."""
    try:
        weights = safetensors_load(blobs[WEIGHTS])
        rng = safetensors_load(blobs[RNG])
        saved = json.loads(blobs[STATE])
    except Exception as exc:  # noqa: BLE001 - any unreadable file makes the checkpoint unusable
        raise UnloadableCheckpoint(f"unreadable ({exc.__class__.__name__}: {str(exc)[:200]})") from None
    try:
        states = torch.load(io.BytesIO(blobs[OPTIMIZER]), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnloadableCheckpoint(
            f"{OPTIMIZER} refused by safe (weights_only) loading: {_refusal(exc)}"
        ) from None
    except Exception as exc:  # noqa: BLE001
        raise UnloadableCheckpoint(f"{OPTIMIZER} unreadable ({exc.__class__.__name__})") from None
    if not isinstance(states, dict) or not {"optimizer", "scheduler"} <= set(states):
        raise UnloadableCheckpoint(f"{OPTIMIZER} does not hold optimizer and scheduler states")
    return Decoded(weights, states, rng, saved)


def decode_or_corrupt(blobs: dict[str, bytes]) -> Decoded:
    """`decode`, where a checkpoint that cannot be loaded safely is skipped like a damaged one."""
    try:
        return decode(blobs)
    except UnloadableCheckpoint as exc:
        raise CorruptCheckpoint(f"cannot be loaded safely: {exc}") from None


def restore(
    blobs: dict[str, bytes] | Decoded,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> TrainerState:
    """Load a verified checkpoint into the freshly built model, optimizer and scheduler.

    Everything is parsed before anything is applied, so a checkpoint that cannot be loaded leaves the
    model untouched (and the previous checkpoint can be used instead)."""
    decoded = blobs if isinstance(blobs, Decoded) else decode(blobs)
    weights = decoded.weights
    params = trainable_parameters(model)
    missing = sorted(set(params) - set(weights))
    unexpected = sorted(set(weights) - set(params))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(weights[name].to(param.device, param.dtype))
    optimizer.load_state_dict(decoded.states["optimizer"])
    scheduler.load_state_dict(decoded.states["scheduler"])
    RngState.from_whole(decoded.rng, decoded.saved).restore()
    return TrainerState.from_json(decoded.saved)

"""The spec fingerprint: which job-file settings change the math of a run, recorded with every checkpoint.

A checkpoint's manifest `meta` holds `fingerprint`: the values of the settings that decide the weights
(model, method, LoRA, seed, effective batch, LR schedule, optimizer, precision, data and its order), their
sha256, the data's identity (`trainer.data.cache.data_identity`: sha256 of local files, ETags of remote
ones, a hub set's revision) and the batch split. A resume that changes one of them would not continue the
same run: `ftorch resume --set` refuses it at the CLI, and the trainer refuses it at start (the only
place that reads the data), unless `ftorch resume --allow-change` recorded in spec.json that it is allowed
(`ALLOWED_KEY`). Everything else (budget, deadline, resources, checkpoint.every/keep, trackers, notify,
chaos, the micro-batch split of an unchanged effective batch, gradient checkpointing) stays free.

Shared by the orchestrator and the trainer: no torch, no pydantic; it reads the job as a plain dict.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: settings that change the math (dotted job-file paths); `train.effective_batch` is computed
FIELDS = (
    "model", "method",
    "lora.r", "lora.alpha", "lora.dropout", "lora.target_modules",
    "quantization.bits", "quantization.quant_type", "quantization.double_quant",
    "quantization.compute_dtype",
    "data.path", "data.split", "data.subset", "data.format", "data.max_seq_len",
    "data.packing",  # packs change the batches; `auto` is recorded resolved (trainer/data/packing.py)
    "data.train_on_inputs", "data.chat_template", "data.eval_examples", "data.eval_fraction",
    "train.effective_batch", "train.epochs", "train.max_steps", "train.lr", "train.weight_decay",
    "train.warmup_steps", "train.warmup_ratio", "train.schedule", "train.max_grad_norm", "train.seed",
    "train.precision", "train.optimizer",
    "train.optimizer_in_backward",  # one optimizer per parameter: its state and schedule differ in shape
    "train.loss", "train.kernels",  # the loss's path and fused kernels round differently (trainer/train_step/loss.py)
    "train.attn_implementation",  # attention kernels round differently; `auto` is recorded resolved
)  # fmt: skip
#: fields whose `auto` the trainer resolves on its machine (trainer/model/attention.py; data.packing:
#: trainer/train_step/packing_check.py) and records resolved: only the trainer, which knows what it
#: resolves to, compares them (the CLI skips `auto`)
RESOLVED_BY_TRAINER = ("train.attn_implementation", "data.packing")
#: settings that stay free on resume (the rest of the schema): a test checks that every field is in one
FREE = (
    "name", "data.tokens", "data.eval_path", "data.eval_split", "data.num_proc",
    "train.micro_batch_size", "train.grad_accum",  # free while their product, the effective batch, is kept
    "train.gradient_checkpointing", "train.log_every", "train.report_to",
    "train.eval_every", "train.offload", "train.health", "checkpoint", "output", "resources", "local", "notify",
)  # fmt: skip
#: spec.json's list of changes `ftorch resume --allow-change` allowed
ALLOWED_KEY = "allowed_changes"
META_KEY = "fingerprint"
ADVICE = "resuming would not continue the same run (pass --allow-change to resume anyway)"


class SpecChanged(ValueError):
    """A setting that changes the math differs from the checkpoint's; `field` names it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class DamagedRecord(ValueError):
    """The newest checkpoint's fingerprint record is there but is no record (damaged or tampered): a
    changed job cannot be told, so a resume is refused unless --allow-change takes the job as it is."""

    def __init__(self, step: int, found: Any) -> None:
        super().__init__(
            f"checkpoint step {step}: its manifest's {META_KEY} is a {type(found).__name__}, not a record"
            f" (damaged or tampered), so a changed job cannot be told; {ADVICE}"
        )
        self.step = step


@dataclass(frozen=True)
class Change:
    field: str
    before: Any
    after: Any
    step: int  # the checkpoint the change is measured against

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "from": self.before, "to": self.after, "checkpoint_step": self.step}

    def line(self) -> str:
        """'train.seed: changed from 1234 to 7 since checkpoint step 30; resuming would not ...'"""
        if self.field == "data.path" and self.before and self.after and _is_identity(self.before):
            what = f"the data changed ({_short(self.before)} -> {_short(self.after)})"
        else:
            what = f"changed from {show(self.before)} to {show(self.after)}"
        return f"{self.field}: {what} since checkpoint step {self.step}; {ADVICE}"


def _is_identity(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("identity:")


def _short(identity: str) -> str:
    return identity.removeprefix("identity:")[-16:]


def show(value: Any) -> str:
    """A value as one short piece of a line."""
    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _get(job: dict[str, Any], dotted: str) -> Any:
    node: Any = job
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def values(job: dict[str, Any]) -> dict[str, Any]:
    """The fingerprinted settings of a job (its JSON dict): LoRA only for lora/qlora, quantisation only
    for qlora (otherwise they do not act)."""
    method = job.get("method")
    out: dict[str, Any] = {}
    for name in FIELDS:
        if name.startswith("lora.") and method not in ("lora", "qlora"):
            continue
        if name.startswith("quantization.") and method != "qlora":
            continue
        if name == "train.effective_batch":
            train = job.get("train") or {}
            out[name] = int(train.get("micro_batch_size") or 1) * int(train.get("grad_accum") or 1)
        else:
            out[name] = _get(job, name)
    return out


def digest(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def record(job: dict[str, Any], data_identity: str | None) -> dict[str, Any]:
    """What every checkpoint's manifest meta holds under META_KEY."""
    fields = values(job)
    train = job.get("train") or {}
    return {
        "sha256": digest(fields),
        "fields": fields,
        "data_identity": data_identity,
        "batch_split": [train.get("micro_batch_size"), train.get("grad_accum")],
    }


def changes(
    recorded: dict[str, Any], job: dict[str, Any], step: int, identity: str | None = None
) -> list[Change]:
    """What differs between a checkpoint's record and `job` (and the data's identity, when both are
    known), in FIELDS order. An effective-batch change names the field that moved."""
    before = recorded.get("fields") or {}
    now = values(job)
    found: list[Change] = []
    for name in FIELDS:
        if name not in before and name not in now:
            continue
        old, new = before.get(name), now.get(name)
        if old == new or (name in RESOLVED_BY_TRAINER and (new == "auto" or name not in before)):
            continue  # `auto`: the trainer compares what it resolved; not in an older record: not known
        if name == "train.effective_batch":
            split = recorded.get("batch_split") or [None, None]
            train = job.get("train") or {}
            moved = "train.grad_accum" if split[1] != train.get("grad_accum") else "train.micro_batch_size"
            found.append(Change(moved, f"effective batch {old}", f"effective batch {new}", step))
            continue
        found.append(Change(name, old, new, step))
    old_id = recorded.get("data_identity")
    if identity and old_id and old_id != identity and not any(c.field == "data.path" for c in found):
        found.append(Change("data.path", f"identity:{old_id}", f"identity:{identity}", step))
    return found


def newest_record(store: Any, listing: Any = None) -> tuple[int, dict[str, Any]] | None:
    """(step, fingerprint record) of the newest checkpoint with a manifest; None when there is none.
    An old checkpoint without a record gives an empty one (nothing to compare). `listing`: the start's
    one listing of the store (trainer.runstore.store.CheckpointListing), when the caller has it."""
    info = (listing if listing is not None else store.list_checkpoints()).newest
    if info is None:
        return None
    recorded = info.meta.get(META_KEY)
    if recorded is not None and not isinstance(recorded, dict):
        raise DamagedRecord(info.step, recorded)
    return info.step, recorded or {}


def allowed(resolved: dict[str, Any], step: int) -> dict[str, Any] | None:
    """The newest allowance `ftorch resume --allow-change` recorded for a resume from checkpoint `step`
    (or a later one: a fallback to an older checkpoint is covered too)."""
    entries = [e for e in resolved.get(ALLOWED_KEY) or [] if isinstance(e, dict)]
    fitting = [e for e in entries if _whole(e.get("checkpoint_step")) >= step]
    return fitting[-1] if fitting else None


def _whole(value: Any) -> int:
    """A recorded step; 0 for anything that is not a whole number (a damaged spec.json allows nothing)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def describe_allowance(entry: dict[str, Any]) -> str:
    """An allowance in words: 'allowed change from checkpoint step 30: train.seed 1234 -> 7'."""
    changed = "; ".join(
        f"{c['field']} {show(c['from'])} -> {show(c['to'])}" for c in entry.get("changes") or []
    )
    return f"allowed change from checkpoint step {entry.get('checkpoint_step')}: " + (
        changed or "none in the job file (the data may differ)"
    )


@dataclass
class StartCheck:
    """The trainer's check at start: the meta this attempt's checkpoints carry, what it resumes from."""

    meta: dict[str, Any]
    resumed: dict[str, Any] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    #: `ftorch resume --allow-change` allowed changes for this resume
    allowed: bool = False

    def data_position(self, step: int, micro_batches: int, job: dict[str, Any], examples: int) -> int:
        """The data position (in the job's micro-batches) to resume at: the same examples when the
        effective batch is split differently. Raises SpecChanged when the new split would cut the epochs
        elsewhere (the run would see other examples)."""
        split = self.resumed.get("batch_split") or [None, None]
        train = job.get("train") or {}
        old, new = split[0], int(train.get("micro_batch_size") or 1)
        if not isinstance(old, int) or old == new:
            return micro_batches
        if examples % old != examples % new and not self.allowed:
            raise SpecChanged(
                f"train.micro_batch_size: {old} -> {new} would cut the {examples} training sequences into "
                f"epochs differently than at checkpoint step {step}; {ADVICE}",
                "train.micro_batch_size",
            )
        return micro_batches * old // new


def check_start(
    store: Any,
    resolved: dict[str, Any],
    identity: str | None,
    log: Callable[[str], None],
    listing: Any = None,
) -> StartCheck:
    """At the trainer's start: compare the job with the newest checkpoint's record. A change refuses
    the attempt (SpecChanged) unless spec.json records it was allowed; an allowed one is logged and put
    in this attempt's epoch record (rank 0)."""
    job = resolved["job"]
    check = StartCheck(meta={META_KEY: record(job, identity)})
    try:
        newest = newest_record(store, listing)
    except DamagedRecord as exc:
        if allowed(resolved, exc.step) is None:
            raise SpecChanged(str(exc), f"checkpoint step {exc.step}") from None
        log(f"{exc}: resuming as `ftorch resume --allow-change` allowed")
        check.allowed = True
        return check
    if newest is None:
        return check
    step, recorded = newest
    check.resumed = recorded
    if not recorded:
        return check
    if identity is None:
        log(
            "the data's identity cannot be told (the Hub is unreachable?): not compared with the checkpoint's"
        )
    found = changes(recorded, job, step, identity)
    check.allowed = allowed(resolved, step) is not None
    if not found:
        return check
    if not check.allowed:
        raise SpecChanged(found[0].line(), found[0].field)
    check.changes = found
    described = "; ".join(f"{c.field} {show(c.before)} -> {show(c.after)}" for c in found)
    log(
        f"resuming from checkpoint step {step} with changes allowed by `ftorch resume --allow-change`: {described}"
    )
    if int(os.environ.get("RANK", "0")) == 0:
        store.update_epoch_record(allowed_changes=[c.to_json() for c in found])
    return check

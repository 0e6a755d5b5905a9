"""`ftorch export`: a usable model from any complete checkpoint of a run.

- LoRA/QLoRA: a PEFT adapter folder (adapter_config.json, adapter_model.safetensors, tokenizer). The base
  is built with empty (meta) weights through accelerate's `init_empty_weights`: only the adapter's
  tensors are real, so exporting an adapter of a 70B model needs neither its weights nor its memory.
- `merge=True`: the base's real weights (16-bit for QLoRA: the adapter merges into the unquantized base),
  the adapter merged in (`merge_and_unload`), saved as a plain transformers model.
- full fine-tuning: the checkpoint holds every weight; they go into the base and it is saved whole.

Single-process and sharded (FSDP, DCP) checkpoints alike: a sharded one is read whole in this process
(trainer/checkpoints/dcp_io.py: only the model's tensors, with safe unpickling), whatever the number of ranks that
saved it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import torch

from trainer.checkpoints import dcp_io
from trainer.checkpoints.checkpoint import WEIGHTS
from trainer.config import JobSpec
from trainer.faults import maybe_die
from trainer.model.load import (
    base_dtype,
    hide_bitsandbytes,
    load_tokenizer,
    lora_config,
    trainable_parameters,
)
from trainer.outputs.hub_push import PushError, push_folder
from trainer.outputs.stage import publish, recover, stage_dir
from trainer.runstore import finite_json, scratch
from trainer.runstore.storage import Storage, StoreError, preflight
from trainer.runstore.store import CorruptCheckpoint, RunStore, output_store

#: written last into every export folder: what a later export may replace there
MARKER = ".ftorch-export.json"


class ExportError(Exception):
    """A one-line reason the export cannot be done (the CLI exits 2 with it)."""


def check_target(to: str, storage_options: dict[str, Any] | None = None, force: bool = False) -> list[str]:
    """Refuse, before any work, a target the export must not or cannot write: a file, a folder holding
    files that are not an earlier ftorch export (a user's README.md would be replaced; `force` allows
    it), a place that cannot be written. Returns the files an earlier export there wrote (to replace)."""
    try:
        target = Storage(to, storage_options)
        if target.is_local:
            recover(target.root)  # a killed export's staging and set-aside folders: the previous state back
        if target.is_local and os.path.lexists(target.root) and not os.path.isdir(target.root):
            raise ExportError(f"--to: {to} is a file; give a folder (new or empty; it is created if missing)")
        names = target.listdir("")
        marker = target.read_json_or_none(MARKER) if MARKER in names else None
    except (OSError, StoreError) as exc:
        raise ExportError(f"--to: cannot read {to}: {exc.__class__.__name__}: {exc}") from None
    earlier = [str(f) for f in marker.get("files", [])] if isinstance(marker, dict) else []
    if names and marker is None and not force:
        raise ExportError(
            f"--to: {to} is not empty and holds no earlier ftorch export ({len(names)} entries, e.g. "
            f"{names[0]}); give a new or empty folder, or --force to write beside (and over) its files"
        )
    made = target.is_local and not os.path.lexists(target.root)
    try:
        preflight(to, storage_options)
    except StoreError as exc:
        raise ExportError(f"--to: cannot write there: {exc}") from None
    finally:
        if made:  # the probe's folder: a refusal later (a damaged checkpoint) must leave nothing behind
            with contextlib.suppress(OSError):
                os.rmdir(target.root)
    return earlier


def _foreign(output: Storage, earlier: list[str]) -> bool:
    """Whether the local target holds files no ftorch export wrote (--force): then it is written file by
    file beside them, never swapped whole."""
    ours = {MARKER, *earlier}
    for root, _dirs, files in os.walk(output.root):
        for name in files:
            if os.path.relpath(os.path.join(root, name), output.root) not in ours:
                return True
    return False


def _marker(step: int, merge: bool, files: list[str], pending: bool) -> bytes:
    record: dict[str, Any] = {"step": step, "merge": merge, "files": files}
    if pending:
        record["pending"] = True  # written before the files: an export that did not finish
    return json.dumps(record).encode()


def _expected(spec: JobSpec, merge: bool) -> set[str]:
    """The files an export of this kind writes (what a pending marker promises to replace)."""
    if spec.method == "full" or merge:
        return {"config.json", "model.safetensors", "generation_config.json"}
    return {"adapter_config.json", "adapter_model.safetensors", "README.md"}


def _write(output: Storage, rel: str, data: bytes) -> None:
    try:
        output.write_bytes(rel, data)
    except (OSError, StoreError) as exc:
        raise ExportError(f"--to: cannot write {rel} there: {exc}") from None


def _write_marker_file(folder: str, data: bytes) -> None:
    with open(os.open(os.path.join(folder, MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(data)


def _save(
    spec: JobSpec,
    model: Any,
    merge: bool,
    folder: Any,
    stage: str | None,
    output: Storage,
    step: int,
    written: list[str],
    records: Callable[[str], None],
    push: Callable[[str], None],
) -> None:
    """Save the model and tokenizer into `folder`, then `records` (card, summary) and `push` (to the Hub)
    from it; staged: marker, then the renames (exportstage.py); else each file into `output` (the pending
    marker is already there)."""
    with folder as tmp:
        if spec.method == "full" or merge:
            model.save_pretrained(tmp, safe_serialization=True)
        else:
            model.save_pretrained(tmp, safe_serialization=True, save_embedding_layers=False)
        load_tokenizer(spec).save_pretrained(tmp)
        records(tmp)
        for root, _dirs, files in os.walk(tmp):
            written.extend(os.path.relpath(os.path.join(root, name), tmp) for name in sorted(files))
        push(tmp)
        if stage is not None:
            _write_marker_file(tmp, _marker(step, merge, sorted(written), False))
            maybe_die("export", 2)  # tests: a kill with the export staged, before it is in place
            publish(tmp, output.root)
            return
        for n, rel in enumerate(sorted(written), start=1):
            with open(os.path.join(tmp, rel), "rb") as handle:
                _write(output, rel, handle.read())
            maybe_die("export", n + 10)  # tests: a kill part way through the files


def pick_checkpoint(store: RunStore, step: int | None) -> Any:
    listing = store.list_checkpoints()
    complete = listing.complete
    if not complete:
        raise ExportError("JOB: the run has no complete checkpoint yet")
    if step is None:  # the newest healthy one (trainer/health/rules.py): an unhealthy run's good weights
        healthy = listing.newest_healthy
        if healthy is None:
            raise ExportError("JOB: the run has no healthy checkpoint (train.health); --step picks one")
        return healthy
    for info in complete:
        if info.step == step:
            return info
    steps = ", ".join(str(c.step) for c in complete)
    raise ExportError(f"--step: no complete checkpoint at step {step}; complete ones: {steps}")


def _weights(store: RunStore, info: Any) -> dict[str, torch.Tensor]:
    from safetensors.torch import load as safetensors_load

    try:
        if info.meta.get("dcp_files"):  # sharded (FSDP): every rank's shards, read whole in this process
            return dcp_io.read_tensors(store, info)
        return safetensors_load(store.read_checkpoint(info)[WEIGHTS])
    except CorruptCheckpoint as exc:
        raise ExportError(f"--step: checkpoint {info.step} is damaged: {exc}") from None


def _base(spec: JobSpec, empty: bool, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    if not empty:
        return AutoModelForCausalLM.from_pretrained(spec.model, dtype=dtype)
    from accelerate import init_empty_weights

    config = AutoConfig.from_pretrained(spec.model)
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _load_trained(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """The checkpoint's trainable tensors into the model (assigned: they replace meta tensors too)."""
    names = set(trainable_parameters(model))
    missing = sorted(names - set(weights))
    if missing:
        raise ExportError(f"the checkpoint does not match the job's model ({len(missing)} tensors missing)")
    result = model.load_state_dict({k: weights[k] for k in names}, strict=False, assign=True)
    if result.unexpected_keys:
        raise ExportError(f"the checkpoint has tensors the model lacks: {result.unexpected_keys[:3]}")


def build(spec: JobSpec, weights: dict[str, torch.Tensor], merge: bool) -> torch.nn.Module:
    """The model to save: an adapter model (meta base), a merged model, or a full fine-tune."""
    hide_bitsandbytes()  # never needed: the export works on the unquantized base
    if spec.method == "full":
        dtype = torch.float32 if spec.train.precision == "fp32" else torch.bfloat16
        model = _base(spec, empty=False, dtype=dtype)
        _load_trained(model, weights)
        return model
    from peft import get_peft_model

    dtype = base_dtype(spec) if spec.method == "lora" else torch.bfloat16
    if spec.method == "qlora" and spec.quantization.compute_dtype == "fp32":
        dtype = torch.float32
    model = get_peft_model(_base(spec, empty=not merge, dtype=dtype), lora_config(spec))
    _load_trained(model, weights)
    return model.merge_and_unload() if merge else model


def export(
    run_uri: str,
    to: str,
    step: int | None = None,
    merge: bool = False,
    storage_options: dict[str, Any] | None = None,
    force: bool = False,
    push_to: str | None = None,
    private: bool = True,
    job: dict[str, Any] | None = None,
    output_uri: str | None = None,
) -> dict[str, Any]:
    """Write the export into `to` (a local folder or a bucket URL); returns what was written. Every
    export carries ftorch's model card (README.md) and training_summary.json. `push_to` (a Hub repo id)
    also uploads the folder to the Hugging Face Hub (HF_ENDPOINT, HF_TOKEN; trainer/outputs/hub_push.py).

    `to` must be new, empty or an earlier export (`check_target`; `force` writes beside other files);
    inside the run store a link out of it is never followed.

    `job`, `output_uri`: the job spec to export with and where its run's output is (the CLI passes the
    registry's, the user's own); without them the run store's spec.json is used. A store is data: whoever
    can write its bucket must not choose the `model` (what is downloaded and loaded) that an export of a
    registered job uses, nor where its summary is read from."""
    store = RunStore(run_uri, storage_options)
    spec = JobSpec.model_validate(job if job is not None else store.read_spec()["job"])
    earlier = check_target(to, spec.checkpoint.storage_options, force)
    if merge and spec.method == "full":
        raise ExportError("--merge: a full fine-tune has no adapter to merge; export it without --merge")
    info = pick_checkpoint(store, step)
    model = build(spec, _weights(store, info), merge)
    output = output_store(to, run_uri, spec.checkpoint.storage_options)
    stage = stage_dir(output.root) if output.is_local and not _foreign(output, earlier) else None
    if stage is not None:
        os.makedirs(stage, mode=0o700)
    else:  # a bucket (or --force beside other files): a pending marker first, so that a killed export
        # is seen as one (a re-run replaces it), the files, then the marker
        _write(output, MARKER, _marker(info.step, merge, sorted(set(earlier) | _expected(spec, merge)), True))
    written: list[str] = []
    folder = contextlib.nullcontext(stage) if stage else scratch.folder("ftorch-export-")
    pushed: list[Any] = []
    refused: list[PushError] = []

    def records(tmp: str) -> None:  # over PEFT's empty README template
        _write_record(store, spec, info.step, merge, tmp, run_uri, output_uri)

    def push(tmp: str) -> None:  # from this folder: the export itself may go to a bucket
        if not push_to:
            return
        try:
            pushed.append(
                push_folder(tmp, push_to, private, f"ftorch export of {spec.name}, step {info.step}")
            )
        except PushError as exc:  # the export stands (marker below); the push is reported after
            refused.append(exc)

    try:
        _save(spec, model, merge, folder, stage, output, info.step, written, records, push)
    except BaseException:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        raise
    if stage is None:
        for stale in sorted(set(earlier) - set(written)):  # what the earlier export wrote, this one not
            output.remove_file(stale)
        _write(output, MARKER, _marker(info.step, merge, sorted(written), False))
    if refused:
        raise refused[0]
    kind = "merged model" if merge else ("model" if spec.method == "full" else "PEFT adapter")
    result = {"step": info.step, "kind": kind, "to": to, "files": sorted(written), "base_model": spec.model}
    if pushed:
        result["pushed"] = pushed[0]
    return result


def _write_record(
    store: RunStore, spec: JobSpec, step: int, merge: bool, folder: str, run_uri: str, output_uri: str | None
) -> None:
    """training_summary.json and the model card of this export into `folder`; the run's output is read
    from `output_uri`, else from where the store's spec.json says."""
    from trainer.outputs import model_card

    if output_uri is None:
        output_uri = store.read_spec().get("output_uri") or ""
    try:
        output: Any = output_store(output_uri, run_uri, spec.checkpoint.storage_options)
    except (OSError, StoreError, ValueError):
        output = None
    summary = model_card.export_summary(store, output, spec, step, merge)
    with open(os.path.join(folder, model_card.SUMMARY), "w", encoding="utf-8") as handle:
        handle.write(finite_json.dumps(summary, indent=2, sort_keys=True) + "\n")  # never a bare NaN
    with open(os.path.join(folder, model_card.CARD), "w", encoding="utf-8") as handle:
        handle.write(model_card.render_card(summary))

"""Sharded (FSDP, DCP) checkpoints, from one 2-rank LoRA run (gloo, CPU): `ftorch export` writes a PEFT
adapter and a merged model from them, and a checkpoint that cannot be loaded (a damaged shard, a tampered
`.metadata`) is skipped or refused in one line, never unpickled unsafely."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from fsdp_helpers import finish, fsdp_job, new_run, set_nproc
from helpers import run_trainer, write_data

from trainer.outputs.export import ExportError, export
from trainer.runstore.store import RunStore


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([[1, 5, 9, 12, 7, 3, 2]])).logits


def _adapter_logits(base: Path, adapter: Path) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return _logits(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(adapter)).eval())


class _Payload:
    """What a tampered metadata file could hold: unpickling it unsafely would create `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.marker),))


def test_sharded_checkpoints_export_and_unloadable_ones_are_skipped(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    sections = {"train": {"max_steps": 4}, "checkpoint": {"every": 2, "keep": 3}}
    run_uri = new_run(fsdp_job(tiny_model, data, tmp_path / "runs", **sections), "sharded")
    assert "sharded over 2 ranks" in finish(run_uri, 1, nproc=2)
    store = RunStore(run_uri)
    older, newest = store.complete_checkpoints()
    assert (older.step, newest.step) == (2, 4) and newest.meta["kind"] == "dcp"

    # export: the adapter of the newest checkpoint gives the trained model's logits (what rank 0 wrote)
    trained = _adapter_logits(tiny_model, Path(run_uri) / "output")
    adapter = export(run_uri, str(tmp_path / "adapter"))
    assert adapter["step"] == 4 and "adapter_model.safetensors" in adapter["files"]
    assert torch.equal(_adapter_logits(tiny_model, tmp_path / "adapter"), trained)
    merged = export(run_uri, str(tmp_path / "merged"), merge=True)
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert merged["kind"] == "merged model" and torch.allclose(_logits(plain), trained, atol=1e-5)
    earlier = export(run_uri, str(tmp_path / "step2"), step=2)  # any complete checkpoint
    assert earlier["step"] == 2 and not torch.allclose(
        _adapter_logits(tiny_model, tmp_path / "step2"), trained
    )

    # a damaged shard (same size, so the manifest's sizes match): the resume uses the checkpoint before
    shard = Path(run_uri) / newest.path / newest.dir / "__1_0.distcp"
    shard.write_bytes(os.urandom(shard.stat().st_size))
    set_nproc(run_uri, 1)  # resumed by one process: the same sharded loader, one rank
    done = run_trainer(run_uri, 2)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    skipped = [line for line in out.splitlines() if "not using checkpoint checkpoints/step-00000004" in line]
    assert len(skipped) == 1 and "cannot be loaded safely" in skipped[0], out[-3000:]
    assert "resumed from checkpoints/step-00000002 (step 2/4)" in out
    for unsafe in ("weights_only=False", "`weights_only` set to `False`", "trusted source", "Traceback"):
        assert unsafe not in out

    # a tampered .metadata (the manifest fixed up to match): refused without running anything in it
    marker = tmp_path / "code-ran"
    info = RunStore(run_uri).complete_checkpoints()[-1]
    evil = pickle.dumps(_Payload(marker))
    (Path(run_uri) / info.path / info.dir / ".metadata").write_bytes(evil)
    manifest_path = Path(run_uri) / info.path / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["meta"]["dcp_files"][".metadata"] = len(evil)
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(
        ExportError, match=r"^--step: checkpoint 4 is damaged: cannot be loaded safely: "
    ) as caught:
        export(run_uri, str(tmp_path / "refused"))
    assert "posix.mkdir is not part of a checkpoint's metadata" in str(caught.value)
    assert "\n" not in str(caught.value) and not marker.exists() and not (tmp_path / "refused").exists()

"""Checkpoints that cannot be used: one refused by `weights_only` loading (a tampered optimizer state) is
skipped like a corrupt one, with no advice to load unsafely; a full run store (ENOSPC) is named as such,
and the partial checkpoints it left are cleaned up at the next start."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import torch
from helpers import job_dict, prepare_run, run_trainer, write_data

from trainer import exitcodes

SYNC = {"FTORCH_ASYNC_CHECKPOINT": "0"}


def _tamper_optimizer(run_uri: str, step: int) -> None:
    """Replace a checkpoint's optimizer.pt with a pickle that names a function, and fix up the manifest
    (what someone with write access to the store could do)."""
    folder = Path(run_uri) / "checkpoints" / f"step-{step:08d}"
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    buffer = io.BytesIO()
    torch.save({"optimizer": {}, "scheduler": {}, "hook": os.getpid}, buffer)
    data = buffer.getvalue()
    (folder / manifest["dir"] / "optimizer.pt").write_bytes(data)
    manifest["files"]["optimizer.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "MANIFEST.json").write_text(json.dumps(manifest))


def test_a_checkpoint_refused_by_weights_only_is_skipped(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 20}, checkpoint={"keep": 5})
    run_uri = prepare_run(job)
    first = run_trainer(run_uri, 1, env={**SYNC, "FTORCH_FAULTS": "crash@12"})
    assert first.returncode == exitcodes.ERROR, first.stdout
    _tamper_optimizer(run_uri, 10)

    second = run_trainer(run_uri, 2, env=SYNC)
    out = second.stdout + second.stderr
    assert second.returncode == exitcodes.OK, out
    assert "not using checkpoint checkpoints/step-00000010: cannot be loaded safely" in out, out
    assert "resumed from checkpoints/step-00000005 (step 5/20)" in out, out
    for unsafe in ("weights_only=False", "`weights_only` set to `False`", "trusted source"):
        assert unsafe not in out


def test_a_full_store_is_named_and_its_partial_checkpoints_are_cleaned_up(
    tmp_path: Path, tiny_model: Path
) -> None:
    from orchestrator.backends.local_parts import store_failure_reason

    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 15})
    run_uri = prepare_run(job)
    full = ",".join(f"store-full@{s}" for s in (10, 15))
    first = run_trainer(run_uri, 1, env={**SYNC, "FTORCH_FAULTS": full})
    assert first.returncode == exitcodes.STORE_UNAVAILABLE, first.stdout
    last = [line for line in first.stdout.splitlines() if line.strip()][-1]
    assert "disk is full (ENOSPC)" in last, last
    assert "disk is full (ENOSPC)" in store_failure_reason(last)
    assert "unreachable" not in store_failure_reason(last)
    partial = Path(run_uri) / "checkpoints" / "step-00000010" / "e00000001"
    assert partial.exists() and not (partial.parent / "MANIFEST.json").exists()

    second = run_trainer(run_uri, 2, env=SYNC)
    assert second.returncode == exitcodes.OK, second.stdout
    assert "removed incomplete checkpoint(s) left by earlier attempts: step-00000010, step-00000015" in (
        second.stdout
    )
    assert not partial.exists()

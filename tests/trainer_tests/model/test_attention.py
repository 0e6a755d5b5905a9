"""`train.attn_implementation: auto` (trainer/model/attention.py): flash-attention 2 where flash_attn imports and
the device is CUDA, SDPA otherwise; the resolved path is what the checkpoints' fingerprint records; the
planner counts `auto` as SDPA. The import check is stood in for by FTORCH_FAULTS (a CPU has no CUDA and
no flash_attn), the device by the device type the trainer passes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO, job_dict, prepare_run, run_trainer, write_data

from orchestrator.jobfile.spec import validate_job
from trainer.checkpoints import fingerprint
from trainer.model.attention import resolve
from trainer.runstore.store import RunStore


def resolved_in_a_fresh_process(device_type: str, faults: str = "") -> str:
    code = f"from trainer.model.attention import resolve; print(resolve('auto', {device_type!r}))"
    env = {**os.environ, "FTORCH_FAULTS": faults}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_auto_takes_flash_on_cuda_where_flash_attn_is_installed_and_sdpa_elsewhere() -> None:
    assert resolved_in_a_fresh_process("cuda", "flash-attn-installed@0") == "flash_attention_2"
    assert resolved_in_a_fresh_process("cuda", "flash-attn-missing@0") == "sdpa"
    assert resolved_in_a_fresh_process("cpu", "flash-attn-installed@0") == "sdpa"  # flash is CUDA only
    here = "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"
    assert resolved_in_a_fresh_process("cuda") == here  # the real import check, unfaked
    for explicit in ("sdpa", "eager", "flash_attention_2"):
        assert resolve(explicit, "cpu") == explicit  # asked for outright: never second-guessed


def test_auto_is_the_default_and_counted_as_sdpa_by_the_planner(tmp_path: Path, tiny_model: Path) -> None:
    from orchestrator.sizing.memory import settings_from_spec
    from orchestrator.sizing.throughput import path_mfu

    data = write_data(tmp_path / "d.jsonl", "instruction", 8)
    spec = validate_job(job_dict(tiny_model, data, tmp_path / "runs"))
    assert spec.train.attn_implementation == "auto"
    s = settings_from_spec(spec)
    assert s.attn == "sdpa"
    sdpa = settings_from_spec(
        validate_job(job_dict(tiny_model, data, tmp_path / "runs", train={"attn_implementation": "sdpa"}))
    )
    assert path_mfu(s) == path_mfu(sdpa)


def test_the_fingerprint_records_the_resolved_path_and_the_cli_leaves_auto_to_the_trainer(
    tmp_path: Path, tiny_model: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 8)
    job = validate_job(job_dict(tiny_model, data, tmp_path / "runs")).model_dump(mode="json")
    assert "train.attn_implementation" in fingerprint.FIELDS
    ran = {**job, "train": {**job["train"], "attn_implementation": "flash_attention_2"}}
    recorded = fingerprint.record(ran, None)  # what a CUDA attempt with flash_attn records
    assert fingerprint.changes(recorded, job, 5) == []  # the CLI cannot tell what `auto` will resolve to
    elsewhere = {**job, "train": {**job["train"], "attn_implementation": "sdpa"}}  # resolved without flash
    assert [c.field for c in fingerprint.changes(recorded, elsewhere, 5)] == ["train.attn_implementation"]
    older = {**recorded, "fields": {k: v for k, v in recorded["fields"].items() if "attn" not in k}}
    assert fingerprint.changes(older, elsewhere, 5) == []  # a checkpoint from before the field was recorded


def test_a_cpu_run_under_auto_trains_with_sdpa_and_its_checkpoints_say_so(
    tmp_path: Path, tiny_model: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 8)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 2, "micro_batch_size": 2})
    run_uri = prepare_run(job, "attn-auto")
    done = run_trainer(run_uri)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "attention: sdpa (train.attn_implementation: auto)" in done.stdout + done.stderr
    store = RunStore(run_uri)
    step, recorded = fingerprint.newest_record(store)
    assert step == 2 and recorded["fields"]["train.attn_implementation"] == "sdpa"
    assert store.read_spec()["job"]["train"]["attn_implementation"] == "auto"  # spec.json keeps the ask

"""A real run store to adopt (tests of issue 30): one clean run to compare with, and one killed after its
checkpoint at step 10, made once per module and copied (then tampered with) by each test."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import ftorch, job_dict, prepare_run, run_trainer, write_data

STEPS = 16


@dataclass
class Runs:
    clean: Path  # a run that was never stopped: its output is what every resume must give, bit for bit
    crashed: Path  # killed at step 12, checkpoint 10 committed; never resumed (the tests copy it)
    run_id: str


def make_runs(root: Path, tiny_model: Path) -> Runs:
    data = write_data(root / "d.jsonl", "instruction", 32)

    def job(where: str) -> dict[str, Any]:
        return job_dict(tiny_model, data, root / where, train={"max_steps": STEPS})

    clean = prepare_run(job("clean"), "adopt-abc123")
    done = run_trainer(clean, env={"FTORCH_ASYNC_CHECKPOINT": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    crashed = prepare_run(job("orig"), "adopt-abc123")
    killed = run_trainer(crashed, env={"FTORCH_FAULTS": "crash@12", "FTORCH_ASYNC_CHECKPOINT": "0"})
    assert killed.returncode != 0
    assert (Path(crashed) / "checkpoints" / "step-00000010" / "MANIFEST.json").exists()
    return Runs(Path(clean), Path(crashed), "adopt-abc123")


def copy_store(source: Path, to: Path, **spec_changes: Any) -> Path:
    """A copy of the store at `to`, its spec.json as launch writes it there, then changed: run_id=...,
    output_uri=..., job_notify=... (job_X sets the job's section X)."""
    shutil.copytree(source, to, symlinks=True)
    spec_file = to / "spec.json"
    resolved = json.loads(spec_file.read_text())
    resolved["output_uri"] = str(to / "output")  # as if launched there (a test that moves a store sets it)
    for key, value in spec_changes.items():
        if key.startswith("job_"):
            resolved["job"][key[4:]] = value
        else:
            resolved[key] = value
    spec_file.write_text(json.dumps(resolved))
    return to


def wait_ended(job_id: str, timeout: float = 240.0) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        detail = json.loads(ftorch("status", job_id, "--json").stdout)
        if detail["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "STOPPED"):
            return detail
        time.sleep(0.5)
    raise AssertionError(f"{job_id} did not end")


def same_adapter(a: Path, b: Path) -> bool:
    name = "adapter_model.safetensors"
    return (a / name).read_bytes() == (b / name).read_bytes()

"""Helpers for the S3 tests: run stores on the test server, trainer processes pointed at an endpoint."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from helpers import REPO, trainer_cmd
from s3server import s3_env

from trainer.runstore.storage import join_uri
from trainer.runstore.store import RunStore


def prepare_s3_run(job: dict[str, Any], run_id: str, endpoint: str) -> RunStore:
    """What `ftorch launch` writes, on S3; returns the run's store (reached through `endpoint`)."""
    from orchestrator.jobfile.spec import validate_job

    spec = validate_job(job)
    run_uri = join_uri(spec.checkpoint.uri, run_id)
    store = RunStore(run_uri, {"endpoint_url": endpoint})
    store.write_spec(
        {
            "job": spec.model_dump(mode="json"),
            "run_id": run_id,
            "output_uri": join_uri(run_uri, "output"),
            "created_at": 0.0,
        }
    )
    return store


def trainer_env(endpoint: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, **s3_env(endpoint), "FTORCH_PROGRESS_EVERY_S": "0.5"}
    env.pop("FTORCH_FAULTS", None)
    env.update(extra)
    return env


def run(
    store: RunStore, endpoint: str, attempt: int, timeout: float = 240, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        trainer_cmd(store.run_uri, attempt),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=trainer_env(endpoint, **extra),
        cwd=REPO,
    )


def start(store: RunStore, endpoint: str, attempt: int, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        trainer_cmd(store.run_uri, attempt),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=trainer_env(endpoint, **extra),
        cwd=REPO,
    )


def s3_final_weights(store: RunStore) -> dict[str, Any]:
    from safetensors.torch import load

    names = store.listdir("output")
    name = "adapter_model.safetensors" if "adapter_model.safetensors" in names else "model.safetensors"
    return load(store.read_bytes(f"output/{name}"))


def object_keys(store: RunStore, rel: str) -> list[str]:
    """Every object under `rel` (not the empty 'folders' SeaweedFS keeps listing)."""
    try:
        found = store.fs.find(store.path(rel), detail=True)
    except FileNotFoundError:
        return []
    return sorted(
        p.removeprefix(store.root + "/")
        for p, info in found.items()
        if info.get("type") == "file" and p.rstrip("/") != store.path(rel)
    )


def local_reference(job: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """The same job, uninterrupted, on a local disk: the weights every S3 run must end with."""
    from helpers import final_weights, prepare_run, run_trainer

    local = {**job, "checkpoint": {**job["checkpoint"], "uri": str(tmp / "reference")}}
    run_uri = prepare_run(local, "reference")
    done = run_trainer(run_uri)
    assert done.returncode == 0, done.stdout + done.stderr
    return final_weights(run_uri)


def job_for(tiny_model: Path, data: Path, uri: str, **sections: Any) -> dict[str, Any]:
    """The standard small job of the S3 tests: LoRA with dropout, 30 steps, a checkpoint every 5."""
    from helpers import job_dict

    checkpoint = {"uri": uri, "every": 5, "keep": 2, **sections.pop("checkpoint", {})}
    return job_dict(tiny_model, data, Path("/unused"), checkpoint=checkpoint, **sections)


def wait_for_line(proc: subprocess.Popen[str], needle: str, seen: list[str]) -> bool:
    """Read the trainer's output until a line contains `needle` (kept in `seen`); False at EOF."""
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if needle in line:
            return True
    return False

"""Running the real trainer under torchrun (gloo, CPU) for the FSDP and resharding tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from helpers import REPO, prepare_run

#: one intra-op thread per rank: the test machines have few cores
ENV = {"OMP_NUM_THREADS": "1", "FTORCH_PROGRESS_EVERY_S": "0.2"}


def fsdp_job(model: Path, data: Path, ckpt: Path, nproc: int = 2, **sections: Any) -> dict[str, Any]:
    from helpers import job_dict

    job = job_dict(model, data, ckpt, **sections)
    job["local"] = {**job["local"], "nproc": nproc}
    return job


def launch_cmd(run_uri: str, attempt: int, nproc: int) -> list[str]:
    """What the local supervisor starts for this rank count."""
    from orchestrator.backends.local_parts import trainer_command

    return trainer_command(nproc, run_uri, attempt)


def run(run_uri: str, attempt: int, nproc: int, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        launch_cmd(run_uri, attempt, nproc),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **ENV},
        start_new_session=True,
    )
    return done


def finish(run_uri: str, attempt: int, nproc: int) -> str:
    done = run(run_uri, attempt, nproc)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    return done.stdout


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def interrupt(run_uri: str, attempt: int, nproc: int, at_step: int, sig: int) -> tuple[int, str, list[int]]:
    """Start the attempt, wait for rank 0 to log `at_step`, send `sig` to the launcher (torchrun's agent,
    like the supervisor does); (exit code, output, worker pids)."""
    proc = subprocess.Popen(
        launch_cmd(run_uri, attempt, nproc),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, **ENV},
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    workers: list[int] = []
    for line in proc.stdout:
        lines.append(line)
        if f"] step {at_step}/" in line and not workers:
            workers = children(proc.pid) or [proc.pid]
            proc.send_signal(sig)
    code = proc.wait(timeout=120)
    return code, "".join(lines), workers


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def set_nproc(run_uri: str, nproc: int) -> None:
    """What `ftorch resume --set local.nproc=N` amounts to for the trainer: the run's spec changes."""
    from trainer.runstore.store import RunStore

    store = RunStore(run_uri)
    spec = store.read_spec()
    spec["job"]["local"]["nproc"] = nproc
    store.write_spec(spec)


def new_run(job: dict[str, Any], run_id: str) -> str:
    return prepare_run(job, run_id)


PY = sys.executable
SIGKILL = signal.SIGKILL
SIGTERM = signal.SIGTERM


def output_weights(run_uri: str) -> dict[str, Any]:
    """The final weights from the run store (local or s3://)."""
    from safetensors.torch import load

    from trainer.runstore.store import RunStore

    store = RunStore(run_uri)
    names = store.listdir("output")
    name = "adapter_model.safetensors" if "adapter_model.safetensors" in names else "model.safetensors"
    return load(store.read_bytes(f"output/{name}"))


def max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)

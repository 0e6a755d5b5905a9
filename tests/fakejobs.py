"""Jobs written straight into a registry and a run store (no trainer), for status rendering tests."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from orchestrator.registry import Registry


def add_job(
    registry: Registry,
    runs: Path,
    job_id: str,
    state: str,
    step: int,
    total: int = 300,
    attempts: list[dict[str, Any]] | None = None,
    hourly_usd: float = 2.5,
    spot: bool | None = True,
    instance: str = "aws:g5.2xlarge",
    budget_usd: float | None = None,
    reason: str | None = None,
    ended_ago_s: float | None = None,
    checkpoints: list[int] = (),
    steps_per_s: float = 0.05,
    supervisor_pid: int | None = None,
    notify: dict[str, Any] | None = None,
) -> str:
    """A job with attempts (each: start_step, end_step, reason, seconds) and a progress.json/metrics;
    `notify` is the job file's notify: section."""
    now = time.time()
    run_uri = str(runs / job_id)
    spec: dict[str, Any] = {"checkpoint": {"uri": str(runs)}, "resources": {"budget_usd": budget_usd}}
    if notify is not None:
        spec["notify"] = notify
    registry.create_job(
        job_id, job_id.rsplit("-", 1)[0], "local", run_uri, f"{run_uri}/output", spec, hourly_usd
    )
    attempts = attempts or [{"start": 0, "end": step, "reason": None, "seconds": step / steps_per_s}]
    t = now - sum(a["seconds"] + 60 for a in attempts) - (ended_ago_s or 0)
    with registry._connect() as db:
        db.execute("UPDATE jobs SET created_at = ? WHERE job_id = ?", (t - 30, job_id))
    for a in attempts:
        att = registry.start_attempt(job_id, a["start"], instance=instance, spot=spot, hourly_usd=hourly_usd)
        ended = t + a["seconds"] if a["reason"] is not None else None
        fields: dict[str, Any] = {"first_step_at": t + 20, "pid": 1}
        if ended is not None:
            fields.update(ended_at=ended, end_reason=a["reason"], end_step=a["end"], exit_code=0)
        with registry._connect() as db:
            db.execute("UPDATE attempts SET started_at = ? WHERE job_id = ? AND n = ?", (t, job_id, att.n))
        registry.update_attempt(job_id, att.n, **fields)
        t += a["seconds"] + 60
    registry.set_state(job_id, state, reason)
    if supervisor_pid is not None:
        from orchestrator import procs

        registry.update(
            job_id, supervisor_pid=supervisor_pid, supervisor_started=procs.start_time(supervisor_pid)
        )
    if ended_ago_s is not None:
        with registry._connect() as db:
            db.execute("UPDATE jobs SET ended_at = ? WHERE job_id = ?", (now - ended_ago_s, job_id))
    folder = Path(run_uri)
    (folder / "metrics").mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "step": s,
            "loss": 2.5 * math.exp(-s / 70) + 0.4 + 0.03 * math.sin(s),
            "time": now - (step - s) / steps_per_s,
        }
        for s in range(1, step + 1)
    ]
    (folder / "metrics" / "0001-0000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for c in checkpoints:
        ck = folder / "checkpoints" / f"step-{c:08d}"
        ck.mkdir(parents=True, exist_ok=True)
        (ck / "state.bin").write_bytes(b"x" * 4096)
        manifest = {
            "format": 1,
            "step": c,
            "created_at": now - (step - c) / steps_per_s,
            "files": {"state.bin": {"size": 4096, "sha256": "-"}},
        }
        (ck / "MANIFEST.json").write_text(json.dumps(manifest))
    progress = {
        "state": "finished" if state == "SUCCEEDED" else "running",
        "step": step,
        "total_steps": total,
        "loss": rows[-1]["loss"] if rows else None,
        "steps_per_s": steps_per_s,
        "eta_s": (total - step) / steps_per_s,
        "updated_at": now - 1,
        "last_checkpoint_step": checkpoints[-1] if checkpoints else None,
        "last_checkpoint_at": now - (step - checkpoints[-1]) / steps_per_s if checkpoints else None,
    }
    (folder / "progress.json").write_text(json.dumps(progress))
    os.makedirs(folder, exist_ok=True)
    return job_id


def demo_registry(home: Path, runs: Path, supervisor_pid: int | None = None) -> Registry:
    """A realistic mix: one running after a preemption, one stopped on budget, one done, one failed."""
    os.environ["FTORCH_HOME"] = str(home)
    registry = Registry(home)
    pid = supervisor_pid or os.getpid()
    add_job(
        registry,
        runs,
        "llama3-8b-support-a1b2c3",
        "RUNNING",
        212,
        total=600,
        attempts=[
            {"start": 0, "end": 131, "reason": "preempted (with notice, random)", "seconds": 131 / 0.05},
            {"start": 130, "end": 212, "reason": None, "seconds": 82 / 0.05},
        ],
        checkpoints=[150, 180, 210],
        supervisor_pid=pid,
    )
    add_job(
        registry,
        runs,
        "qwen-7b-sql-d4e5f6",
        "STOPPED",
        140,
        total=400,
        budget_usd=2.0,
        reason="budget: $1.95 spent + $0.07 for the next checkpoint interval would pass budget_usd $2.00",
        attempts=[{"start": 0, "end": 140, "reason": "budget", "seconds": 140 / 0.05}],
        checkpoints=[100, 120, 140],
        hourly_usd=2.5,
        ended_ago_s=3600,
    )
    add_job(
        registry,
        runs,
        "mistral-7b-chat-0a9b8c",
        "SUCCEEDED",
        300,
        total=300,
        spot=False,
        instance="gcp:a2-highgpu-1g",
        attempts=[{"start": 0, "end": 300, "reason": "succeeded", "seconds": 300 / 0.05}],
        checkpoints=[250, 300],
        ended_ago_s=5 * 3600,
    )
    add_job(
        registry,
        runs,
        "old-experiment-111111",
        "FAILED",
        10,
        total=300,
        reason="the trainer crashed 3 times",
        attempts=[{"start": 0, "end": 10, "reason": "crashed", "seconds": 200}],
        ended_ago_s=3 * 86400,
    )
    return registry


def bulk_registry(
    home: Path, runs: Path, n: int = 1000, active: int = 10, pid: int | None = None
) -> Registry:
    """`n` jobs in one transaction: `active` RUNNING ones (with a progress.json, supervised by `pid`),
    the rest finished days ago with their last progress cached in the registry, as ftorch leaves them."""
    from orchestrator import procs

    registry = Registry(home)
    pid = pid or os.getpid()
    started = procs.start_time(pid)
    now = time.time()
    states = ["SUCCEEDED"] * 6 + ["FAILED", "CANCELLED", "STOPPED", "SUCCEEDED"]
    with registry._connect() as db:
        db.execute("BEGIN")
        for i in range(n):
            job_id = f"job{i:04d}-{i * 7919 % 999983:06x}"
            run_uri = str(runs / job_id)
            is_active = i >= n - active
            state = "RUNNING" if is_active else states[i % len(states)]
            created = now - (n - i) * 3600.0
            ended = None if is_active else created + 500.0
            spec = {"checkpoint": {"uri": str(runs), "every": 50}, "resources": {"budget_usd": 20.0}}
            db.execute(
                "INSERT INTO jobs (job_id, name, backend, state, reason, run_uri, output_uri, spec_json,"
                " created_at, updated_at, ended_at, supervisor_pid, supervisor_started, hourly_usd)"
                " VALUES (?, ?, 'local', ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?, 1.2)",
                (job_id, f"job{i:04d}", state, run_uri, run_uri + "/output", json.dumps(spec), created,
                 ended or now, ended, pid if is_active else None, started if is_active else None),
            )  # fmt: skip
            for n_att in range(1 + i % 3):
                a_start = created + n_att * 150.0
                db.execute(
                    "INSERT INTO attempts (job_id, n, started_at, ended_at, end_reason, start_step, end_step,"
                    " first_step_at, instance, spot, hourly_usd) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'local', 1, 1.2)",
                    (job_id, n_att + 1, a_start, None if is_active and n_att == i % 3 else a_start + 140.0,
                     "preempted (with notice, random)" if n_att < i % 3 else None if is_active else "succeeded",
                     n_att * 100, n_att * 100 + 100, a_start + 10.0),
                )  # fmt: skip
            progress = {"step": 250, "total_steps": 300, "loss": 0.5, "steps_per_s": 1.0, "eta_s": 50.0,
                        "last_checkpoint_step": 250, "last_checkpoint_at": now - 30, "updated_at": now}  # fmt: skip
            if is_active:
                (runs / job_id).mkdir(parents=True, exist_ok=True)
                (runs / job_id / "progress.json").write_text(json.dumps(progress))
            else:
                db.execute(
                    "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, 'final_progress', ?)",
                    (job_id, ended, json.dumps({"ended_at": ended, "progress": progress, "checked": True})),
                )
        db.execute("COMMIT")
    return registry

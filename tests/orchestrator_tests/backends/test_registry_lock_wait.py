"""A registry lock held longer than SQLite's busy timeout while the trainer finishes: the supervisor waits
for the registry instead of dying, and the job ends SUCCEEDED with its attempt closed."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
import yaml
from helpers import ftorch, job_dict, write_data

from orchestrator import procs
from orchestrator.registry import TERMINAL, Registry

BUSY_S = "0.5"  # SQLite's busy timeout for every process of this test (30 s by default)


def _hold_lock(home: Path) -> sqlite3.Connection:
    db = sqlite3.connect(home / "registry.db", timeout=10, isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    return db


def test_a_registry_lock_held_past_the_busy_timeout_does_not_fail_a_finished_job(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FTORCH_REGISTRY_BUSY_S", BUSY_S)
    registry = Registry()
    lock = _hold_lock(ftorch_home)
    started = time.time()
    with pytest.raises(sqlite3.OperationalError):
        registry.event("nobody", "probe")
    assert time.time() - started < 5  # the bound is FTORCH_REGISTRY_BUSY_S
    lock.execute("ROLLBACK")

    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 6})))
    done = ftorch("launch", str(job_file), "--json")
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["job_id"]

    deadline = time.time() + 240
    while time.time() < deadline and not (registry.attempts(job_id) and registry.attempts(job_id)[-1].pid):
        time.sleep(0.1)
    pid = registry.attempts(job_id)[-1].pid
    lock = _hold_lock(ftorch_home)  # held while the trainer finishes, and well after
    try:
        while procs.start_time(pid) is not None and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(3)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    while time.time() < deadline and registry.get(job_id).state not in TERMINAL:
        time.sleep(0.2)
    job = registry.get(job_id)
    assert job.state == "SUCCEEDED", (job.state, job.reason)
    attempt = registry.attempts(job_id)[-1]
    assert attempt.ended_at is not None and attempt.end_reason == "succeeded" and attempt.exit_code == 0

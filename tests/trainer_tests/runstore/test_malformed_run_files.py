"""Run-store files are validated when read: a malformed progress.json (a list, wrong-typed fields) or
spec.json is reported in one line and ignored or rebuilt; it never breaks `status` of other jobs, never
kills a supervisor, and nothing invalid is cached in the registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakejobs import add_job
from helpers import ftorch

from orchestrator.registry import Registry
from orchestrator.views import status as job_status
from trainer.runstore.store import RunStore

BAD = [
    ["a", "list"],
    {"step": "twelve", "total_steps": 300},
    {"step": 5, "total_steps": {"x": 1}, "loss": "low"},
    {"step": True, "total_steps": 300},
]


@pytest.mark.parametrize("bad", BAD)
def test_a_malformed_progress_file_is_ignored_and_reported(
    tmp_path: Path, ftorch_home: Path, bad: object
) -> None:
    registry = Registry()
    runs = tmp_path / "runs"
    broken = add_job(registry, runs, "broken-aaaaaa", "FAILED", 40, ended_ago_s=100)
    healthy = add_job(registry, runs, "healthy-bbbbbb", "SUCCEEDED", 300, ended_ago_s=50)
    progress_file = runs / broken / "progress.json"
    good = progress_file.read_text()
    progress_file.write_text(json.dumps(bad))

    assert RunStore(str(runs / broken)).read_progress() is None  # what the supervisor reads

    done = ftorch("status", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["job_id"]: r for r in json.loads(done.stdout)}
    assert rows[healthy]["step"] == 300 and rows[broken]["step"] == 0
    warnings = [line for line in done.stderr.splitlines() if "progress.json" in line]
    assert len(warnings) == 1 and str(progress_file) in warnings[0], done.stderr

    one = ftorch("status", broken)
    assert one.returncode == 0, one.stderr

    # nothing invalid was cached: once the file is fixed, status shows it
    progress_file.write_text(good)
    rows = {r["job_id"]: r for r in job_status.status_all()}
    assert rows[broken]["step"] == 40


def test_an_invalid_cached_progress_is_not_used(tmp_path: Path, ftorch_home: Path) -> None:
    registry = Registry()
    job_id = add_job(registry, tmp_path / "runs", "old-cccccc", "SUCCEEDED", 300, ended_ago_s=10)
    job = registry.get(job_id)
    registry.event(job_id, job_status.CACHE_KIND, json.dumps({"ended_at": job.ended_at, "progress": [1, 2]}))
    rows = {r["job_id"]: r for r in job_status.status_all()}
    assert rows[job_id]["step"] == 300


def test_a_garbled_spec_file_is_rebuilt_on_resume(tmp_path: Path, ftorch_home: Path) -> None:
    from orchestrator.jobs import lifecycle as jobs

    registry = Registry()
    job_id = add_job(registry, tmp_path / "runs", "spec-dddddd", "CANCELLED", 10, ended_ago_s=10)
    store = RunStore(registry.get(job_id).run_uri)
    store.write_bytes("spec.json", b"{not json")
    spec = jobs._resolved_spec_for_resume(registry.get(job_id), store)
    assert spec["run_id"] == job_id and spec["output_uri"].endswith("/output")

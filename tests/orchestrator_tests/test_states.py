"""Job states and attempt outcomes are enums, stored as their plain values; older registries still read."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from orchestrator.registry import TERMINAL, JobState, Outcome, Registry
from orchestrator.states import AttemptEnd
from orchestrator.views import status as job_status

#: the attempts table before outcomes were stored
OLD_ATTEMPTS = """
CREATE TABLE attempts (
    job_id TEXT NOT NULL, n INTEGER NOT NULL, started_at REAL NOT NULL, ended_at REAL, pid INTEGER,
    exit_code INTEGER, end_reason TEXT, start_step INTEGER, end_step INTEGER, first_step_at REAL,
    instance TEXT, spot INTEGER, hourly_usd REAL NOT NULL DEFAULT 0, PRIMARY KEY (job_id, n)
);
"""


def test_values_are_plain_strings_in_json_and_sqlite(tmp_path: Path) -> None:
    assert json.dumps({"state": JobState.RUNNING, "outcome": Outcome.PREEMPTED}) == (
        '{"state": "RUNNING", "outcome": "preempted"}'
    )
    assert f"{JobState.STOPPED}" == "STOPPED" and "FAILED" in TERMINAL and JobState.FAILED.terminal
    registry = Registry(tmp_path / "home")
    registry.create_job("j-1", "j", "local", str(tmp_path / "run"), str(tmp_path / "out"), {})
    registry.set_state("j-1", JobState.RUNNING)
    registry.start_attempt("j-1", 0)
    end = AttemptEnd.of(Outcome.FAILED, "the trainer refused the job")
    registry.update_attempt("j-1", 1, ended_at=1.0, end_reason=end.reason, outcome=end.outcome)
    with sqlite3.connect(registry.path) as db:
        assert db.execute("SELECT state FROM jobs").fetchone() == ("RUNNING",)
        assert db.execute("SELECT outcome, end_reason FROM attempts").fetchone() == (
            "failed",
            "failed: the trainer refused the job",
        )
    attempt = registry.attempts("j-1")[0]
    assert attempt.outcome is Outcome.FAILED and registry.get("j-1").state is JobState.RUNNING


def test_a_registry_from_before_outcomes_is_migrated_and_its_prose_read_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with sqlite3.connect(home / "registry.db") as db:
        db.executescript(OLD_ATTEMPTS)
    registry = Registry(home)  # adds the outcome column
    registry.create_job("old-1", "old", "local", str(tmp_path / "run"), str(tmp_path / "out"), {})
    reasons = [
        "preempted (with notice, step 40)",
        "crashed (exit code 1); restart 1 of 2",
        "switch to on-demand at trace tick 3: safety net",
        "supervisor lost",
        "budget: $0.5 spent",
        "succeeded",
    ]
    for n, reason in enumerate(reasons, start=1):
        registry.start_attempt("old-1", 0)
        with sqlite3.connect(registry.path) as db:  # written the old way: prose only
            db.execute("UPDATE attempts SET ended_at = ?, end_reason = ? WHERE n = ?", (float(n), reason, n))
    outcomes = [a.outcome for a in registry.attempts("old-1")]
    assert outcomes == [
        Outcome.PREEMPTED, Outcome.CRASHED, Outcome.SWITCH, Outcome.LOST, Outcome.BUDGET, Outcome.SUCCEEDED,
    ]  # fmt: skip
    registry.set_state("old-1", JobState.SUCCEEDED)
    row = job_status.job_row(registry, registry.get("old-1"), progress={})
    assert row["preemptions"] == 1 and row["stop_reason"] == "succeeded"

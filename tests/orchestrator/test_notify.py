"""Notifications against a real HTTP server on 127.0.0.1 and a real shell command; failures never raise."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakejobs import add_job
from http_fakes import Hook

from orchestrator import notify
from orchestrator.registry import Registry


@pytest.fixture()
def hook() -> Iterator[Hook]:
    server = Hook()
    yield server
    server.close()


ROW = {
    "job_id": "demo-abc123",
    "name": "demo",
    "state": "SUCCEEDED",
    "step": 300,
    "total_steps": 300,
    "loss": 0.41,
    "cost_usd": 1.234,
    "preemptions": 2,
    "output_uri": "s3://b/demo-abc123/output",
}


def test_webhook_and_command_get_the_json_payload(hook: Hook, tmp_path: Path) -> None:
    out = tmp_path / "cmd.json"
    command = f'cat > {out}; echo "$FTORCH_EVENT $FTORCH_JOB_ID $FTORCH_STATE" > {tmp_path}/env.txt'
    logged: list[str] = []
    spec = {"webhook": hook.url, "command": command, "on": ["succeeded"]}
    problems = notify.send(spec, "succeeded", notify.payload("succeeded", ROW), logged.append)
    assert problems == []
    assert len(hook.received) == 1 and hook.received[0]["type"] == "application/json"
    body = hook.received[0]["body"]
    assert body["event"] == "succeeded" and body["job_id"] == "demo-abc123" and body["cost_usd"] == 1.234
    assert body["preemptions"] == 2 and body["output_uri"] == "s3://b/demo-abc123/output"
    assert "demo-abc123 SUCCEEDED" in body["text"] and "s3://b/demo-abc123/output" in body["text"]
    assert json.loads(out.read_text()) == body
    assert (tmp_path / "env.txt").read_text().split() == ["succeeded", "demo-abc123", "SUCCEEDED"]
    assert logged == ["notify succeeded: webhook ok", "notify succeeded: command ok"]


def test_only_the_events_asked_for(hook: Hook) -> None:
    spec = {"webhook": hook.url, "on": ["failed", "budget"]}
    assert notify.send(spec, "preempted", notify.payload("preempted", ROW), print) == []
    assert notify.send(None, "failed", notify.payload("failed", ROW), print) == []
    assert hook.received == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_failures_are_logged_never_raised(
    hook: Hook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify.time, "sleep", lambda _s: None)
    logged: list[str] = []
    body = notify.payload("failed", {**ROW, "state": "FAILED", "reason": "the trainer crashed 3 times"})
    assert "the trainer crashed 3 times" in body["text"]
    # nobody listening, and a command that fails: both reported, nothing raised
    spec = {
        "webhook": f"http://127.0.0.1:{_closed_port()}/x",
        "command": "echo nope >&2; exit 3",
        "on": ["failed"],
    }
    problems = notify.send(spec, "failed", body, logged.append)
    assert len(problems) == 2
    assert problems[0].startswith("webhook failed: URLError") and "Connection refused" in problems[0]
    assert problems[1] == "command failed: exit code 3: nope"
    assert any("webhook failed" in line for line in logged)
    # a server error is tried again once; a refusal (4xx) is not
    hook.status = 503
    assert notify.send({"webhook": hook.url, "on": ["failed"]}, "failed", body, logged.append)
    assert len(hook.received) == 2
    hook.status = 404
    assert notify.send({"webhook": hook.url, "on": ["failed"]}, "failed", body, logged.append)
    assert len(hook.received) == 3


def test_notify_job_builds_the_payload_from_status_and_records_it(
    hook: Hook, tmp_path: Path, ftorch_home: Path
) -> None:
    registry = Registry(ftorch_home)
    add_job(
        registry, tmp_path / "runs", "qwen-7b-sql-d4e5f6", "STOPPED", 140, total=400, budget_usd=2.0,
        reason="budget: $1.95 spent + $0.07 for the next checkpoint interval would pass budget_usd $2",
        attempts=[{"start": 0, "end": 140, "reason": "budget", "seconds": 2800}], checkpoints=[140],
    )  # fmt: skip
    with registry._connect() as db:
        db.execute(
            "UPDATE jobs SET spec_json = json_set(spec_json, '$.notify', json(?)) WHERE job_id = ?",
            (json.dumps({"webhook": hook.url, "on": ["budget"]}), "qwen-7b-sql-d4e5f6"),
        )
    assert notify.notify_job(registry, "qwen-7b-sql-d4e5f6", "budget", print) == []
    body = hook.received[0]["body"]
    assert body["event"] == "budget" and body["state"] == "STOPPED" and body["stop_reason"] == "budget"
    assert body["budget_usd"] == 2.0 and body["step"] == 140 and body["cost_usd"] > 1.9
    assert "STOPPED at its budget" in body["text"] and "resources.budget_usd" in body["text"]
    events = [e for e in registry.events("qwen-7b-sql-d4e5f6") if e["kind"] == "notify"]
    assert events[-1]["detail"] == "budget: sent"
    # not asked for: nothing sent, nothing recorded
    assert notify.notify_job(registry, "qwen-7b-sql-d4e5f6", "succeeded", print) == []
    assert len(hook.received) == 1

"""Notifications against a real HTTP server on 127.0.0.1 and a real shell command; failures never raise."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakejobs import add_job
from http_fakes import Hook

from orchestrator.backends import notify
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
        notify={"webhook": hook.url, "on": ["budget"]},
    )  # fmt: skip
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


# ---- the trainer's own sender (trainer/recording/notify.py) ---------------------------------------------------


class _Hang:
    """Accepts connections and never answers."""

    def __init__(self) -> None:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.held: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/services/T000/SECRETTOKEN"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        for conn in self.held:
            conn.close()
        self.sock.close()


def test_the_trainers_sender_is_bounded_never_raises_and_never_logs_the_url(hook: Hook) -> None:
    import time as clock

    from trainer.recording import notify as tnotify

    hang = _Hang()
    try:
        start = clock.monotonic()
        error = tnotify.post(hang.url, b"{}", timeout_s=1.0, tries=2)
        assert error is not None and clock.monotonic() - start < 2.5
        logged: list[str] = []
        spec = {"webhook": hang.url, "on": ["succeeded"]}
        assert tnotify.send_webhook(spec, "succeeded", {"event": "succeeded"}, logged.append, 1.0) is False
        assert logged and all("SECRETTOKEN" not in line and "127.0.0.1" not in line for line in logged)
    finally:
        hang.close()
    # a 404 is reported, not retried; a delivery is None
    hook.status = 404
    assert tnotify.post(hook.url, b"{}", tries=2) == "HTTP 404" and len(hook.received) == 1
    hook.status = 200
    assert tnotify.post(hook.url, b'{"a": 1}') is None and hook.received[-1]["body"] == {"a": 1}


def test_a_local_run_gets_the_trainers_own_posts_once_each(
    hook: Hook, tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    """succeeded and a preemption notice (local chaos, notice: true) come from the trainer, and 'resumed
    after 1 preemption'; the supervisor sends none of them again."""
    import time as clock

    import yaml
    from helpers import ftorch, job_dict, write_data

    from orchestrator.views import status as job_status

    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 16},
        local={"chaos": {"preempt_at_steps": [6], "notice": True, "grace_s": 20}, "hourly_usd": 3.6},
        notify={"webhook": hook.url, "on": ["succeeded", "preempted", "resumed", "failed"]},
    )  # fmt: skip
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    # steps slowed (a fault, not a slow machine): the supervisor sees step 6 while there is training left;
    # a simulated preemption that lands after the output is written is no preemption (test_reported_state)
    done = ftorch("launch", str(job_file), "--json", env={"FTORCH_FAULTS": "slow-step@500"})
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    deadline = clock.time() + 240
    while job_status.status_one(job_id)["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        assert clock.time() < deadline, job_status.status_one(job_id)
        clock.sleep(0.3)
    detail = job_status.status_one(job_id)
    assert detail["state"] == "SUCCEEDED", detail.get("reason")
    clock.sleep(0.5)  # the supervisor's last notify record
    bodies = [r["body"] for r in hook.received]
    assert [(b["event"], b["source"]) for b in bodies] == [
        ("preempted", "trainer"), ("resumed", "trainer"), ("succeeded", "trainer"),
    ], bodies  # fmt: skip
    notice, resumed, succeeded = bodies
    assert notice["state"] == "PREEMPTED" and "preemption notice" in notice["text"]
    assert notice["last_checkpoint_step"] == notice["step"] >= 6
    assert resumed["preemptions"] == 1 and "after 1 preemption" in resumed["text"]
    assert resumed["step"] == notice["step"] and resumed["attempts"] == 2
    assert succeeded["state"] == "SUCCEEDED" and succeeded["step"] == 16 and succeeded["preemptions"] == 1
    assert succeeded["output_uri"] == detail["output_uri"] and succeeded["job_id"] == job_id
    notes = [e["detail"] for e in detail["events"] if e["kind"] == "notify"]
    assert notes == [
        "preempted: webhook posted by the job itself",
        "succeeded: webhook posted by the job itself",
    ]

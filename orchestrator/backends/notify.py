"""Notifications: the job file's `notify:` section, called when a job ends, hits its budget or is preempted.

A webhook gets an HTTP POST of the JSON payload (it carries a `text` line too, which chat webhooks show);
a command runs through the shell with the payload on stdin and FTORCH_EVENT / FTORCH_JOB_ID /
FTORCH_STATE in its environment. Delivery problems are logged and recorded as `notify` events, never
raised: a broken webhook must not break a training run.

The payload and the HTTP sender are trainer/recording/notify.py's (one format, whoever sends). The job sends what it
can itself, so nothing depends on this machine being awake: the trainer posts succeeded, the budget stop,
a preemption notice and "resumed"; a SkyPilot job's event_callback posts RECOVERING, FAILED, CANCELLED.
This machine then sends only the webhook posts the job did not make (`job_sent`), and the command.
"""

from __future__ import annotations

import os
import subprocess
import time  # noqa: F401 - tests pause retries through notify.time.sleep
from collections.abc import Callable
from typing import Any

from trainer.recording.notify import EVENTS, WEBHOOK_TIMEOUT_S, message, post, sent_marker  # noqa: F401 - the API here
from trainer.recording.notify import payload as _payload
from trainer.runstore import finite_json

WEBHOOK_TRIES = 2
COMMAND_TIMEOUT_S = 60.0
#: events the trainer sends itself (trainer/recording/notify.py); the local supervisor sends them only when the
#: trainer did not deliver them (no marker in the run store)
TRAINER_EVENTS = ("succeeded", "budget", "preempted", "unhealthy")
#: events only the launching machine knows (a re-plan at `ftorch resume`): always sent from here
LAUNCHER_EVENTS = ("replanned",)


def payload(event: str, row: dict[str, Any]) -> dict[str, Any]:
    """The JSON sent (trainer/recording/notify.py's one format), sent from the launching machine."""
    return _payload(event, row, source="ftorch")


def _post(url: str, body: bytes) -> None:
    error = post(url, body, WEBHOOK_TIMEOUT_S * WEBHOOK_TRIES, WEBHOOK_TRIES)
    if error is not None:
        raise RuntimeError(error)


def _run(command: str, event: str, body: bytes, p: dict[str, Any]) -> None:
    env = {
        **os.environ,
        "FTORCH_EVENT": event,
        "FTORCH_JOB_ID": str(p.get("job_id")),
        "FTORCH_STATE": str(p.get("state")),
        "FTORCH_MESSAGE": p.get("text", ""),
    }
    done = subprocess.run(
        command, shell=True, input=body, env=env, capture_output=True, timeout=COMMAND_TIMEOUT_S
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()[-1:]
        raise RuntimeError(f"exit code {done.returncode}" + (f": {tail[0]}" if tail else ""))


def send(
    notify: dict[str, Any] | None, event: str, p: dict[str, Any], log: Callable[[str], None]
) -> list[str]:
    """Deliver `p` for `event` where the job file asks; returns what failed (logged, never raised)."""
    if not notify or event not in (notify.get("on") or ()):
        return []
    body = finite_json.dumps(p, default=str).encode()  # strict JSON: NaN and inf as null, flagged
    problems = []
    for kind, target, deliver in (
        ("webhook", notify.get("webhook"), lambda t: _post(t, body)),
        ("command", notify.get("command"), lambda t: _run(t, event, body, p)),
    ):
        if not target:
            continue
        try:
            deliver(target)
            log(f"notify {event}: {kind} ok")
        except Exception as exc:  # never fatal
            problems.append(f"{kind} failed: {exc}")
            log(f"notify {event}: {kind} failed: {exc}")
    return problems


def notify_job(registry: Any, job_id: str, event: str, log: Callable[[str], None]) -> list[str]:
    """Build the payload from the job's status row and send it; records a `notify` event. Never raises."""
    try:
        from orchestrator.backends.base import backend_for
        from orchestrator.views.job_facts import job_facts, with_fields

        job = registry.get(job_id)
        spec_notify = job.spec.get("notify")
        if not spec_notify or event not in (spec_notify.get("on") or ()):
            return []
        if spec_notify.get("webhook") and job_sent(registry, job, event):
            spec_notify = {**spec_notify, "webhook": None}
            if not spec_notify.get("command"):
                registry.event(job_id, "notify", f"{event}: webhook posted by the job itself")
                return []
        # the row `ftorch status` shows: the job's facts with its backend's (a cloud job's cost, where it runs)
        row = with_fields(job_facts(registry, job), backend_for(job.backend).status_fields(registry, job))
        problems = send(spec_notify, event, payload(event, row), log)
        registry.event(job_id, "notify", f"{event}: " + ("; ".join(problems) if problems else "sent"))
        return problems
    except Exception as exc:  # pragma: no cover - belt and braces: notifying must never break a run
        log(f"notify {event}: could not notify: {exc.__class__.__name__}: {exc}")
        return [str(exc)]


def job_sent(registry: Any, job: Any, event: str) -> bool:
    """Whether the job itself delivers `event` to the webhook, so this machine must not send it again.
    A SkyPilot job sends every event from the cloud: the trainer (succeeded, budget, a preemption
    notice) and SkyPilot's jobs controller through the task's event_callback (preempted, failed,
    cancelled). A local job's trainer leaves a marker in the run store for what it delivered."""
    if event in LAUNCHER_EVENTS:
        return False
    from orchestrator.backends.base import backend_for

    if backend_for(job.backend).job_sends_events:
        return True
    if event not in TRAINER_EVENTS:
        return False
    attempts = registry.attempts(job.job_id)
    if not attempts:
        return False
    from trainer.runstore.store import RunStore

    options = (job.spec.get("checkpoint") or {}).get("storage_options") or {}
    marker = sent_marker(attempts[-1].n, event)
    try:
        store = RunStore(job.run_uri, options, retry_seconds=5)
        if not store.exists(marker):
            return False
        store.remove_file(marker)  # taken: a later stop without a new attempt is this machine's to send
        return True
    except Exception:  # noqa: BLE001 - unknown: send (a duplicate beats a loss)
        return False

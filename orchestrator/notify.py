"""Notifications: the job file's `notify:` section, called when a job ends, hits its budget or is preempted.

A webhook gets an HTTP POST of the JSON payload (it carries a `text` line too, which chat webhooks show);
a command runs through the shell with the payload on stdin and FTORCH_EVENT / FTORCH_JOB_ID /
FTORCH_STATE in its environment. Delivery problems are logged and recorded as `notify` events, never
raised: a broken webhook must not break a training run.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

EVENTS = ("succeeded", "failed", "budget", "preempted", "cancelled")
WEBHOOK_TIMEOUT_S = 10.0
WEBHOOK_TRIES = 2
COMMAND_TIMEOUT_S = 60.0


def message(event: str, p: dict[str, Any]) -> str:
    """One human line: what happened, how far, what it cost, where the result is."""
    steps = f"step {p.get('step')}/{p.get('total_steps')}" if p.get("total_steps") else "no steps yet"
    cost = f"${(p.get('cost_usd') or 0):.2f}"
    head = f"ftorch: {p['job_id']} {event.upper() if event != 'budget' else 'STOPPED at its budget'}"
    text = f"{head} ({steps}, {cost}, {p.get('preemptions', 0)} preemptions)"
    if event == "succeeded":
        text += f"; output at {p.get('output_uri')}"
    elif event == "budget":
        text += (
            f"; budget ${p.get('budget_usd')}; `ftorch resume {p['job_id']} "
            "--set resources.budget_usd=...` continues"
        )
    elif p.get("reason"):
        text += f": {p['reason']}"
    return text


def payload(event: str, row: dict[str, Any]) -> dict[str, Any]:
    """The JSON sent: the event, the job's status fields, and a `text` line."""
    keys = (
        "job_id", "name", "backend", "state", "reason", "stop_reason", "step", "total_steps", "loss",
        "attempts", "preemptions", "cost_usd", "projected_cost_usd", "budget_usd", "run_uri", "output_uri",
        "last_checkpoint_step", "where", "market",
    )  # fmt: skip
    body = {"event": event, "at": time.time(), **{k: row.get(k) for k in keys}}
    body["text"] = message(event, body)
    return body


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json", "User-Agent": "ftorch"}
    )
    last: Exception | None = None
    for attempt in range(WEBHOOK_TRIES):
        try:
            with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as response:
                response.read()
                return
        except urllib.error.HTTPError as exc:
            last = exc
            if exc.code < 500:  # the receiver said no: asking again will not help
                break
        except (OSError, ValueError) as exc:
            last = exc
        if attempt + 1 < WEBHOOK_TRIES:
            time.sleep(1.0)
    raise RuntimeError(f"{type(last).__name__}: {last}")


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
    body = json.dumps(p, default=str).encode()
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
    """Build the payload from the job's status and send it; records a `notify` event. Never raises."""
    try:
        from orchestrator.status import job_row

        job = registry.get(job_id)
        spec_notify = job.spec.get("notify")
        if not spec_notify or event not in (spec_notify.get("on") or ()):
            return []
        row = job_row(registry, job)  # with the backend's fields (a cloud job's cost, where it runs)
        problems = send(spec_notify, event, payload(event, row), log)
        registry.event(job_id, "notify", f"{event}: " + ("; ".join(problems) if problems else "sent"))
        return problems
    except Exception as exc:  # pragma: no cover - belt and braces: notifying must never break a run
        log(f"notify {event}: could not notify: {exc.__class__.__name__}: {exc}")
        return [str(exc)]

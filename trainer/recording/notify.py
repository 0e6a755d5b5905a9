"""Notifications the job sends itself: the `notify:` webhook, from where the job runs.

The trainer knows some endings first hand (succeeded, the budget stop, a preemption notice, a resume
after preemptions) and tells the job file's webhook itself, so nothing depends on the launching laptop
being awake. What a dead trainer cannot say (SkyPilot's RECOVERING, FAILED*, CANCELLED) is sent by
SkyPilot's jobs controller through the task's `event_callback` (orchestrator/backends/skypilot_render.py),
with payloads built here too: `payload` is the one format, also used by orchestrator/backends/notify.py.

Torch-free and orchestrator-free. Delivery is bounded (WEBHOOK_TIMEOUT_S in all, even when DNS hangs),
never raises, and never logs the webhook URL (chat webhooks carry their token in it).
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from trainer.runstore import finite_json

#: replanned: `ftorch resume` moved a job that did not fit to a GPU with more memory (orchestrator/sizing/replan.py)
EVENTS = ("succeeded", "failed", "budget", "preempted", "cancelled", "resumed", "replanned")
PAYLOAD_KEYS = (
    "job_id", "name", "backend", "state", "reason", "stop_reason", "step", "total_steps", "loss",
    "attempts", "preemptions", "cost_usd", "projected_cost_usd", "budget_usd", "run_uri", "output_uri",
    "last_checkpoint_step", "where", "market",
)  # fmt: skip
WEBHOOK_TIMEOUT_S = 10.0
#: run-store folder of the trainer's deliveries, `<attempt:04d>-<event>.json`: the local supervisor does
#: not send again what the trainer delivered (orchestrator/backends/notify.py)
SENT_DIR = "notify"


def sent_marker(attempt: int, event: str) -> str:
    return f"{SENT_DIR}/{attempt:04d}-{event}.json"


def message(event: str, p: Mapping[str, Any]) -> str:
    """One human line: what happened, how far, what it cost, where the result is."""
    job = p.get("job_id")
    known = p.get("source") != "skypilot"  # SkyPilot's callback knows no steps, cost or preemptions
    facts = []
    if known or p.get("total_steps"):
        facts.append(
            f"step {p.get('step')}/{p.get('total_steps')}" if p.get("total_steps") else "no steps yet"
        )
    if known or p.get("cost_usd") is not None:
        facts.append(f"${(p.get('cost_usd') or 0):.2f}")
    if known or p.get("preemptions") is not None:
        facts.append(f"{p.get('preemptions') or 0} preemptions")
    what = {"budget": "STOPPED at its budget", "resumed": "RESUMED"}.get(event, event.upper())
    text = f"ftorch: {job} {what}" + (f" ({', '.join(facts)})" if facts else "")
    if event == "succeeded":
        text += f"; output at {p.get('output_uri')}"
    elif event == "budget":
        text += (
            f"; budget ${p.get('budget_usd')}; `ftorch resume {job} --set resources.budget_usd=...` continues"
        )
    elif p.get("reason"):
        text += f": {p['reason']}"
    return text


def payload(event: str, row: Mapping[str, Any], source: str = "ftorch") -> dict[str, Any]:
    """The JSON sent: the event, the job's status fields, who sent it (trainer, skypilot, ftorch) and a
    `text` line that chat webhooks show."""
    body = {"event": event, "at": time.time(), "source": source, **{k: row.get(k) for k in PAYLOAD_KEYS}}
    body["text"] = message(event, body)
    return body


def post(url: str, body: bytes, timeout_s: float = WEBHOOK_TIMEOUT_S, tries: int = 1) -> str | None:
    """POST `body` as JSON; None when delivered, else what went wrong (never the URL). Never raises.
    All tries together take at most about `timeout_s`: the request runs in a daemon thread, so a DNS
    lookup or a receiver that accepts and never answers cannot hold the caller longer."""
    outcome: list[str | None] = []

    def attempt() -> None:
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "ftorch"},
        )
        error: str | None = "not sent"
        for n in range(max(1, tries)):
            try:
                with urllib.request.urlopen(request, timeout=timeout_s / max(1, tries)) as response:
                    response.read()
                outcome.append(None)
                return
            except urllib.error.HTTPError as exc:
                error = f"HTTP {exc.code}"
                if exc.code < 500:  # the receiver said no: asking again will not help
                    break
            except Exception as exc:  # noqa: BLE001 - reported, never raised
                error = _describe(exc)
            if n + 1 < tries:
                time.sleep(min(1.0, timeout_s / 10))
        outcome.append(error)

    worker = threading.Thread(target=attempt, name="ftorch-notify", daemon=True)
    worker.start()
    worker.join(timeout_s + 1.0)
    if not outcome:
        return f"no answer within {timeout_s:g} s"
    return None if outcome[0] is None else scrub(outcome[0], url)


def where(url: str) -> str:
    """A webhook URL as logs may show it: scheme and host only (the path and query carry the token)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.hostname or '?'}"
    except ValueError:
        return "<webhook>"


def scrub(text: str, url: str) -> str:
    """`text` with any part of the webhook URL beyond its scheme and host removed (an error can quote
    the URL or its path, e.g. urllib's InvalidURL)."""
    from urllib.parse import urlsplit

    text = text.replace(url, where(url))
    try:
        parts = urlsplit(url)
    except ValueError:
        return "could not be sent (the URL is malformed)"
    for secret in (parts.path, parts.query, parts.fragment, parts.password or ""):
        if len(secret) > 1:
            text = text.replace(secret, "<hidden>")
            text = text.replace(repr(secret)[1:-1], "<hidden>")
    return text


def _describe(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)  # URLError: the socket error, without the URL
    text = str(reason if reason is not None else exc)
    return f"{exc.__class__.__name__}: {text}"[:200]


def send_webhook(
    notify: Mapping[str, Any] | None,
    event: str,
    body: Mapping[str, Any],
    log: Callable[[str], None],
    timeout_s: float = WEBHOOK_TIMEOUT_S,
) -> bool | None:
    """Send to the job file's webhook when `event` is asked for: True delivered, False failed (logged,
    without the URL), None not asked for."""
    if not notify or not notify.get("webhook") or event not in (notify.get("on") or ()):
        return None
    # strict JSON (NaN and inf as null, flagged): a receiver in any language parses it
    error = post(str(notify["webhook"]), finite_json.dumps(body, default=str).encode(), timeout_s)
    log(f"notify {event}: webhook " + ("ok" if error is None else f"failed: {error}"))
    return error is None


class TrainerNotifier:
    """What the trainer tells the job file's webhook (rank 0 only). Each call is bounded and never raises;
    a delivery is recorded in the run store (`sent_marker`) so the local supervisor does not repeat it."""

    def __init__(
        self,
        store: Any,
        resolved: Mapping[str, Any],
        attempt: int,
        total_steps: int,
        log: Callable[[str], None],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        job = resolved.get("job") or {}
        self.store, self.attempt, self.log = store, attempt, log
        self.notify = job.get("notify")
        self.environ = os.environ if environ is None else environ
        resources = job.get("resources") or {}
        self.row: dict[str, Any] = {
            "job_id": resolved.get("run_id"),
            "name": job.get("name"),
            "backend": resources.get("backend", "local"),
            "budget_usd": resources.get("budget_usd"),
            "run_uri": getattr(store, "run_uri", None),
            "output_uri": resolved.get("output_uri"),
            "total_steps": total_steps,
            "attempts": attempt,
        }
        self.enabled = bool(self.notify and self.notify.get("webhook"))
        if int(self.environ.get("RANK", "0")) != 0:
            self.enabled = False

    def _facts(self) -> dict[str, Any]:
        try:
            from trainer.recording.trackers import run_facts

            facts = run_facts(self.store, dict(self.environ))
        except Exception:  # noqa: BLE001 - advisory
            return {}
        out: dict[str, Any] = {}
        if "preemptions" in facts:
            out["preemptions"] = int(facts["preemptions"])
        if "cost_usd" in facts:
            out["cost_usd"] = round(facts["cost_usd"], 4)
        return out

    def send(self, event: str, **fields: Any) -> bool | None:
        """Send `event` with the job's fields; True delivered, False failed, None not asked for."""
        if not self.enabled or event not in (self.notify.get("on") or ()):
            return None
        try:
            body = payload(event, {**self.row, **self._facts(), **fields}, source="trainer")
            ok = send_webhook(self.notify, event, body, self.log)
            if ok:
                try:
                    self.store.write_json(sent_marker(self.attempt, event), {"at": body["at"]})
                except Exception:  # noqa: BLE001 - the supervisor may send again: a duplicate, not a loss
                    pass
            return ok
        except Exception as exc:  # noqa: BLE001 - notifying never breaks training
            self.log(f"notify {event}: could not notify: {exc.__class__.__name__}")
            return False

    # the trainer's events
    def resumed(self, step: int) -> bool | None:
        """After a resume from a checkpoint: 'resumed after N preemptions' (none after zero)."""
        facts = self._facts()
        n = facts.get("preemptions") or 0
        if n <= 0:
            return None
        return self.send("resumed", state="RUNNING", step=step, last_checkpoint_step=step,
                         reason=f"resumed at step {step} after {n} preemption{'s' if n != 1 else ''}")  # fmt: skip

    def stopped(self, step: int, flag_reason: str | None) -> bool | None:
        """After the checkpoint of a stop: the budget stop, or a preemption notice (not a switch or cancel)."""
        if not self.enabled:
            return None
        from trainer.stops.interruptions import how_it_ended

        ended = how_it_ended(self.store)
        if ended.get("ended") == "stopped":
            if ended.get("stop_reason") != "budget":
                return None
            return self.send(
                "budget", state="STOPPED", stop_reason="budget", step=step, last_checkpoint_step=step
            )
        return self.send(
            "preempted",
            state="PREEMPTED",
            step=step,
            last_checkpoint_step=step,
            reason=f"preemption notice ({flag_reason or 'signal'}): checkpoint at step {step} saved; "
            "the job restarts from it",
        )

    def unhealthy(self, step: int, reason: str, healthy_step: int | None) -> bool | None:
        """The health checks ended the run (trainer/health/rules.py): no launcher restarts it."""
        kept = f"newest healthy checkpoint: step {healthy_step}" if healthy_step else "no healthy checkpoint"
        return self.send(
            "unhealthy", state="UNHEALTHY", step=step, last_checkpoint_step=healthy_step,
            reason=f"unhealthy: {reason}; {kept}",
        )  # fmt: skip

    def succeeded(self, step: int, loss: float | None = None) -> bool | None:
        return self.send("succeeded", state="SUCCEEDED", step=step, last_checkpoint_step=step, loss=loss)

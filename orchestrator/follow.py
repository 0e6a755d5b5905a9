"""`launch --follow` / `resume --follow`: stream a job's progress until it ends, then summarise."""

from __future__ import annotations

import sys
import time
from typing import Any

from orchestrator import jobs
from orchestrator.registry import TERMINAL, Registry


def _write(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def follow(job_id: str, poll_s: float = 0.25) -> int:
    """Print state changes and trainer log lines as they come; 0 only if the job SUCCEEDED."""
    registry = Registry()
    job = jobs.get_job(job_id, registry)
    seen_events = 0
    offsets: dict[str, int] = {}
    try:
        while True:
            events = registry.events(job.job_id)
            for event in events[seen_events:]:
                if event["kind"] in ("state", "chaos", "crash", "resume"):
                    stamp = time.strftime("%H:%M:%S", time.localtime(event["at"]))
                    _write(f"{stamp} [ftorch] {event['kind']}: {event['detail']}")
            seen_events = len(events)
            for path in jobs.log_paths(registry, job):
                key = str(path)
                with open(path, encoding="utf-8", errors="replace") as handle:
                    handle.seek(offsets.get(key, 0))
                    text = handle.read()
                    complete, _, _rest = text.rpartition("\n")
                    if complete:
                        for line in complete.split("\n"):
                            _write(f"  {line}")
                        offsets[key] = offsets.get(key, 0) + len(complete.encode("utf-8", "replace")) + 1
            job = jobs.reconcile(registry, registry.get(job.job_id))
            if job.state in TERMINAL:
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        _write(f"\nstopped following; the job goes on. `ftorch status {job.job_id}` to check on it.")
        return 130
    _summary(jobs.status_one(job.job_id))
    return 0 if job.state == "SUCCEEDED" else 1


def _summary(detail: dict[str, Any]) -> None:
    _write("")
    _write(
        f"job {detail['job_id']}: {detail['state']}"
        + (f" ({detail['reason']})" if detail.get("reason") else "")
    )
    timeline = detail["attempt_timeline"]
    if timeline:
        wall = (timeline[-1]["ended_at"] or time.time()) - timeline[0]["started_at"]
        _write(
            f"  wall time {wall:.1f} s over {len(timeline)} attempt(s); preemptions {detail['preemptions']}"
        )
    if detail["lost_time_s"]:
        lost = ", ".join(f"{s:.1f} s" for s in detail["lost_time_s"])
        _write(f"  time lost per preemption (end of attempt -> first new step): {lost}")
    curve = detail["loss_curve"]
    if curve:
        head = sum(v for _s, v in curve[:5]) / len(curve[:5])
        tail = sum(v for _s, v in curve[-5:]) / len(curve[-5:])
        _write(
            f"  training loss: {head:.4f} (first steps) -> {tail:.4f} (last steps), {len(curve)} steps logged"
        )
    before, after = detail.get("eval_before"), detail.get("eval_after")
    if before and after:
        _write(
            f"  held-out check: loss {before['loss']:.4f} -> {after['loss']:.4f}; exact match "
            f"{before['exact_match']:.0%} -> {after['exact_match']:.0%} on {int(after['examples'])} examples"
        )
    if detail["state"] == "SUCCEEDED":
        _write(f"  trained adapter: {detail['output_uri']}")
    else:
        _write(f"  checkpoints: {detail['run_uri']}; `ftorch resume {detail['job_id']}` continues")


def watch(job_id: str | None) -> int:
    """A simple refreshing view (a richer live view comes with the status work)."""
    from orchestrator import ui

    try:
        while True:
            rows = jobs.status_all() if job_id is None else [jobs.status_one(job_id)]
            ui.clear()
            ui.print_jobs_table(rows, show_all=job_id is not None)
            if all(r["state"] in TERMINAL for r in rows):
                return 0
            time.sleep(1.0)
    except KeyboardInterrupt:
        return 0

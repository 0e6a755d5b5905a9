"""Watching jobs: `status --watch` and `launch/resume --follow`.

On a terminal both draw a live view that refreshes in place (rich Live on the alternate screen, so a
resize just redraws at the new size); piped, `--follow` streams state changes and trainer log lines.
Both end by themselves when the job ends, and Ctrl-C only stops the watching: the job goes on.
`follow()` returns the job's end state as an exit code (FOLLOW_EXIT_CODES), and ends with a summary (adapter, loss, preemptions,
held-out before/after, time lost per preemption, cost).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from orchestrator.backends.base import backend_for, get_job, reconcile
from orchestrator.logtail import LogTail
from orchestrator.registry import TERMINAL, Registry

POLL_S = 1.0
LOG_LINES = 6
#: what `launch --follow` and `resume --follow` exit with, per end state (documented in the README)
FOLLOW_EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 3, "CANCELLED": 4, "STOPPED": 5, "UNHEALTHY": 6}


def _write(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ---- the live view ------------------------------------------------------------------------------
def _log_tail(job_id: str, n: int = LOG_LINES) -> list[str]:
    """The last lines of the newest attempt's trainer log (when the backend keeps logs on this machine)."""
    registry = Registry()
    job = registry.get(job_id)
    paths = backend_for(job.backend).log_paths(registry, job)
    return LogTail(paths[-1]).last_lines(n) if paths else []


def _frame(job_id: str | None, show_all: bool, width: int, with_log: bool) -> tuple[Any, bool]:
    """(what to draw, whether everything watched has ended)."""
    from rich.console import Group
    from rich.text import Text

    from orchestrator.views import status as job_status
    from orchestrator.views.cells import WIDEST
    from orchestrator.views.job_detail import render_detail
    from orchestrator.views.jobs_table import render_jobs

    stamp = Text(f"ftorch status --watch · {time.strftime('%H:%M:%S')} · Ctrl-C stops watching", style="dim")
    if job_id is None:
        rows = job_status.status_all(savings=width >= WIDEST)
        done = all(r["state"] in TERMINAL for r in rows)
        return Group(render_jobs(rows, width, show_all), stamp), done
    detail = job_status.status_one(job_id)
    parts: list[Any] = [render_detail(detail, width)]
    if with_log:
        lines = _log_tail(detail["job_id"])
        if lines:
            parts += [Text(""), Text("log", style="bold")]
            parts += [Text(line, no_wrap=True, overflow="ellipsis", style="dim") for line in lines]
    return Group(*parts, stamp), detail["state"] in TERMINAL


def live(
    job_id: str | None,
    show_all: bool = False,
    out: Any = None,
    poll_s: float = POLL_S,
    with_log: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Redraw until everything watched has ended ("ended") or Ctrl-C ("interrupted")."""
    from rich.live import Live

    from orchestrator.views.cells import console

    out = out or console()
    frame: Any = None
    outcome = "ended"
    with _ctrl_c_remembered() as ctrl_c:
        try:
            # the first read is inside the try too: a Ctrl-C while it runs (the slowest read: imports, the
            # store) is a stop of the watching like any other, not an escaped KeyboardInterrupt (exit 130)
            frame, done = _frame(job_id, show_all, out.width, with_log)
            with Live(
                frame, console=out, screen=out.is_terminal, auto_refresh=False, transient=False
            ) as view:
                # `pressed`: a Ctrl-C whose KeyboardInterrupt a finalizer swallowed (see _CtrlC) stops too
                while not done and not ctrl_c.pressed:
                    sleep(poll_s)
                    frame, done = _frame(job_id, show_all, out.width, with_log)
                    view.update(frame, refresh=True)
        except KeyboardInterrupt:
            outcome = "interrupted"
    if ctrl_c.pressed:
        outcome = "interrupted"
    if out.is_terminal and frame is not None:  # the alternate screen is gone: the last frame stays
        out.print(frame)
    return outcome


class _CtrlC:
    """The live view's SIGINT handler: remembers the Ctrl-C, then raises KeyboardInterrupt as Python's own does.

    Remembering is the point. The interpreter drops an exception raised inside a finalizer, and a frame's
    read drops file objects whose finalizer runs Python code: fsspec's LocalFileOpener (every run-store
    read) is an io.IOBase with a Python `closed` property, which IOBase's finalizer evaluates and whose
    error it clears without a word. A Ctrl-C handled at that moment raised its KeyboardInterrupt there,
    it vanished, and the view drew on for ever; the loop now also stops on `pressed`."""

    def __init__(self) -> None:
        self.pressed = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.pressed = True
        raise KeyboardInterrupt


@contextmanager
def _ctrl_c_remembered() -> Iterator[_CtrlC]:
    """_CtrlC handles SIGINT while the live view runs (the previous handler afterwards), whatever this process
    inherited: a SIGINT that whoever started ftorch ignores (a background job of a non-interactive shell,
    and every process started under it) is ignored by Python too, and Ctrl-C, the view's one way out
    besides the job's end, did nothing. Signal handlers belong to the main thread: elsewhere, Python's."""
    ctrl_c = _CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield ctrl_c
        return
    previous = signal.signal(signal.SIGINT, ctrl_c)
    try:
        yield ctrl_c
    finally:
        # None: a handler not installed from Python (an embedding program's); Python's own then
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


def watch(job_id: str | None, show_all: bool = False, out: Any = None, poll_s: float = POLL_S) -> int:
    """`ftorch status --watch [JOB]`: 0 when the job (or every job) has ended or on Ctrl-C."""
    if job_id is not None:
        job_id = get_job(job_id).job_id
    outcome = live(job_id, show_all, out=out, poll_s=poll_s)
    if outcome == "interrupted":
        target = f"`ftorch status {job_id}`" if job_id else "`ftorch status`"
        _write(f"stopped watching; the job goes on. {target} to check on it.")
    return 0


# ---- --follow -----------------------------------------------------------------------------------
Mark = tuple[int, dict[str, int]]


def mark(job_id: str) -> Mark:
    """Where a job's history stands now (events seen, bytes of each log), so `resume --follow` prints
    only what comes after it."""
    registry = Registry()
    job = get_job(job_id, registry)
    sizes = {}
    for path in backend_for(job.backend).log_paths(registry, job):
        try:
            sizes[str(path)] = path.stat().st_size
        except OSError:
            continue
    return len(registry.events(job.job_id)), sizes


def follow(job_id: str, poll_s: float = 0.25, out: Any = None, since: Mark | None = None) -> int:
    """Follow a job until it ends, then summarise; the exit code says how it ended (FOLLOW_EXIT_CODES).
    With `since` (a `mark()`), the stream starts there instead of at the job's beginning."""
    from orchestrator.views.cells import console

    job = get_job(job_id)
    out = out or console()
    if out.is_terminal:
        if live(job.job_id, out=out, poll_s=max(poll_s, 0.5), with_log=True) == "interrupted":
            return _interrupted(job.job_id)
    else:
        try:
            _stream(job.job_id, poll_s, since)
        except KeyboardInterrupt:
            return _interrupted(job.job_id)
    from orchestrator.views import status as job_status

    detail = job_status.status_one(job.job_id)
    _summary(detail)
    return FOLLOW_EXIT_CODES.get(detail["state"], 1)


def _interrupted(job_id: str) -> int:
    _write(f"\nstopped following; the job goes on. `ftorch status {job_id}` to check on it.")
    return 130


def _stream(job_id: str, poll_s: float, since: Mark | None = None) -> None:
    """Print state changes and trainer log lines as they come, until the job ends."""
    registry = Registry()
    job = registry.get(job_id)
    backend = backend_for(job.backend)
    seen_events, offsets = since if since is not None else (0, {})
    tails: dict[str, LogTail] = {}
    while True:
        events = registry.events(job.job_id)
        for event in events[seen_events:]:
            if event["kind"] in ("state", "chaos", "crash", "resume", "budget", "notify"):
                stamp = time.strftime("%H:%M:%S", time.localtime(event["at"]))
                _write(f"{stamp} [ftorch] {event['kind']}: {event['detail']}")
        seen_events = len(events)
        for path in backend.log_paths(registry, job):
            key = str(path)
            if key not in tails:
                tails[key] = LogTail(path, offset=offsets.get(key, 0))
            for line in tails[key].read_lines():
                _write(f"  {line}")
        job = reconcile(registry, registry.get(job.job_id))
        if job.state in TERMINAL:
            return
        time.sleep(poll_s)


def _summary(detail: dict[str, Any]) -> None:
    from orchestrator.views.format import money

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
        _write(f"  time lost per preemption (steps redone + end of attempt -> first new step): {lost}")
    cost = f"  cost {money(detail['cost_usd'])}"
    if detail.get("budget_usd") is not None:
        cost += f" of a {money(detail['budget_usd'])} budget"
    if detail["state"] != "SUCCEEDED" and detail.get("projected_cost_usd") is not None:
        cost += f"; projected to finish: {money(detail['projected_cost_usd'])}"
    _write(cost)
    curve = detail["loss_curve"]
    if curve:
        from trainer.outputs.model_card import loss_ends  # the card's definition (one for both)

        head, tail = loss_ends([v for _s, v in curve])
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
    elif detail.get("stop_reason") == "budget":
        _write(
            f"  stopped at the budget; checkpoints: {detail['run_uri']}; "
            f"`ftorch resume {detail['job_id']} --set resources.budget_usd=...` continues"
        )
    else:
        _write(f"  checkpoints: {detail['run_uri']}; `ftorch resume {detail['job_id']}` continues")

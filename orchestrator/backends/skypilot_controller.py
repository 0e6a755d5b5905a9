"""Wiring of the cloud controller (orchestrator/controller.py) into the SkyPilot backend.

The backend calls `tasks_for` / `save_tasks` / `spawn` at launch (and resume); `dry_run_lines` shows the
controller's plan in `launch --dry-run`; `python -m orchestrator.backends.skypilot_controller JOB_ID`
is the controller process: detached on the user's machine by default, or on any always-on machine that
shares the same FTORCH_HOME registry, SkyPilot API server and run store (docs/policies.md, "On a cloud").
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.controller import (  # noqa: F401 - read_state, write_state, status_fields: for the backend
    SWITCHING,
    Config,
    Controller,
    Plan,
    SdkClient,
    read_state,
    split_resources,
    status_fields,
    write_state,
)
from orchestrator.policy import Mode


def describe_plan(
    policy_name: str, tasks: Mapping[Mode, Mapping[str, Any]], config: Config | None = None
) -> list[str]:
    """The controller's plan for `launch --dry-run`."""
    config = config or Config()
    lines = [f"controller: policy {policy_name}, runs in the detached supervisor on this machine"]
    if policy_name not in SWITCHING:
        lines.append("  nothing to switch: SkyPilot's own recovery keeps the job on one resources list")
        return lines
    for mode in (Mode.SPOT, Mode.ON_DEMAND):
        entries = tasks.get(mode, {}).get("resources", {}).get("ordered", [])
        text = ", ".join(f"{e['infra']} {next(iter(e['accelerators']))}" for e in entries) or "none"
        lines.append(f"  {mode.value} list: {text}")
    lines.append(
        f"  every {config.tick_s:g} s: read SkyPilot's queue and the run store's progress, ask the policy;"
        " to switch: ask the trainer to checkpoint (run store control/stop.json), cancel, relaunch"
        " with the other list"
    )
    lines.append(
        f"  spot counts as missing when a spot launch is not running after {config.spot_wait_s:g} s;"
        f" tried again {config.spot_retry_s:g} s later when the policy allows"
    )
    return lines


TASKS_FILE = "controller_tasks.json"


def policy_of(spec: Any) -> str:
    from orchestrator.policy import policy_name_for

    return policy_name_for(spec.resources)


def tasks_for(
    spec: Any, job_id: str, run_uri: str, task: Mapping[str, Any], render_job: Callable[..., Any]
) -> dict[Mode, dict[str, Any]]:
    """Both resources lists of a switching job: its own entries split by kind; when it has no on-demand
    entries (no `fallback: on-demand`), the plan's on-demand offers are added."""
    if policy_of(spec) not in SWITCHING:
        return {}
    tasks = split_resources(task)
    if Mode.ON_DEMAND not in tasks:
        wider = spec.model_copy(deep=True)
        wider.resources.fallback = "on-demand"
        _plan, full = render_job(wider, job_id, run_uri)  # skypilot.render_job
        entries = [e for e in full["resources"]["ordered"] if not e.get("use_spot")]
        if entries:
            extra = json.loads(json.dumps(task))
            extra["resources"]["ordered"] = entries
            tasks[Mode.ON_DEMAND] = extra
    return tasks


def dry_run_lines(
    spec: Any, job_id: str, run_uri: str, task: Mapping[str, Any], render_job: Callable[..., Any]
) -> list[str]:
    """The controller's plan for `launch --dry-run` (offline: no SkyPilot call)."""
    name = policy_of(spec)
    tasks = tasks_for(spec, job_id, run_uri, task, render_job)
    lines = describe_plan(name, tasks)
    if name == "deadline" and spec.resources.deadline:
        lines.insert(1, f"  deadline: {spec.resources.deadline} (uniform progress with a safety net)")
    return lines


def save_tasks(
    job_dir: Any, tasks: Mapping[Mode, Mapping[str, Any]], restart_overhead_s: float, work_s: float
) -> None:
    payload = {
        "tasks": {m.value: t for m, t in tasks.items()},
        "restart_overhead_s": restart_overhead_s,
        "work_s": work_s,
    }
    path = job_dir / TASKS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(payload, handle)


def start(registry: Any, job: Any, sky_job_id: int) -> int:
    """After the first launch (the spot list): record it as the controller's, start the controller."""
    import time

    job_dir = registry.job_dir(job.job_id)
    state = read_state(job_dir)
    now = time.time()
    state.update(mode=Mode.SPOT.value, sky_job_id=sky_job_id, launched_at=now, down_since=now)
    state.update(pending=None, ended=None, heartbeat_at=now)
    launch = {"sky_job_id": sky_job_id, "mode": Mode.SPOT.value, "at": now, "why": "launch"}
    state.setdefault("launches", []).append(launch)
    write_state(job_dir, state)
    return spawn(registry, job)


def spawn(registry: Any, job: Any) -> int:
    """Start the job's controller, detached from the terminal (like the local supervisor); its pid."""
    from orchestrator import procs

    proc = procs.spawn_detached(
        "orchestrator.backends.skypilot_controller",
        job.job_id,
        registry.job_dir(job.job_id) / "controller.log",
        registry.home,
    )
    return proc.pid


def registry_hooks(registry: Any, job_id: str) -> tuple[Any, Any]:
    """Callbacks that keep the registry in step: each launch recorded (the attempt it ends gets the
    switch's reason), and SkyPilot's record applied every tick (state, attempts, cost)."""
    import time

    from orchestrator.backends import skypilot_state
    from orchestrator.states import Outcome

    def on_launch(sky_job_id: int, mode: Mode, why: str) -> int:
        note = f"controller: switched to {mode.value}: {why}"
        for attempt in registry.attempts(job_id):  # its managed job was cancelled for this launch
            if attempt.ended_at is None:
                registry.update_attempt(
                    job_id, attempt.n, ended_at=time.time(), end_reason=note, outcome=Outcome.SWITCH
                )
        skypilot_state.record_launch(registry, registry.get(job_id), sky_job_id, note)
        return len(registry.attempts(job_id)) + 1

    def on_record(record: dict[str, Any] | None) -> None:
        if record is not None:
            skypilot_state.apply_record(registry, registry.get(job_id), record)

    return on_launch, on_record


def for_job(job_id: str) -> Controller:
    """The controller of a launched job, from the registry and what the backend saved at launch."""
    from orchestrator.backends import skypilot_render as render
    from orchestrator.policy import make_policy
    from orchestrator.registry import Registry
    from trainer.config import JobSpec, deadline_seconds
    from trainer.store import RunStore

    registry = Registry()
    job = registry.get(job_id)
    spec = JobSpec.model_validate(job.spec)
    job_dir = registry.job_dir(job.job_id)
    saved = json.loads((job_dir / TASKS_FILE).read_text(encoding="utf-8"))
    deadline = None
    if spec.resources.deadline:
        from datetime import datetime, timezone

        launched = datetime.fromtimestamp(job.created_at, timezone.utc)
        deadline = job.created_at + deadline_seconds(spec.resources.deadline, now=launched)
    plan = Plan(
        job_id=job.job_id,
        policy=make_policy(policy_of(spec)),
        tasks={Mode(k): v for k, v in saved["tasks"].items()},
        start_s=job.created_at,
        deadline_s=deadline,
        restart_overhead_s=float(saved["restart_overhead_s"]),
        work_s_hint=float(saved["work_s"]),
    )
    options = job.spec.get("checkpoint", {}).get("storage_options") or {}
    store = RunStore(job.run_uri, options, retry_seconds=30)

    on_launch, on_record = registry_hooks(registry, job.job_id)
    client = SdkClient(render.secret_names(spec))
    return Controller(plan, client, store, job_dir, on_launch=on_launch, on_record=on_record)


def main(argv: list[str] | None = None) -> int:
    import signal

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m orchestrator.backends.skypilot_controller JOB_ID\n")
        return 2
    controller = for_job(args[0])
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _f: stopping.append(signum))
    controller._save()
    sys.stdout.write(f"controller for {args[0]} on {controller.state['where']}\n")
    sys.stdout.flush()
    controller.run(stop=lambda: bool(stopping))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def restart_if_dead(registry: Any, job: Any) -> str | None:
    """`ftorch resume` on a cloud job that still runs: start its controller again if it died."""
    job_dir = registry.job_dir(job.job_id)
    if not (job_dir / TASKS_FILE).exists():
        return None
    fields = status_fields(job_dir).get("controller") or {}
    if fields.get("alive") or "not alive" not in str(fields.get("note") or ""):
        return None
    spawn(registry, job)
    return (
        f"{job.job_id} kept running under SkyPilot's own recovery while its controller was down;"
        " the controller is started again"
    )

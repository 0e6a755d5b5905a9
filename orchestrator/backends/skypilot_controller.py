"""Wiring of the cloud controller (orchestrator/spot/controller.py) into the SkyPilot backend.

A job gets a controller when its policy switches, when it has `resources.budget_usd` or `notify:`, or
when it has spot offers under EAGER_NEXT_REGION (a relaunch after a preemption with the lost region
last); a job with none of these runs under SkyPilot's own recovery alone.

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

from orchestrator.backends.skypilot_sdk import SdkClient
from orchestrator.spot.controller import (  # noqa: F401 - read_state, write_state, status_fields: for the backend
    RELOCATED,
    SWITCHING,
    Config,
    Controller,
    Plan,
    read_state,
    split_resources,
    status_fields,
    write_state,
)
from orchestrator.spot.policy import Mode


def describe_plan(
    policy_name: str, tasks: Mapping[Mode, Mapping[str, Any]], config: Config | None = None
) -> list[str]:
    """The controller's plan for `launch --dry-run`."""
    config = config or Config()
    if not tasks:
        return [
            f"controller: none (policy {policy_name}, no budget, no notify, no spot offer to move):"
            " SkyPilot's own recovery keeps the job on one resources list"
        ]
    lines = [f"controller: policy {policy_name}, runs in the detached supervisor on this machine"]
    if len(tasks) < 2:
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
    from orchestrator.spot.policy import policy_name_for

    return policy_name_for(spec.resources)


def needs_controller(spec: Any, task: Mapping[str, Any]) -> bool:
    """A switching policy, a budget, notifications, or spot offers to move away from a lost region."""
    from orchestrator.spot.controller import recovery_strategy

    spot = any(e.get("use_spot") for e in task["resources"]["ordered"])
    eager = recovery_strategy(task) == "EAGER_NEXT_REGION"
    return bool(
        policy_of(spec) in SWITCHING
        or spec.resources.budget_usd is not None
        or spec.notify is not None
        or (spot and eager)
    )


def single_list(spec: Any, task: Mapping[str, Any]) -> dict[Mode, dict[str, Any]]:
    """The one resources list of a job whose controller never switches; {} when it needs none."""
    if not needs_controller(spec, task):
        return {}
    spot = any(e.get("use_spot") for e in task["resources"]["ordered"])
    return {Mode.SPOT if spot else Mode.ON_DEMAND: json.loads(json.dumps(task))}


def tasks_for(
    spec: Any, job_id: str, run_uri: str, task: Mapping[str, Any], render_job: Callable[..., Any]
) -> dict[Mode, dict[str, Any]]:
    """Both resources lists of a switching job: its own entries split by kind; when it has no on-demand
    entries (no `fallback: on-demand`), the plan's on-demand offers are added. Other jobs: `single_list`."""
    if policy_of(spec) not in SWITCHING:
        return single_list(spec, task)
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
    for split in tasks.values():  # the controller moves the job back to spot: the trainer must not probe
        # from an on-demand-only list (trainer/stops/spot_probe.py)
        (split.get("envs") or {}).pop("FTORCH_SPOT_RETURN", None)
    return tasks


def dry_run_lines(
    spec: Any, job_id: str, run_uri: str, task: Mapping[str, Any], render_job: Callable[..., Any]
) -> list[str]:
    """The controller's plan for `launch --dry-run` (offline: no SkyPilot call)."""
    name = policy_of(spec)
    tasks = tasks_for(spec, job_id, run_uri, task, render_job)
    if len(tasks) == 1 and name in SWITCHING:
        tasks = single_list(spec, task)
    lines = describe_plan(name, tasks)
    if name == "deadline" and spec.resources.deadline:
        lines.insert(1, f"  deadline: {spec.resources.deadline} (uniform progress with a safety net)")
    if tasks:
        lines.extend(watch_lines(spec, task))
    return lines


def watch_lines(spec: Any, task: Mapping[str, Any], config: Config | None = None) -> list[str]:
    """The budget, notification and region plan of a job's controller (for `launch --dry-run`)."""
    from orchestrator.spot.controller import recovery_strategy

    config = config or Config()
    lines = []
    if spec.resources.budget_usd is not None:
        lines.append(
            f"  budget: ${spec.resources.budget_usd:g}; every {config.tick_s:g} s the spend (price of the"
            " placement x SkyPilot's running time) is written to the run store (control/spend.json);"
            " when it plus the next checkpoint interval would pass the budget: checkpoint (run store"
            f" control/stop.json, at most {config.stop_timeout_s:g} s), cancel, STOPPED (budget)"
        )
    if spec.notify is not None:
        targets = [k for k in ("webhook", "command") if getattr(spec.notify, k)]
        lines.append(f"  notify: {' and '.join(targets) or 'nothing'} on {', '.join(spec.notify.on)}")
    if recovery_strategy(task) == "EAGER_NEXT_REGION" and any(
        e.get("use_spot") for e in task["resources"]["ordered"]
    ):
        lines.append(
            "  after a preemption: cancel the recovering job, relaunch with the lost region's offers last"
        )
    return lines


def save_tasks(
    job_dir: Any,
    tasks: Mapping[Mode, Mapping[str, Any]],
    restart_overhead_s: float,
    work_s: float,
    regions: Mapping[str, list[str]] | None = None,
) -> None:
    payload = {
        "tasks": {m.value: t for m, t in tasks.items()},
        "restart_overhead_s": restart_overhead_s,
        "work_s": work_s,
        "switching": len(tasks) > 1,
        "regions": dict(regions or {}),
    }
    path = job_dir / TASKS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(payload, handle)


def start(registry: Any, job: Any, sky_job_id: int, mode: Mode = Mode.SPOT) -> int:
    """After the first launch (the spot list): record it as the controller's, start the controller."""
    import time

    job_dir = registry.job_dir(job.job_id)
    state = read_state(job_dir)
    now = time.time()
    state.update(mode=mode.value, sky_job_id=sky_job_id, launched_at=now, down_since=now)
    state.update(pending=None, ended=None, heartbeat_at=now, placed=None, stopped=None, ordered={})
    state.update(relocated_step=None)
    launch = {"sky_job_id": sky_job_id, "mode": mode.value, "at": now, "why": "launch"}
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
        outcome = Outcome.SWITCH
        if why.startswith(RELOCATED):  # a preemption: the recovering job was cancelled to move it
            note, outcome = f"controller: {why}", Outcome.PREEMPTED
        for attempt in registry.attempts(job_id):  # its managed job was cancelled for this launch
            if attempt.ended_at is None:
                registry.update_attempt(
                    job_id, attempt.n, ended_at=time.time(), end_reason=note, outcome=outcome
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
    from orchestrator.registry import Registry
    from orchestrator.spot.policy import make_policy
    from trainer.config import JobSpec, deadline_seconds
    from trainer.runstore.store import RunStore

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
        switching=bool(saved.get("switching", True)),
        regions=saved.get("regions") or {},
    )
    options = job.spec.get("checkpoint", {}).get("storage_options") or {}
    store = RunStore(job.run_uri, options, retry_seconds=30)
    return build(registry, job.job_id, plan, SdkClient(render.secret_names(spec)), store)


def build(registry: Any, job_id: str, plan: Plan, client: Any, store: Any, **kwargs: Any) -> Controller:
    """A job's controller with its registry hooks: attempts and cost, the budget, notifications.
    `kwargs` go to Controller (tests: config, clock, where)."""
    from orchestrator.backends.skypilot_watch import CloudBudget, event_hook
    from orchestrator.states import JobState

    on_launch, on_record = registry_hooks(registry, job_id)
    config = kwargs.pop("config", None) or Config()
    budget = CloudBudget(registry, job_id, store, config.tick_s)
    return Controller(
        plan,
        client,
        store,
        registry.job_dir(job_id),
        config=config,
        on_launch=on_launch,
        on_record=on_record,
        budget=budget,
        on_event=event_hook(registry, job_id),
        on_failed=lambda reason: registry.set_state(job_id, JobState.FAILED, reason),
        **kwargs,
    )


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

"""Wiring of the cloud controller (orchestrator/spot/controller.py) into the SkyPilot backend.

A job gets a controller when its policy switches, or when it has spot offers under EAGER_NEXT_REGION (a
relaunch after a preemption with the lost region last); a job with neither runs under SkyPilot's own
recovery alone. The budget and the notifications are no reason: the trainer stops itself at its budget
(trainer/stops/budget.py) and the job sends its own notifications (trainer/recording/notify.py, the task's
`event_callback`), with the launching machine asleep (docs/clouds.md, "With the laptop closed").

The backend calls `tasks_for` / `save_tasks` / `spawn` at launch (and resume); `dry_run_lines` shows the
controller's plan in `launch --dry-run`; `python -m orchestrator.backends.skypilot_controller JOB_ID`
is the controller process: detached on the user's machine by default, or on any always-on machine that
shares the same FTORCH_HOME registry, SkyPilot API server and run store (docs/policies.md, "On a cloud").
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.backends.skypilot_sdk import SdkClient
from orchestrator.spot.controller import RELOCATED, SWITCHING, Config, Controller, ControllerHooks, Plan
from orchestrator.spot.controller_state import STATE_RECORD, ControllerState, read_state, write_state
from orchestrator.spot.policy import Mode
from orchestrator.spot.task_resources import spot_first


def describe_plan(
    policy_name: str, tasks: Mapping[Mode, Mapping[str, Any]], config: Config | None = None
) -> list[str]:
    """The controller's plan for `launch --dry-run`."""
    config = config or Config()
    if not tasks:
        return [
            f"controller: none (policy {policy_name}, no spot offer to move):"
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
    """A switching policy, or spot offers to move away from a lost region (not the budget, not notify:
    the job does those itself)."""
    from orchestrator.spot.controller import recovery_strategy

    spot = any(e.get("use_spot") for e in task["resources"]["ordered"])
    eager = recovery_strategy(task) == "EAGER_NEXT_REGION"
    return bool(policy_of(spec) in SWITCHING or (spot and eager))


def single_list(spec: Any, task: Mapping[str, Any]) -> dict[Mode, dict[str, Any]]:
    """The one resources list of a job whose controller never switches; {} when it needs none."""
    if not needs_controller(spec, task):
        return {}
    spot = any(e.get("use_spot") for e in task["resources"]["ordered"])
    return {Mode.SPOT if spot else Mode.ON_DEMAND: json.loads(json.dumps(task))}


def tasks_for(
    spec: Any, job_id: str, run_uri: str, task: Mapping[str, Any], render_job: Callable[..., Any]
) -> dict[Mode, dict[str, Any]]:
    """Both resources lists of a switching job: SPOT is the whole task, spot first and on-demand after
    (a relaunch SkyPilot makes while the controller is away keeps its on-demand fallback), ON_DEMAND
    the on-demand entries only; when the task has no on-demand entries (no `fallback: on-demand`), the
    plan's on-demand offers are added. Other jobs: `single_list`."""
    if policy_of(spec) not in SWITCHING:
        return single_list(spec, task)
    tasks = spot_first(task)
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
    lines.extend(watch_lines(spec, task) if tasks else budget_lines(spec))
    return lines


def budget_lines(spec: Any) -> list[str]:
    """The budget, as `launch --dry-run` says it: the trainer's own stop, no controller needed."""
    if spec.resources.budget_usd is None:
        return []
    return [
        f"  budget: ${spec.resources.budget_usd:g}; the trainer stops itself (each attempt's price from the"
        " task's FTORCH_PRICES and the instance metadata, spend in the run store's epoch records): when the"
        " spend plus the next checkpoint interval would pass it, checkpoint, exit 0, STOPPED (budget)"
    ]


def reliance_line(spec: Any, task: Mapping[str, Any]) -> str | None:
    """The one line `ftorch launch` prints when the job relies on the controller for anything."""
    if not needs_controller(spec, task):
        return None
    duties = []
    if policy_of(spec) in SWITCHING:
        duties.append(f"the {policy_of(spec)} policy's waiting for spot and safety-net switch")
    if any(e.get("use_spot") for e in task["resources"]["ordered"]):
        from orchestrator.spot.controller import recovery_strategy

        if recovery_strategy(task) == "EAGER_NEXT_REGION":
            duties.append("re-bidding away from a lost region")
    return (
        "note: this job relies on the ftorch controller on this machine for "
        + " and ".join(duties)
        + "; with it asleep SkyPilot still recovers the job and the budget and notifications hold"
        " (docs/clouds.md, 'With the laptop closed')"
    )


def watch_lines(spec: Any, task: Mapping[str, Any], config: Config | None = None) -> list[str]:
    """The budget, notification and region plan of a job's controller (for `launch --dry-run`)."""
    from orchestrator.spot.controller import recovery_strategy

    config = config or Config()
    lines = budget_lines(spec)
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


def start(registry: Any, job: Any, sky_job_id: int, mode: Mode = Mode.SPOT, store: Any = None) -> int | None:
    """After the first launch (or a resume): record it as the controller's (run store and job folder),
    start the controller unless one holds the run's lease."""
    import time

    store = store or _store(job)
    job_dir = registry.job_dir(job.job_id)
    now = time.time()
    old = ControllerState.from_json(store.read_json_or_none(STATE_RECORD) or read_state(job_dir))
    state = ControllerState(
        mode=mode.value, sky_job_id=sky_job_id, launched_at=now, down_since=now, heartbeat_at=now,
        switches=old.switches, preemptions_before=old.preemptions_before,
        launches=[*old.launches, {"sky_job_id": sky_job_id, "mode": mode.value, "at": now, "why": "launch"}],
    )  # fmt: skip
    store.write_json(STATE_RECORD, state.to_json())
    write_state(job_dir, state)
    if lease_holder(store) is not None:
        return None  # the live controller (this machine's or another's) follows the new managed job
    return spawn(registry, job)


def _store(job: Any) -> Any:
    from trainer.runstore.store import RunStore

    options = job.spec.get("checkpoint", {}).get("storage_options") or {}
    return RunStore(job.run_uri, options, retry_seconds=30)


def lease_holder(store: Any, now: float | None = None) -> str | None:
    """Who holds the run's controller lease now (not expired, not released), or None."""
    import time

    from trainer.runstore.lease import Lease

    current = Lease(store, "reader", 0.0).current()
    now = time.time() if now is None else now
    return current.holder if current is not None and current.live(now) else None


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


def registry_hooks(registry: Any, job_id: str) -> ControllerHooks:
    """The hooks that keep the registry in step: each launch recorded (the attempt it ends gets the
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

    return ControllerHooks(on_launch=on_launch, on_record=on_record)


def for_job(job_id: str) -> Controller:
    """The controller of a launched job, from the registry and what the backend saved at launch."""
    from orchestrator.backends import skypilot_render as render
    from orchestrator.registry import Registry
    from orchestrator.spot.policy import make_policy
    from trainer.config import JobSpec, deadline_seconds

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
    store = _store(job)
    return build(registry, job.job_id, plan, SdkClient(render.secret_names(spec)), store)


def build(registry: Any, job_id: str, plan: Plan, client: Any, store: Any, **kwargs: Any) -> Controller:
    """A job's controller with its registry hooks: attempts and cost, notifications (the budget is the
    trainer's: trainer/stops/budget.py). `kwargs` go to Controller (tests: config, clock, where)."""
    from orchestrator.backends.skypilot_cost import is_spot
    from orchestrator.backends.skypilot_watch import event_hook
    from orchestrator.states import JobState

    hooks = dataclasses.replace(
        registry_hooks(registry, job_id),
        on_event=event_hook(registry, job_id),
        on_failed=lambda reason: registry.set_state(job_id, JobState.FAILED, reason),
        placed_spot=is_spot,
    )
    config = kwargs.pop("config", None) or Config()
    return Controller(plan, client, store, registry.job_dir(job_id), config=config, hooks=hooks, **kwargs)


def run_foreground(job_id: str, out: Any = None) -> int:
    """The job's controller in this process until the job is over (`ftorch controller JOB`, or the
    detached process `launch` starts). 0 when it ended with the job; 3 when another controller holds
    the run's lease (this one never acts)."""
    import signal

    out = out or sys.stdout
    controller = for_job(job_id)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _f: stopping.append(signum))
    out.write(f"controller for {job_id} on {controller.state.where}\n")
    out.flush()
    controller.run(stop=lambda: bool(stopping))
    if controller.yielded:
        out.write(f"controller for {job_id}: not acting: {controller.yielded}\n")
        return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m orchestrator.backends.skypilot_controller JOB_ID\n")
        return 2
    return run_foreground(args[0])


if __name__ == "__main__":
    raise SystemExit(main())


def restart_if_dead(registry: Any, job: Any, store: Any = None) -> str | None:
    """`ftorch resume` on a cloud job that still runs: start its controller again unless one holds the
    run's lease (a live one anywhere: never a second)."""
    job_dir = registry.job_dir(job.job_id)
    if not (job_dir / TASKS_FILE).exists():
        return None
    holder = lease_holder(store or _store(job))
    if holder is not None:
        return None
    spawn(registry, job)
    return (
        f"{job.job_id} kept running under SkyPilot's own recovery while its controller was down;"
        " the controller is started again"
    )

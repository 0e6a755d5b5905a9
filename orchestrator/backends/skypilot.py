"""The SkyPilot backend: ftorch jobs as SkyPilot managed jobs (launch, status, logs, cancel).

SkyPilot's jobs controller watches the job from the cloud and relaunches it on new capacity after a
preemption; ftorch decides what it may launch (the plan's offers, spot first) and how it recovers
(exit 75 = preempted with a checkpoint written). The run id is ftorch's job id, so every recovery
resumes the same run from the run store.

The parts: `skypilot_render` (plan -> task YAML), `skypilot_checks` (what must hold before a launch),
`skypilot_sdk` (every call into SkyPilot), `skypilot_state` (SkyPilot's record -> registry) and
`skypilot_cost` (SkyPilot reports no price). This module plans once per launch and ties them together.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.backends import skypilot_checks as checks
from orchestrator.backends import skypilot_controller as controller
from orchestrator.backends import skypilot_render as render
from orchestrator.backends import skypilot_replan as replan
from orchestrator.backends import skypilot_sdk as sdk
from orchestrator.backends import skypilot_state as sky_state
from orchestrator.backends.base import Backend
from orchestrator.backends.skypilot_cost import offer_prices, ondemand_price
from orchestrator.errors import SpecError, UserError, one_line
from orchestrator.registry import Job, JobState, Registry
from orchestrator.spot.egress import require_region
from orchestrator.spot.policy import Mode
from trainer.config import JobSpec
from trainer.stops.interruptions import withdraw_stop


# ---- planning and rendering ----------------------------------------------------------------------
def plan_for(spec: JobSpec, unfit: Any = None) -> Any:
    """The planner's offers (for all of resources.nodes: each candidate's layout spans every node);
    `unfit`: a re-plan after "does not fit" (orchestrator/sizing/replan.py)."""
    from orchestrator.sizing.planner import make_plan

    return make_plan(spec, offline=True, unfit=unfit)


def render_job(
    spec: JobSpec,
    job_id: str,
    run_uri: str,
    environ: Mapping[str, str] | None = None,
    unfit: Any = None,
    lock: str | None = None,
) -> tuple[Any, dict[str, Any]]:
    """(plan, task config) for a job; SpecError when the job cannot run on a cloud. `lock`: the run's
    environment lock from its store (a resume installs what the run started with)."""
    render.require_remote(spec)
    plan = plan_for(spec, unfit)
    return plan, render.render_task(spec, job_id, run_uri, plan, environ, lock=lock)


@dataclass(frozen=True)
class Launch:
    """A planned, rendered and checked launch: what `start` submits (planned once, at `prepare`)."""

    plan: Any
    task: dict[str, Any]
    unfit: Any = None  # a re-plan after "does not fit": every render of this launch refuses those GPUs
    lock: str | None = None  # the run's environment lock (None: the one the launch writes)


def prepare(spec: JobSpec, job_id: str, run_uri: str) -> Launch:
    """Render and preflight a launch. Nothing is recorded when this fails."""
    plan, task = render_job(spec, job_id, run_uri)
    checked = checks.preflight(spec, run_uri, task)  # an unreachable store is said as such first
    require_region(spec, plan.candidates)  # spending money where the store's region decides the offer
    return Launch(plan, checked)


def _withdraw_stop(job: Job) -> None:
    """A launch or resume is a fresh decision: no stop request (of a cancel or switch killed midway)
    stays in force for the new attempts (trainer/stops/interruptions.py request_in_force)."""
    try:
        withdraw_stop(job.run_store())
    except Exception:  # noqa: BLE001 - a store not made yet holds no request
        pass


def _run_lock(job: Job) -> str | None:
    """The run's lock (env/lock.txt), which every attempt installs; None for a run launched before locks."""
    from orchestrator.jobfile.envlock import read_lock

    try:
        return read_lock(job.run_store())[0]
    except Exception:  # noqa: BLE001 - unreadable now: render the lock a launch writes
        return None


def start(registry: Registry, job: Job, launch: Launch | None = None) -> int:
    """Submit the job as a SkyPilot managed job; returns SkyPilot's job id. Fails as one line.
    Without `launch` (a resume), plans and checks here, as `prepare` does at launch."""
    spec = JobSpec.model_validate(job.spec)
    replanning = None
    try:
        if launch is None:
            replanning = replan.pending(registry, job)  # it ended "does not fit": plan with its peak
            unfit = replanning.unfit if replanning else None
            lock = _run_lock(job)
            plan, rendered = render_job(spec, job.job_id, job.run_uri, unfit=unfit, lock=lock)
            require_region(spec, plan.candidates)
            launch = Launch(plan, checks.usable_task(spec, rendered), unfit, lock)
        tasks = _controller_tasks(registry, job, spec, launch)
        first = tasks.get(Mode.SPOT, launch.task) if len(tasks) > 1 else launch.task
        _withdraw_stop(job)
        sky_state.clear_refusal(job)
        sky_job_id = sdk.submit(job.job_id, first, render.secret_names(spec))
    except (UserError, SpecError) as exc:
        registry.set_state(job.job_id, JobState.FAILED, f"launch failed: {exc}")
        raise
    except Exception as exc:
        reason = f"SkyPilot launch failed: {one_line(exc)}"
        registry.set_state(job.job_id, JobState.FAILED, reason)
        raise UserError(reason) from None
    note = f"SkyPilot managed job {sky_job_id}"
    sky_state.record_launch(registry, job, sky_job_id, note, offer_prices(launch.plan))
    if replanning is not None:  # never silently on another class: status, an event, a notification
        replan.announce(registry, registry.get(job.job_id), replanning, launch.plan)
    if tasks:
        controller.start(registry, job, sky_job_id, Mode.SPOT if Mode.SPOT in tasks else Mode.ON_DEMAND)
        line = controller.reliance_line(spec, launch.task)  # what is lost with this machine asleep
        if line:
            sys.stderr.write(line + "\n")
    return sky_job_id


def _controller_tasks(
    registry: Registry, job: Job, spec: JobSpec, launch: Launch
) -> dict[Mode, dict[str, Any]]:
    """The resources lists of the job's controller (saved for it): both kinds for a policy that
    switches, the launch's one list for a job that has a controller for its budget, notifications or
    regions (skypilot_controller.needs_controller); {} when the job needs no controller."""
    # a switch re-renders as the launch did (the same offers refused, the same lock)
    renderer = functools.partial(render_job, unfit=launch.unfit, lock=launch.lock)
    tasks = controller.tasks_for(spec, job.job_id, job.run_uri, launch.task, renderer)
    if Mode.ON_DEMAND in tasks and Mode.SPOT in tasks:
        try:
            tasks[Mode.ON_DEMAND] = checks.restrict_to_clouds(tasks[Mode.ON_DEMAND], sdk.enabled_clouds())
        except UserError:
            tasks.pop(Mode.ON_DEMAND)
    if Mode.ON_DEMAND not in tasks or Mode.SPOT not in tasks:  # one list: the launch's
        tasks = controller.single_list(spec, launch.task)
    if not tasks:
        return {}
    chosen = launch.plan.chosen
    controller.save_tasks(
        registry.job_dir(job.job_id),
        tasks,
        float(getattr(chosen, "restart_overhead_s", 300.0) or 300.0),
        float(getattr(chosen, "est_hours", 0.0) or 0.0) * 3600.0,
        render.regions_of(launch.plan),
    )
    return tasks


# ---- dry run -----------------------------------------------------------------------------------------
def plan_record(plan: Any) -> dict[str, Any]:
    """The chosen offer and the top ones, as `launch --dry-run` shows them and the run store keeps them."""
    return {
        "chosen": plan.chosen.to_json() if plan.chosen else None,
        "top_offers": render.plan_table(plan),
        "candidates": len(plan.candidates),
        "rejected": len(plan.rejected),
        "catalog": plan.catalog_source,
    }


def hide(value: Any, secret: str | None, label: str) -> Any:
    """`value` (nested dicts, lists, strings) with every occurrence of `secret` replaced by `label`."""
    if not secret:
        return value
    if isinstance(value, str):
        return value.replace(secret, label)
    if isinstance(value, dict):
        return {k: hide(v, secret, label) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(hide(v, secret, label) for v in value)
    return value


def dry_run(spec: JobSpec, job_id: str, run_uri: str) -> dict[str, Any]:
    """What `launch --dry-run` shows: the plan and the task YAML. Nothing is written or launched.
    It refuses what a real launch refuses (a dry run that renders a job the launch rejects misleads)."""
    plan, task = render_job(spec, job_id, run_uri)
    secret = spec.notify.webhook if spec.notify else None
    task = hide(task, secret, "<hidden: notify.webhook>")  # its URL holds the chat's token (S3)
    return {
        "controller": hide(
            controller.dry_run_lines(spec, job_id, run_uri, task, render_job), secret, "<hidden>"
        ),
        "plan": plan_record(plan),
        "template": render.template_of(task),
        "task": task,
        "task_yaml": render.to_yaml(task),
    }


def format_dry_run(result: Mapping[str, Any]) -> str:
    """Human output for `launch --dry-run` with the skypilot backend: the plan, then the task YAML."""
    lines = [f"job {result['job_id']} (dry run: nothing launched)", f"run store: {result['run_uri']}"]
    plan = result["plan"]
    lines.append(f"plan ({plan['candidates']} adequate offers, {plan['rejected']} rejected):")
    for row in plan["top_offers"]:
        kind = "spot" if row["spot"] else "on-demand"
        lines.append(
            f"  {row['cloud']:<7} {row['instance_type']:<22} {row['gpus']:<24} {kind:<9} "
            f"${row['hourly_usd']:>7.3f}/h  ~{row['est_hours']:.1f} h  expected ${row['expected_cost_usd']:.2f}"
        )
        if row.get("layout"):
            lines.append(f"          layout: {row['layout']}")
    lines.extend(result.get("controller") or [])
    lines.append(f"task template: task_templates/{result['template']}.yaml")
    lines.append("---")
    lines.append(result["task_yaml"].rstrip())
    return "\n".join(lines) + "\n"


# ---- the backend -------------------------------------------------------------------------------------
def reconcile(registry: Registry, job: Job) -> Job:
    """Refresh a cloud job from SkyPilot's queue; on trouble, keep the last known state."""
    if job.state.terminal or not job.backend_job_id:
        return job
    try:
        records = sdk.queue([int(job.backend_job_id)])
    except sdk.SkyUnavailable as exc:
        sys.stderr.write(f"warning: {exc}\n")
        return job
    record = next((r for r in records if str(r.get("job_id")) == job.backend_job_id), None)
    return sky_state.apply_record(registry, job, record)


def adopt(registry: Registry, job: Job) -> str | None:
    """An adopted run's managed job, found by name (the job id) in SkyPilot's queue: the newest one is
    followed from now on. When the API server cannot be reached the job keeps its state from the store."""
    try:
        records = [r for r in sdk.queue() if r.get("job_name") == job.job_id]
    except sdk.SkyUnavailable as exc:
        return f"note: state from the run store only; {exc}"
    if not records:
        return "note: SkyPilot lists no managed job named " + job.job_id + "; state from the run store"
    record = max(records, key=lambda r: int(r.get("job_id") or 0))
    sky_state.record_launch(
        registry, job, int(record["job_id"]), f"adopted: SkyPilot managed job {record['job_id']}"
    )
    sky_state.apply_record(registry, registry.get(job.job_id), record)
    return f"following SkyPilot managed job {record['job_id']} ({record.get('status')})"


class SkyPilotBackend(Backend):
    name = "skypilot"
    has_controller = True  # orchestrator/backends/skypilot_controller.py
    #: the trainer (succeeded, budget, a preemption notice) and SkyPilot's jobs controller through the
    #: task's event_callback (preempted, failed, cancelled) send every event from the cloud
    job_sends_events = True
    remote = True

    def check(self, spec: JobSpec, job_id: str, run_uri: str) -> dict[str, Any]:
        """The plan and the task template a launch would use."""
        plan, task = render_job(spec, job_id, run_uri)
        chosen = plan.chosen
        cheapest = None
        if chosen is not None:
            cheapest = (
                f"{chosen.count}x {chosen.accelerator} on {chosen.cloud}, ~${chosen.expected_cost_usd:.2f}"
            )
        return {
            "plan": {
                "adequate_offers": len(plan.candidates),
                "cheapest": cheapest,
                "template": render.template_of(task),
            }
        }

    def dry_run(self, spec: JobSpec, job_id: str, run_uri: str) -> dict[str, Any]:
        return dry_run(spec, job_id, run_uri)

    def format_dry_run(self, result: dict[str, Any]) -> str:
        return format_dry_run(result)

    def prepare(self, spec: JobSpec, job_id: str, run_uri: str) -> Launch:
        return prepare(spec, job_id, run_uri)

    def plan_record(self, prepared: Any) -> dict[str, Any] | None:
        return plan_record(prepared.plan) if isinstance(prepared, Launch) else None

    def start(self, registry: Registry, job: Job, prepared: Any = None) -> None:
        start(registry, job, prepared)

    def reconcile(self, registry: Registry, job: Job) -> Job:
        return reconcile(registry, job)

    def status_fields(self, registry: Registry, job: Job) -> dict[str, Any]:
        return sky_state.status_fields(registry, job)

    def ondemand_hourly_usd(self, registry: Registry, job: Job) -> float | None:
        return ondemand_price(sky_state.read_state(registry, job))

    def attempt_times(self, registry: Registry, job: Job) -> dict[int, dict[str, float]]:
        return sky_state.attempt_times(sky_state.read_state(registry, job))

    def print_logs(self, registry: Registry, job: Job, follow: bool) -> None:
        if not job.backend_job_id:
            raise UserError(f"JOB: {job.job_id} was never submitted to SkyPilot; nothing to show")
        sdk.tail_logs(job.backend_job_id, follow)

    def resume_running(self, registry: Registry, job: Job) -> str | None:
        return controller.restart_if_dead(registry, job)

    def adopt(self, registry: Registry, job: Job) -> str | None:
        return adopt(registry, job)

    def cancel(self, registry: Registry, job: Job) -> str:
        """Ask the trainer to checkpoint through the run store, wait for it (at most 10 min), then
        cancel the managed job (the controller's stop-then-cancel: one implementation)."""
        if not job.backend_job_id:
            registry.set_state(job.job_id, JobState.CANCELLED, "cancelled by the user before SkyPilot had it")
            return f"{job.job_id} CANCELLED"
        return cancel_job(registry, job)


def cancel_job(registry: Registry, job: Job, client: Any = None, store: Any = None, **wait: Any) -> str:
    """`ftorch cancel` on a SkyPilot job: checkpoint first (bounded wait), then cancel; the run store
    keeps the checkpoints. `client`/`store`/`wait` are for tests (a SkyPilot double, a clock)."""
    from orchestrator.spot.controller import stop_then_cancel

    spec = JobSpec.model_validate(job.spec)
    if store is None:
        from trainer.runstore.store import RunStore

        options = job.spec.get("checkpoint", {}).get("storage_options") or {}
        store = RunStore(job.run_uri, options, retry_seconds=30)
    client = client or sdk.SdkClient(render.secret_names(spec))
    sys.stderr.write(f"{job.job_id}: asking the trainer to checkpoint before cancelling (at most 10 min)\n")
    outcome = stop_then_cancel(client, store, int(job.backend_job_id or 0), "cancelled by the user", **wait)
    if outcome["saved"]:
        how = f"checkpoint saved after {outcome['waited_s']:g} s"
    elif outcome["asked_checkpoint"]:
        how = f"no checkpoint seen within {outcome['waited_s']:g} s; cancelled anyway"
    else:
        how = "it was not running: nothing to save"
    registry.set_state(job.job_id, JobState.CANCELLED, f"cancelled by the user ({how}); checkpoints kept")
    return f"{job.job_id} CANCELLED ({how}; checkpoints kept in {job.run_uri})"

"""The SkyPilot backend: ftorch jobs as SkyPilot managed jobs (launch, status, logs, cancel).

SkyPilot's jobs controller watches the job from the cloud and relaunches it on new capacity after a
preemption; ftorch decides what it may launch (the plan's offers, spot first) and how it recovers
(exit 75 = preempted with a checkpoint written). The run id is ftorch's job id, so every recovery
resumes the same run from the run store.

`sky` is imported only inside the functions that need it (the CLI stays fast, and SkyPilot is an
optional extra). Secret values are read from the environment inside `start` and handed to the SDK;
they are never written to the registry, the run store, logs or output.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

from orchestrator.backends import skypilot_render as render
from orchestrator.errors import SpecError, UserError
from orchestrator.registry import TERMINAL, Job, Registry
from trainer.config import JobSpec, unsupported_features
from trainer.store import RunStore

#: SkyPilot ManagedJobStatus -> ftorch state
STATES = {
    "PENDING": "PENDING",
    "STARTING": "PROVISIONING",
    "RUNNING": "RUNNING",
    "RECOVERING": "RECOVERING",
    "CANCELLING": "RUNNING",
    "SUCCEEDED": "SUCCEEDED",
    "CANCELLED": "CANCELLED",
    "FAILED": "FAILED",
    "FAILED_SETUP": "FAILED",
    "FAILED_PRECHECKS": "FAILED",
    "FAILED_NO_RESOURCE": "FAILED",
    "FAILED_CONTROLLER": "FAILED",
}
QUEUE_FIELDS = [
    "job_id",
    "task_id",
    "job_name",
    "task_name",
    "status",
    "recovery_count",
    "job_duration",
    "submitted_at",
    "start_at",
    "end_at",
    "last_recovered_at",
    "cloud",
    "region",
    "zone",
    "infra",
    "resources",
    "cluster_resources",
    "accelerators",
    "failure_reason",
    "details",
]
STATE_FILE = "skypilot.json"
SKY_INSTALL = "pip install 'ftorch[skypilot]' (SkyPilot 0.14.1)"


class SkyUnavailable(UserError):
    """SkyPilot is not installed, or its API server cannot be reached."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    text = " ".join(text.split())
    return f"{exc.__class__.__name__}: {text[:limit]}" if text else exc.__class__.__name__


def _sky() -> Any:
    try:
        import sky
    except ImportError:
        raise SkyUnavailable(f"resources.backend: skypilot is not installed; {SKY_INSTALL}") from None
    return sky


# ---- planning and rendering ----------------------------------------------------------------------
def plan_for(spec: JobSpec) -> Any:
    """The planner's offers (for all of resources.nodes: each candidate's layout spans every node)."""
    from orchestrator.planner import make_plan

    return make_plan(spec, offline=True)


def render_job(
    spec: JobSpec, job_id: str, run_uri: str, environ: Mapping[str, str] | None = None
) -> tuple[Any, dict[str, Any]]:
    """(plan, task config) for a job; SpecError when the job cannot run on a cloud."""
    render.require_remote(spec)
    plan = plan_for(spec)
    return plan, render.render_task(spec, job_id, run_uri, plan, environ)


def dry_run(spec: JobSpec, job_id: str, run_uri: str) -> dict[str, Any]:
    """What `launch --dry-run` shows: the plan and the task YAML. Nothing is written or launched."""
    plan, task = render_job(spec, job_id, run_uri)
    return {
        "plan": {
            "chosen": plan.chosen.to_json() if plan.chosen else None,
            "top_offers": render.plan_table(plan),
            "candidates": len(plan.candidates),
            "rejected": len(plan.rejected),
            "catalog": plan.catalog_source,
        },
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
    lines.append(f"task template: task_templates/{result['template']}.yaml")
    lines.append("---")
    lines.append(result["task_yaml"].rstrip())
    return "\n".join(lines) + "\n"


def check_multi_gpu(task: Mapping[str, Any]) -> None:
    """Refuse multi-GPU plans while the trainer cannot shard (it would run independent copies)."""
    if render.template_of(task) == "single":
        return
    probe = JobSpec.model_validate(
        {
            "model": "x",
            "data": {"path": "x"},
            "checkpoint": {"uri": "x"},
            "train": {"micro_batch_size": 64},
            "local": {"nproc": 2},
        }
    )
    if any(field == "local.nproc" for field, _ in unsupported_features(probe)):
        raise SpecError(
            "resources.gpus",
            "the plan needs several GPUs (FSDP), which the trainer does not support yet; "
            "set resources.gpus: 1 (and resources.accelerators to a large GPU) to plan on one GPU",
        )


# ---- preflight -------------------------------------------------------------------------------------
def check_secrets(spec: JobSpec, environ: Mapping[str, str] | None = None) -> list[str]:
    environ = os.environ if environ is None else environ
    names = render.secret_names(spec, environ)
    missing = [n for n in names if not environ.get(n)]
    if missing:
        raise UserError(
            f"resources.secrets: {', '.join(missing)} not set in your environment; export "
            f"{'it' if len(missing) == 1 else 'them'} before launching (values are never stored)"
        )
    return names


def enabled_clouds() -> list[str]:
    """Clouds SkyPilot has credentials for (lower-case), through its API server."""
    sky = _sky()
    from sky.client import sdk as sky_sdk  # enabled_clouds is not exported at the top level

    try:
        clouds = sky.get(sky_sdk.enabled_clouds())
    except Exception as exc:
        raise SkyUnavailable(f"SkyPilot: cannot list enabled clouds: {one_line(exc)}") from None
    return sorted({str(c).lower().split("/")[0] for c in clouds or []})


def _cloud_of(entry: Mapping[str, Any]) -> str:
    return str(entry["infra"]).split("/")[0].lower()


def restrict_to_clouds(task: dict[str, Any], clouds: list[str]) -> dict[str, Any]:
    """Keep the offers on clouds SkyPilot can use; a one-line UserError when none is left."""
    entries = task["resources"]["ordered"]
    usable = [e for e in entries if _cloud_of(e) in clouds]
    if not usable:
        wanted = ", ".join(dict.fromkeys(_cloud_of(e) for e in entries))
        raise UserError(
            f"resources.clouds: SkyPilot has no access to {wanted} (enabled: {', '.join(clouds) or 'none'}); "
            "set up credentials and run `sky check` (see docs/clouds.md)"
        )
    task = dict(task)
    task["resources"] = {**task["resources"], "ordered": usable}
    return task


def preflight(spec: JobSpec, run_uri: str, task: dict[str, Any]) -> dict[str, Any]:
    """Before anything is recorded: secrets set, cloud access (jobs.launch has probed the store).
    Returns the usable task."""
    if spec.resources.budget_usd is not None:  # the budget guard lives in the local supervisor
        raise SpecError(
            "resources.budget_usd",
            "is not enforced for the skypilot backend yet; remove it (max_hourly_usd caps the price)",
        )
    check_multi_gpu(task)
    check_secrets(spec)
    return restrict_to_clouds(task, enabled_clouds())


def prepare(spec: JobSpec, job_id: str, run_uri: str) -> dict[str, Any]:
    """Render and preflight a launch; the task to submit. Nothing is recorded when this fails."""
    _plan, task = render_job(spec, job_id, run_uri)
    return preflight(spec, run_uri, task)


# ---- launch ----------------------------------------------------------------------------------------
def offer_prices(plan: Any) -> list[dict[str, Any]]:
    """(cloud, accelerator, count, spot) -> the cheapest hourly price among the plan's offers."""
    best: dict[tuple[Any, ...], float] = {}
    for c in plan.candidates:
        for spot, price in ((True, c.spot_hourly_usd), (False, c.ondemand_hourly_usd)):
            if price is not None:
                key = (c.cloud, c.accelerator, c.count, spot)
                best[key] = min(price, best.get(key, math.inf))
    return [
        {"cloud": k[0], "accelerator": k[1], "count": k[2], "spot": k[3], "hourly_usd": v}
        for k, v in sorted(best.items(), key=lambda kv: kv[1])
    ]


def _read_state(registry: Registry, job: Job) -> dict[str, Any]:
    path = registry.job_dir(job.job_id) / STATE_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_state(registry: Registry, job: Job, state: dict[str, Any]) -> None:
    path = registry.job_dir(job.job_id) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def start(registry: Registry, job: Job, task: dict[str, Any] | None = None) -> int:
    """Submit the job as a SkyPilot managed job; returns SkyPilot's job id. Fails as one line."""
    spec = JobSpec.model_validate(job.spec)
    try:
        plan, rendered = render_job(spec, job.job_id, job.run_uri)
        if task is None:  # resume: the checks launch did before recording the job
            check_multi_gpu(rendered)
            check_secrets(spec)
            task = restrict_to_clouds(rendered, enabled_clouds())
        sky_job_id = _submit(job.job_id, task, render.secret_names(spec))
    except (UserError, SpecError) as exc:
        registry.set_state(job.job_id, "FAILED", f"launch failed: {exc}")
        raise
    except Exception as exc:
        reason = f"SkyPilot launch failed: {one_line(exc)}"
        registry.set_state(job.job_id, "FAILED", reason)
        raise UserError(reason) from None
    registry.update(job.job_id, backend_job_id=str(sky_job_id))
    state = _read_state(registry, job)
    state.setdefault("launches", []).append({"sky_job_id": sky_job_id, "at": time.time()})
    state.update(sky_job_id=sky_job_id, offers=offer_prices(plan), segments=[], record=None)
    _write_state(registry, job, state)
    registry.set_state(job.job_id, "PENDING", f"SkyPilot managed job {sky_job_id}")
    return sky_job_id


def _submit(job_id: str, task_config: Mapping[str, Any], secret_names: list[str]) -> int:
    sky = _sky()
    config = json.loads(json.dumps(task_config))  # a copy SkyPilot may modify
    values = [(name, os.environ[name]) for name in secret_names if os.environ.get(name)]
    task = sky.Task.from_yaml_config(config, secrets_overrides=values or None)
    request = sky.jobs.launch(task, name=job_id)
    result = sky.stream_and_get(request, output_stream=sys.stderr)
    job_ids = result[0] if isinstance(result, tuple | list) else result
    if isinstance(job_ids, list | tuple):
        job_ids = job_ids[0]
    return int(job_ids)


# ---- status ----------------------------------------------------------------------------------------
def queue(job_ids: list[int] | None = None) -> list[dict[str, Any]]:
    """SkyPilot's managed-job records (as dicts); [] when no managed job is in progress."""
    sky = _sky()
    from sky import exceptions as sky_exceptions

    try:
        request = sky.jobs.queue_v2(refresh=False, job_ids=job_ids, fields=QUEUE_FIELDS)
        result = sky.get(request)
    except sky_exceptions.ClusterNotUpError:
        return []  # "No in-progress managed jobs": the jobs controller is not running
    except Exception as exc:
        raise SkyUnavailable(f"SkyPilot: cannot read the managed jobs queue: {one_line(exc)}") from None
    records = result[0] if isinstance(result, tuple | list) else result
    return [_as_dict(r) for r in records or []]


def _as_dict(record: Any) -> dict[str, Any]:
    if isinstance(record, dict):
        out = dict(record)
    elif hasattr(record, "model_dump"):
        out = record.model_dump()
    else:
        out = dict(vars(record))
    status = out.get("status")
    out["status"] = getattr(status, "value", status)
    return out


def _is_spot(record: Mapping[str, Any]) -> bool | None:
    text = f"{record.get('resources') or ''} {record.get('cluster_resources') or ''}".lower()
    if "spot" in text:
        return True
    return False if text.strip() else None


def price_for(offers: list[dict[str, Any]], record: Mapping[str, Any]) -> float | None:
    """The hourly price of the offer a record runs on, matched by cloud, GPUs and spot."""
    cloud = str(record.get("cloud") or "").lower()
    accelerators = record.get("accelerators") or {}
    spot = _is_spot(record)
    for offer in offers:
        if offer["cloud"] != cloud or accelerators.get(offer["accelerator"]) != offer["count"]:
            continue
        if spot is None or offer["spot"] == spot:
            return float(offer["hourly_usd"])
    return None


def where(record: Mapping[str, Any]) -> str | None:
    if not record.get("cloud"):
        return None
    place = "/".join(str(p) for p in (record.get("cloud"), record.get("region")) if p)
    gpus = ", ".join(f"{n}x {a}" for a, n in (record.get("accelerators") or {}).items())
    kind = {True: "spot", False: "on-demand", None: ""}[_is_spot(record)]
    return " ".join(p for p in (place.lower(), gpus, kind) if p)


def placed(record: Mapping[str, Any]) -> bool:
    """Running on a cluster whose cloud is known (while recovering, the old placement still shows)."""
    return bool(record.get("cloud")) and str(record.get("status")) in ("RUNNING", "CANCELLING")


def update_segments(state: dict[str, Any], record: Mapping[str, Any], now: float) -> None:
    """One segment per recovery: its price and where it starts in SkyPilot's running time."""
    segments = state.setdefault("segments", [])
    n = int(record.get("recovery_count") or 0)
    if not placed(record) or (segments and segments[-1]["n"] == n):
        return
    total = float(record.get("job_duration") or 0.0)
    current = 0.0
    if record.get("last_recovered_at"):
        current = max(0.0, (record.get("end_at") or now) - float(record["last_recovered_at"]))
    segments.append(
        {
            "n": n,
            "offset_s": max(0.0, total - current),
            "hourly_usd": price_for(state.get("offers") or [], record),
            "where": where(record),
        }
    )


def cost_usd(state: Mapping[str, Any]) -> float | None:
    """Price x running time, summed over the segments seen (SkyPilot itself reports no cost)."""
    record = state.get("record") or {}
    segments = state.get("segments") or []
    if not segments:
        return 0.0 if record else None
    total = float(record.get("job_duration") or 0.0)
    cost = 0.0
    for i, seg in enumerate(segments):
        end = segments[i + 1]["offset_s"] if i + 1 < len(segments) else total
        price = seg.get("hourly_usd")
        if price is None:  # an offer outside the plan: the dearest known price, to stay on the safe side
            price = max((o["hourly_usd"] for o in state.get("offers") or []), default=0.0)
        cost += max(0.0, end - seg["offset_s"]) / 3600.0 * price
    return round(cost, 6)


def apply_record(registry: Registry, job: Job, record: Mapping[str, Any] | None) -> Job:
    """Move the registry to what SkyPilot reports: state, attempts (one per recovery), cost data."""
    state = _read_state(registry, job)
    now = time.time()
    if record is None:
        progress = _progress(job)
        if progress.get("state") == "finished":
            registry.set_state(job.job_id, "SUCCEEDED", "finished (SkyPilot no longer lists the job)")
        elif job.reason is None or "no longer lists" not in job.reason:
            registry.update(
                job.job_id,
                reason="SkyPilot no longer lists the job as in progress; `sky jobs queue --refresh` "
                "shows how it ended",
            )
        return registry.get(job.job_id)
    state["record"] = {k: record.get(k) for k in QUEUE_FIELDS}
    update_segments(state, record, now)
    _write_state(registry, job, state)
    _sync_attempts(registry, job, record, state)
    sky_status = str(record.get("status") or "")
    new_state = STATES.get(sky_status, job.state)
    reason = None
    if sky_status.startswith("FAILED") or sky_status == "CANCELLING":
        reason = f"SkyPilot {sky_status}" + (
            f": {record['failure_reason']}" if record.get("failure_reason") else ""
        )
    if new_state != job.state or (reason and reason != job.reason):
        registry.set_state(job.job_id, new_state, reason)
    return registry.get(job.job_id)


def _sync_attempts(registry: Registry, job: Job, record: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """Attempt n+1 runs after SkyPilot's n-th recovery; the one before it ends as preempted."""
    recoveries = int(record.get("recovery_count") or 0)
    seg = (state.get("segments") or [{}])[-1]
    attempts = registry.attempts(job.job_id)

    def end_open(reason: str, at: float | None = None) -> None:
        if attempts and attempts[-1].ended_at is None:
            registry.update_attempt(job.job_id, attempts[-1].n, ended_at=at or time.time(), end_reason=reason)

    if len(attempts) <= recoveries:  # recovering, or already running again
        end_open("preempted (SkyPilot recovered)")
    while placed(record) and len(attempts) < recoveries + 1:
        end_open("preempted (SkyPilot recovered)")
        registry.start_attempt(
            job.job_id,
            None,
            instance=seg.get("where") or "cloud",
            spot=_is_spot(record),
            hourly_usd=seg.get("hourly_usd") or 0.0,
        )
        attempts = registry.attempts(job.job_id)
    status = str(record.get("status"))
    if STATES.get(status) in TERMINAL:
        end_open(status, float(record.get("end_at") or time.time()))


def _progress(job: Job) -> dict[str, Any]:
    options = job.spec.get("checkpoint", {}).get("storage_options") or {}
    try:
        return RunStore(job.run_uri, options, retry_seconds=5).read_progress() or {}
    except Exception:
        return {}


def reconcile(registry: Registry, job: Job) -> Job:
    """Refresh a cloud job from SkyPilot's queue; on trouble, keep the last known state."""
    if job.state in TERMINAL or not job.backend_job_id:
        return job
    try:
        records = queue([int(job.backend_job_id)])
    except SkyUnavailable as exc:
        sys.stderr.write(f"warning: {exc}\n")
        return job
    record = next((r for r in records if str(r.get("job_id")) == job.backend_job_id), None)
    return apply_record(registry, job, record)


def summary_fields(registry: Registry, job: Job) -> dict[str, Any]:
    """What status shows for a cloud job beyond the local fields: preemptions, cost, where it runs."""
    state = _read_state(registry, job)
    record = state.get("record") or {}
    fields: dict[str, Any] = {"sky_job_id": state.get("sky_job_id")}
    if record:
        fields["preemptions"] = int(record.get("recovery_count") or 0)
        fields["where"] = where(record) or fields.get("where")
        fields["sky_status"] = record.get("status")
    cost = cost_usd(state)
    if cost is not None:
        fields["cost_usd"] = cost
    return {k: v for k, v in fields.items() if v is not None}


# ---- logs and cancel -------------------------------------------------------------------------------
def print_logs(job: Job, follow: bool = False) -> int:
    if not job.backend_job_id:
        raise UserError(f"JOB: {job.job_id} was never submitted to SkyPilot; nothing to show")
    sky = _sky()
    try:
        return int(sky.jobs.tail_logs(job_id=int(job.backend_job_id), follow=follow) or 0)
    except Exception as exc:
        raise UserError(
            f"SkyPilot: cannot read the logs of job {job.backend_job_id}: {one_line(exc)}"
        ) from None


def cancel(registry: Registry, job: Job) -> str:
    """Cancel through SkyPilot, gracefully (the trainer gets its stop signal and checkpoints)."""
    if not job.backend_job_id:
        registry.set_state(job.job_id, "CANCELLED", "cancelled by the user before SkyPilot had it")
        return f"{job.job_id} CANCELLED"
    sky = _sky()
    try:
        sky.get(sky.jobs.cancel(job_ids=[int(job.backend_job_id)], graceful=True))
    except Exception as exc:
        raise UserError(f"SkyPilot: cannot cancel job {job.backend_job_id}: {one_line(exc)}") from None
    registry.set_state(job.job_id, "CANCELLED", "cancelled by the user; checkpoints kept")
    return f"{job.job_id} CANCELLED (checkpoints kept in {job.run_uri})"

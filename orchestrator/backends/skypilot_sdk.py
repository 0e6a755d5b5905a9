"""Every call ftorch makes into SkyPilot's client SDK, each failing as one line.

`sky` is imported only inside these functions (the CLI stays fast, and SkyPilot is an optional extra).
Secret values are read from the environment in `submit` and handed to the SDK; they are never written
to the registry, the run store, logs or output.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import UserError, one_line

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
SKY_INSTALL = "pip install 'ftorch[skypilot]' (SkyPilot 0.14.1)"


class SkyUnavailable(UserError):
    """SkyPilot is not installed, or its API server cannot be reached."""


def sky() -> Any:
    try:
        import sky
    except ImportError:
        raise SkyUnavailable(f"resources.backend: skypilot is not installed; {SKY_INSTALL}") from None
    return sky


def enabled_clouds() -> list[str]:
    """Clouds SkyPilot has credentials for (lower-case), through its API server."""
    sky_ = sky()
    from sky.client import sdk as sky_sdk  # enabled_clouds is not exported at the top level

    try:
        clouds = sky_.get(sky_sdk.enabled_clouds())
    except Exception as exc:
        raise SkyUnavailable(f"SkyPilot: cannot list enabled clouds: {one_line(exc)}") from None
    return sorted({str(c).lower().split("/")[0] for c in clouds or []})


def submit(job_id: str, task_config: Mapping[str, Any], secret_names: list[str]) -> int:
    """Launch a managed job; SkyPilot's job id. Raises whatever the SDK raises."""
    sky_ = sky()
    config = json.loads(json.dumps(task_config))  # a copy SkyPilot may modify
    values = [(name, os.environ[name]) for name in secret_names if os.environ.get(name)]
    task = sky_.Task.from_yaml_config(config, secrets_overrides=values or None)
    request = sky_.jobs.launch(task, name=job_id)
    result = sky_.stream_and_get(request, output_stream=sys.stderr)
    job_ids = result[0] if isinstance(result, tuple | list) else result
    if isinstance(job_ids, list | tuple):
        job_ids = job_ids[0]
    return int(job_ids)


def queue(job_ids: list[int] | None = None) -> list[dict[str, Any]]:
    """SkyPilot's managed-job records (as dicts); [] when no managed job is in progress."""
    sky_ = sky()
    from sky import exceptions as sky_exceptions

    try:
        request = sky_.jobs.queue_v2(refresh=False, job_ids=job_ids, fields=QUEUE_FIELDS)
        result = sky_.get(request)
    except sky_exceptions.ClusterNotUpError:
        return []  # "No in-progress managed jobs": the jobs controller is not running
    except Exception as exc:
        raise SkyUnavailable(f"SkyPilot: cannot read the managed jobs queue: {one_line(exc)}") from None
    records = result[0] if isinstance(result, tuple | list) else result
    return [_as_dict(r) for r in records or []]


#: fields SkyPilot 0.14.1's queue fills with "-" when it does not know them (a job not placed yet, or
#: one whose cluster is gone: sky/jobs/utils.py, "formatted_str() returns '-'")
_PLACEHOLDER = ("cloud", "region", "zone", "infra", "cluster_resources", "cluster_resources_full")


def _as_dict(record: Any) -> dict[str, Any]:
    """A queue record as a dict: the status as its name, SkyPilot's "not known" markers as None ("-"
    placeholders; `last_recovered_at` -1 before the first start)."""
    if isinstance(record, dict):
        out = dict(record)
    elif hasattr(record, "model_dump"):
        out = record.model_dump()
    else:
        out = dict(vars(record))
    status = out.get("status")
    out["status"] = getattr(status, "value", status)
    for key in _PLACEHOLDER:
        if out.get(key) == "-":
            out[key] = None
    recovered = out.get("last_recovered_at")
    if isinstance(recovered, int | float) and recovered < 0:
        out["last_recovered_at"] = None
    return out


def tail_logs(sky_job_id: str, follow: bool) -> int:
    try:
        return int(sky().jobs.tail_logs(job_id=int(sky_job_id), follow=follow) or 0)
    except SkyUnavailable:
        raise
    except Exception as exc:
        raise UserError(f"SkyPilot: cannot read the logs of job {sky_job_id}: {one_line(exc)}") from None


def cancel(sky_job_id: str) -> None:
    """Cancel the managed job (SkyPilot's graceful cancel waits for MOUNT_CACHED uploads only; the
    trainer's checkpoint is asked for first, through the run store: controller.stop_then_cancel). A job
    SkyPilot no longer has in progress is nothing to cancel."""
    sky_ = sky()
    from sky import exceptions as sky_exceptions

    try:
        sky_.get(sky_.jobs.cancel(job_ids=[int(sky_job_id)], graceful=True))
    except sky_exceptions.ClusterNotUpError:
        return  # "No in-progress managed jobs" (the jobs controller is not up): nothing left to cancel
    except Exception as exc:
        raise UserError(f"SkyPilot: cannot cancel job {sky_job_id}: {one_line(exc)}") from None


class SdkClient:
    """The controller's SkyClient (orchestrator/spot/controller.py) on SkyPilot 0.14.1's SDK."""

    def __init__(self, secret_names: list[str] | None = None) -> None:
        self.secret_names = secret_names or []

    def launch(self, task: dict[str, Any], name: str) -> int:
        """Submit; SkyPilot's refusals as the controller's typed errors (never class names as strings)."""
        from sky import exceptions as sky_exceptions

        from orchestrator.spot.controller_state import LaunchRefused, RefusedForGood

        try:
            return submit(name, task, self.secret_names)
        except sky_exceptions.NoCloudAccessError as exc:  # `sky check`: waiting does not cure it
            raise RefusedForGood(one_line(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - an API server away, a region refused: try again
            raise LaunchRefused(one_line(exc)) from exc

    def queue(self, job_ids: list[int]) -> list[dict[str, Any]]:
        return queue(job_ids)

    def cancel(self, job_id: int) -> None:
        cancel(str(job_id))

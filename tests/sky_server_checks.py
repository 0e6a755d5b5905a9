"""The cloud controller's SDK calls against SkyPilot 0.14.1's real local API server, offline (run by
tests/orchestrator_tests/backends/test_skypilot_sdk.py in a subprocess with a private HOME and port; prints one JSON line).

No cloud has credentials, so a launch can get as far as SkyPilot's optimizer ("Cloud access is not set
up"); a hand-written catalog (common accelerators, and the regions of the task's entries) stands in for
the one SkyPilot would download, so the server validates the task's regions instead of failing on the
download. Managed-job records come from the real server too: in jobs consolidation mode (a signal file
the server reads per request) the queue is the API server's own jobs table, where the records are written
with SkyPilot's own `sky.jobs.state` calls (the ones its jobs controller makes).
"""

from __future__ import annotations

import asyncio
import copy
import csv
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.backends.skypilot import render_job
from orchestrator.backends.skypilot_render import regions_of
from orchestrator.backends.skypilot_sdk import SdkClient
from orchestrator.jobfile.spec import load_job
from orchestrator.spot.controller import Config, Controller, ControllerHooks, Plan
from orchestrator.spot.policy import Mode, make_policy
from orchestrator.spot.region_order import cloud_of, entry_key, lost_region_last, region_of
from orchestrator.spot.task_resources import split_resources
from trainer.runstore.store import RunStore

out: dict[str, Any] = {}
client = SdkClient()

# ---- nothing in progress (the jobs controller was never started) -------------------------------------
out["queue_none"] = client.queue([7])
client.cancel(7)  # SkyPilot: ClusterNotUpError "No in-progress managed jobs": nothing left to cancel
out["cancel_none"] = "ok"

# ---- a rendered ftorch task: its spot list, and the same list with a lost region last --------------
spec = load_job("examples/mistral-7b-lora.yaml", ["checkpoint.uri=s3://ckpt/ftorch"], check_support=False)
plan, task = render_job(spec, "job-1", "s3://ckpt/ftorch/job-1", environ={})
spot = split_resources(task)[Mode.SPOT]
regions = regions_of(plan)
first = spot["resources"]["ordered"][0]
lost = ("aws", regions[entry_key(first)][0])
moved = lost_region_last(spot["resources"]["ordered"], *lost, regions)

catalog = Path(os.path.expanduser("~/.sky/catalogs/v8"))
(catalog / "common").mkdir(parents=True, exist_ok=True)
names = sorted({next(iter(e["accelerators"])) for e in spot["resources"]["ordered"]})
with open(catalog / "common/accelerators.csv", "w", newline="") as handle:
    csv.writer(handle).writerows([["AcceleratorName", "Clouds"], *[[n, "AWS, GCP"] for n in names]])
with open(catalog / "common/metadata.csv", "w", newline="") as handle:
    csv.writer(handle).writerows([["GPU", "MemoryGB", "Manufacturer"], *[[n, 48, "NVIDIA"] for n in names]])
for cloud in {cloud_of(e) for e in moved}:
    (catalog / cloud).mkdir(parents=True, exist_ok=True)
    columns = ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "Price"]
    rows = {
        (next(iter(e["accelerators"])), next(iter(e["accelerators"].values())), region_of(e) or "us-central1")
        for e in moved
        if cloud_of(e) == cloud
    }
    with open(catalog / cloud / "vms.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*columns, "SpotPrice", "Region", "AvailabilityZone", "GpuInfo"])
        writer.writerows(
            [f"x.{a.lower()}", a, n, 8, 64, 2.0, 0.8, r, f"{r}a", ""] for a, n, r in sorted(rows)
        )

# ---- managed-job records from the real server (consolidation mode: the server's own jobs table) -----
from sky.jobs import constants as jobs_constants  # noqa: E402
from sky.jobs import state  # noqa: E402
from sky.utils import common_utils  # noqa: E402

signal = Path(os.path.expanduser(jobs_constants.JOBS_CONSOLIDATION_RELOADED_SIGNAL_FILE))
signal.touch()


async def _callback(*_args: Any) -> None:
    pass


def _job(name: str) -> int:
    job_id = state.set_job_info_without_job_id(
        name, "default", "ftorch", None, None, common_utils.get_user_hash()
    )
    state.set_pending(job_id, 0, name, "1x[L40S:1][Spot]", "{}")
    asyncio.run(state.set_starting_async(job_id, 0, "ts", 1000.0, "1x[L40S:1][Spot]", {}, _callback))
    return job_id


running, starting, recovering = _job("running"), _job("starting"), _job("recovering")
for job_id in (running, recovering):
    state.set_job_infra(job_id, cloud="AWS", region=lost[1], zone=f"{lost[1]}a")
    asyncio.run(state.set_started_async(job_id, 0, 1001.0, _callback))
asyncio.run(state.set_recovering_async(running, 0, False, _callback))
asyncio.run(state.set_recovered_async(running, 0, 1500.0, _callback))
asyncio.run(state.set_recovering_async(recovering, 0, False, _callback))
try:
    records = {r["job_id"]: r for r in client.queue([running, starting, recovering, 999])}
finally:
    for job_id in (running, starting, recovering):  # leave no job in progress for later tests
        asyncio.run(state.set_cancelling_async(job_id, _callback))
        asyncio.run(state.set_cancelled_async(job_id, _callback))
    signal.unlink()
keys = ("job_id", "status", "recovery_count", "cloud", "region", "cluster_resources", "last_recovered_at")
out["records"] = {name: {k: records[j].get(k) for k in keys} for name, j in
                  (("running", running), ("starting", starting), ("recovering", recovering))}  # fmt: skip
out["record_ids"] = sorted(records)


# ---- the controller: those records, then the real cancel and launches ---------------------------------
class Client:
    """The real SDK's launch and cancel; queue replays the records the real server returned above."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies, self.calls = replies, []

    def queue(self, job_ids: list[int]) -> list[dict[str, Any]]:
        self.calls.append(("queue", job_ids))
        return [{**self.replies.pop(0), "job_id": job_ids[0]}]

    def cancel(self, job_id: int) -> None:
        self.calls.append(("cancel", job_id))
        client.cancel(job_id)

    def launch(self, task: dict[str, Any], name: str) -> int:
        try:
            return client.launch(task, name)
        except Exception as exc:
            order = [e["infra"] for e in task["resources"]["ordered"]]
            cause = exc.__cause__ or exc  # SdkClient raises typed refusals from SkyPilot's exception
            self.calls.append(("launch refused", order, cause.__class__.__name__, str(cause)[:300]))
            raise


folder = Path(tempfile.mkdtemp())
events: list[Any] = []
failed: list[str] = []
control = Controller(
    Plan("job-1", make_policy("spot-only"), {Mode.SPOT: copy.deepcopy(spot)}, 0.0, None, 300.0,
         switching=False, regions=regions),
    Client([records[running], records[recovering]]), RunStore(str(folder / "run")), folder,
    config=Config(tick_s=60.0),
    hooks=ControllerHooks(on_event=lambda e, r: events.append([e, r]), on_failed=failed.append),
)  # fmt: skip
control.state.mode, control.state.sky_job_id = "spot", 7  # typed state (ControllerState)
out["tick1"] = control.tick()
out["placed"] = dataclasses.asdict(control.state.placed)
out["tick2"] = control.tick()
out["calls"] = control.client.calls
out["events"], out["failed"], out["ended"] = events, failed, control.state.ended
out["moved"] = [e["infra"] for e in moved]
out["lost"] = "/".join(lost)
shutil.rmtree(catalog)  # the hand-written catalog was for these checks only
sys.stdout.write(json.dumps(out) + "\n")

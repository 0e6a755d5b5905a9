"""The cloud controller's budget, notifications and region order on a SkyPilot job, end to end through the
registry and a real run store; SkyPilot is faked only at the SDK-call boundary (launch, queue, cancel):
tests/sky_double.py replays a spot cloud with a trainer that honours stop requests, and a scripted
client reports placements. Relaunched tasks are loaded by SkyPilot's own `Task.from_yaml_config`."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO
from sky_double import Clock

from orchestrator.backends import skypilot_state
from orchestrator.backends.skypilot import render_job
from orchestrator.backends.skypilot_controller import build, needs_controller, single_list, watch_lines
from orchestrator.backends.skypilot_render import regions_of
from orchestrator.jobfile.spec import load_job
from orchestrator.registry import Registry
from orchestrator.spot.controller import Config, Plan
from orchestrator.spot.controller_state import RefusedForGood
from orchestrator.spot.policy import Mode, make_policy
from orchestrator.states import JobState, Outcome
from orchestrator.views.status import status_one
from trainer.config import JobSpec
from trainer.runstore.store import RunStore
from trainer.stops.interruptions import STOP_REQUEST, request_stop

H = 3600.0
SPOT_TASK = {
    "name": "job-1",
    "resources": {
        "ordered": [{"infra": "aws/us-east-1", "accelerators": {"V100": 1}, "use_spot": True}],
        "job_recovery": {"strategy": "FAILOVER", "recover_on_exit_codes": [75]},
    },
}
OFFERS = [{"cloud": "aws", "accelerator": "V100", "count": 1, "spot": True, "hourly_usd": 2.0, "per": "node"}]


def new_job(tmp_path: Path, example: str, budget: float | None, notify_on: list[str]) -> tuple[Registry, Any]:
    """A SkyPilot job in the registry, with a budget and a notify command that keeps each payload."""
    spec = load_job(REPO / "examples" / example, [f"checkpoint.uri={tmp_path}"], check_support=False)
    data = spec.model_dump()
    data["resources"]["budget_usd"] = budget
    data["notify"] = {"command": f"cat > {tmp_path}/notified-$FTORCH_EVENT.json", "on": notify_on}
    registry = Registry()
    run_uri = str(tmp_path / "run")
    job = registry.create_job("job-1", spec.name, "skypilot", run_uri, run_uri + "/output", data)
    skypilot_state.write_state(registry, job, {"offers": OFFERS})  # the plan's prices, as a launch keeps
    return registry, job


def notified(tmp_path: Path, event: str) -> dict[str, Any] | None:
    path = tmp_path / f"notified-{event}.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_a_skypilot_job_the_trainer_stopped_at_its_budget_is_stopped_budget(
    tmp_path: Path, ftorch_home: Path
) -> None:
    """The budget is the trainer's (trainer/stops/budget.py; replaces the controller's budget test): its
    managed job ends SUCCEEDED (exit 0), the run store's epoch record says budget, and status reads
    STOPPED (budget) with no controller running; a job that really finished stays SUCCEEDED."""
    registry, job = new_job(tmp_path, "llama3-8b-qlora.yaml", budget=1.0, notify_on=["budget"])
    store = RunStore(job.run_uri)
    store.claim_epoch({"attempt": 1, "hourly_usd": 2.0, "started_at": 0.0})
    reason = "budget: $0.9500 spent + $0.0600 for the next checkpoint interval would pass budget_usd $1"
    store.update_epoch_record(ended="stopped", stop_reason="budget", stop_detail=reason, step=120)
    placed = {"job_id": 1, "status": "RUNNING", "recovery_count": 0, "start_at": 1.0, "cloud": "AWS"}
    skypilot_state.record_launch(registry, job, 1, "launched", OFFERS)
    skypilot_state.apply_record(registry, registry.get("job-1"), placed)
    skypilot_state.apply_record(
        registry, registry.get("job-1"), {**placed, "status": "SUCCEEDED", "end_at": 2.0}
    )
    row = status_one("job-1")
    assert row["state"] == JobState.STOPPED and row["reason"] == reason and row["stop_reason"] == "budget"
    assert registry.attempts("job-1")[-1].outcome is Outcome.BUDGET
    # what `launch --dry-run` says: the trainer's stop, no controller for it (FAILOVER: no region move)
    spec = JobSpec.model_validate(job.spec)
    lines = watch_lines(spec, SPOT_TASK)
    assert lines[0].startswith("  budget: $1; the trainer stops itself") and "exit 0" in lines[0]
    bare = spec.model_copy(
        update={"notify": None, "resources": spec.resources.model_copy(update={"budget_usd": None})}
    )
    assert needs_controller(spec, SPOT_TASK) == needs_controller(bare, SPOT_TASK)  # neither needs one
    # a run that finished is SUCCEEDED whatever an earlier attempt said
    store.claim_epoch({"attempt": 2})
    store.update_epoch_record(ended="finished", step=600)
    assert skypilot_state.budget_stop(registry.get("job-1")) is None


def progress(store: RunStore, step: int) -> None:
    store.write_progress(
        {
            "state": "running",
            "step": step,
            "total_steps": 100,
            "steps_per_s": 0.1,
            "last_checkpoint_step": step,
        }
    )


def single_list_of(task: dict[str, Any]) -> dict[Mode, dict[str, Any]]:
    return {Mode.SPOT: copy.deepcopy(task)}


class Placements:
    """The SDK boundary, scripted: each managed job's next queue record is set by the test."""

    def __init__(self) -> None:
        self.records: dict[int, dict[str, Any]] = {}
        self.launched: list[dict[str, Any]] = []
        self.cancelled: list[int] = []

    refuse_next = False
    #: exceptions the next launches raise, in turn (SkyPilot refusing them)
    refusals: list[Exception] = []

    def launch(self, task: dict[str, Any], name: str) -> int:
        if self.refuse_next:  # e.g. SkyPilot's API server refuses a region
            self.refuse_next = False
            raise ValueError("Invalid region")
        if self.refusals:
            raise self.refusals.pop(0)
        self.launched.append(copy.deepcopy(task))
        job_id = len(self.launched)
        self.records[job_id] = {"job_id": job_id, "status": "PENDING", "recovery_count": 0}
        return job_id

    def queue(self, job_ids: list[int]) -> list[dict[str, Any]]:
        return [copy.deepcopy(self.records[j]) for j in job_ids if j in self.records]

    def cancel(self, job_id: int) -> None:
        self.cancelled.append(job_id)
        self.records[job_id]["status"] = "CANCELLED"

    def place(self, job_id: int, status: str, infra: str, recoveries: int = 0) -> None:
        cloud, region = infra.split("/")
        self.records[job_id].update(
            status=status, cloud=cloud, region=region, recovery_count=recoveries, accelerators={"A10G": 1},
            resources="[Spot]", cluster_resources="1x[spot](gpus=A10G:1)", job_duration=600.0,
        )  # fmt: skip


@pytest.fixture(scope="module")
def sky(tmp_path_factory: pytest.TempPathFactory) -> Any:
    sky = pytest.importorskip("sky")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(tmp_path_factory.mktemp("sky-home")))
        mp.setenv("SKYPILOT_DISABLE_LOCAL_API_SERVER", "1")
        yield sky


def test_a_preempted_job_is_relaunched_with_the_lost_region_last(
    sky: Any, tmp_path: Path, ftorch_home: Path
) -> None:
    registry, job = new_job(tmp_path, "mistral-7b-lora.yaml", budget=None, notify_on=["preempted"])
    spec = load_job(REPO / "examples/mistral-7b-lora.yaml", check_support=False)
    plan_, task = render_job(spec, "job-1", job.run_uri, environ={})
    assert task["resources"]["job_recovery"]["strategy"] == "EAGER_NEXT_REGION"
    spot = single_list(spec.model_copy(update={"notify": None}), task)[Mode.SPOT]
    spot["resources"]["ordered"] = [e for e in spot["resources"]["ordered"] if e["use_spot"]]
    first = spot["resources"]["ordered"][0]
    regions = regions_of(plan_)
    cloud = first["infra"].split("/")[0]
    lost = regions[
        f"{cloud}|{next(iter(first['accelerators']))}|{next(iter(first['accelerators'].values()))}"
    ][0]
    client, clock = Placements(), Clock()
    store = RunStore(job.run_uri, retry_seconds=1)
    plan = Plan("job-1", make_policy("spot-only"), {Mode.SPOT: spot}, 0.0, None, 300.0, switching=False,
                regions=regions)  # fmt: skip
    controller = build(registry, "job-1", plan, client, store, config=Config(tick_s=60.0), clock=clock)
    controller.launch(Mode.SPOT, "launch")
    client.place(1, "RUNNING", f"{cloud}/{lost}")
    assert controller.tick() and not client.cancelled
    progress(store, 5)
    client.place(1, "RECOVERING", f"{cloud}/{lost}")  # preempted; SkyPilot would relaunch in `lost` first
    assert controller.tick()
    assert client.cancelled == [1] and len(client.launched) == 2
    relaunched = client.launched[1]
    loaded = sky.Task.from_yaml_config(copy.deepcopy(relaunched))  # SkyPilot's own loader and schema
    order = [(str(r.cloud).lower(), r.region) for r in loaded.resources]
    assert isinstance(loaded.resources, list) and len(order) == len(relaunched["resources"]["ordered"])
    in_lost = [i for i, (c, r) in enumerate(order) if c == cloud and r == lost]
    assert in_lost and in_lost == list(range(len(order) - len(in_lost), len(order)))  # the lost one last
    # the best offer first, in its next cheapest region (SkyPilot's optimizer would pick the cheapest)
    assert order[0] == (cloud, regions[f"{cloud}|{next(iter(first['accelerators']))}|1"][1])
    assert all(r.use_spot for r in loaded.resources)
    before = {(e["infra"].split("/")[0], json.dumps(e["accelerators"])) for e in spot["resources"]["ordered"]}
    after = {
        (e["infra"].split("/")[0], json.dumps(e["accelerators"])) for e in relaunched["resources"]["ordered"]
    }
    assert before == after  # every offer is still there
    attempts = registry.attempts("job-1")
    assert (
        attempts[0].outcome is Outcome.PREEMPTED and f"preempted in {cloud}/{lost}" in attempts[0].end_reason
    )
    assert notified(tmp_path, "preempted")["event"] == "preempted"

    # SkyPilot brought it back by itself before the controller looked: left alone
    client.place(2, "RUNNING", f"{cloud}/{order[0][1]}")
    controller.tick()
    client.place(2, "RUNNING", f"{cloud}/{order[0][1]}", recoveries=1)
    controller.tick()
    assert client.cancelled == [1]
    # a crash restart shows as RECOVERING too: without progress since the last relaunch, left to
    # SkyPilot's restart limit (a relaunch would start its count again)
    client.place(2, "RECOVERING", f"{cloud}/{order[0][1]}")
    controller.tick()
    assert client.cancelled == [1] and len(client.launched) == 2
    # `ftorch cancel` is stopping it (stop request in the run store): no preemption, no relaunch
    progress(store, 9)
    client.place(2, "RUNNING", f"{cloud}/{order[0][1]}")
    controller.tick()
    request_stop(store, "cancelled by the user")
    client.place(2, "RECOVERING", f"{cloud}/{order[0][1]}")
    controller.tick()
    assert client.cancelled == [1] and len(client.launched) == 2
    # FAILOVER asks for the same region first: SkyPilot's own recovery does that
    store.write_json(STOP_REQUEST, {"reason": "left by a cancel that died", "at": clock.now - 2 * H})  # stale
    controller.plan.tasks[Mode.SPOT]["resources"]["job_recovery"] = {"strategy": "FAILOVER"}
    client.place(2, "RUNNING", f"{cloud}/{order[0][1]}")
    controller.tick()
    client.place(2, "RECOVERING", f"{cloud}/{order[0][1]}")
    controller.tick()
    assert client.cancelled == [1] and len(client.launched) == 2
    # a relaunch SkyPilot refuses (a region its catalog lacks): the list as it was, not a lost run
    controller.plan.tasks[Mode.SPOT]["resources"]["job_recovery"] = {"strategy": "EAGER_NEXT_REGION"}
    progress(store, 20)
    client.place(2, "RUNNING", f"{cloud}/{order[0][1]}")
    controller.tick()
    client.place(2, "RECOVERING", f"{cloud}/{order[0][1]}")
    client.refuse_next = True
    assert controller.tick()
    assert client.cancelled == [1, 2] and len(client.launched) == 3
    assert client.launched[2]["resources"]["ordered"] == relaunched["resources"]["ordered"]

    # a relaunch refused again (the API server down for a while): no managed job is left, so the
    # controller does not take the cancelled job's end for the run's; it tries again next tick
    progress(store, 30)
    client.place(3, "RUNNING", f"{cloud}/{order[0][1]}")
    controller.tick()
    client.place(3, "RECOVERING", f"{cloud}/{order[0][1]}")
    client.refusals = [ConnectionError("API server down")] * 2
    assert controller.tick() and controller.state.relaunch.tries == 1
    assert client.cancelled == [1, 2, 3] and len(client.launched) == 3
    assert controller.tick() and len(client.launched) == 4 and controller.state.relaunch is None
    assert registry.get("job-1").state is not JobState.CANCELLED
    # one SkyPilot refuses for good (no enabled cloud): FAILED at once, with its line
    progress(store, 40)
    client.place(4, "RUNNING", f"{cloud}/{order[0][1]}")
    controller.tick()
    client.place(4, "RECOVERING", f"{cloud}/{order[0][1]}")
    # the SDK client maps SkyPilot's NoCloudAccessError to this typed refusal (skypilot_sdk.SdkClient)
    no_cloud = RefusedForGood("NoCloudAccessError: Cloud access is not set up. Run: sky check")
    client.refusals = [no_cloud] * 2
    assert controller.tick() is False and controller.state.ended == "relaunch refused"
    job = registry.get("job-1")
    assert job.state is JobState.FAILED and job.reason.startswith(
        "relaunch refused by SkyPilot: NoCloudAccessError: Cloud access is not set up."
    )


def test_launch_says_in_one_line_when_a_job_relies_on_the_controller() -> None:
    from orchestrator.backends.skypilot_controller import reliance_line

    spec = load_job(REPO / "examples" / "llama3-8b-qlora-deadline.yaml", check_support=False)
    line = reliance_line(spec, SPOT_TASK)
    assert line is not None and "\n" not in line and "deadline policy" in line and "budget" in line
    quiet = spec.model_copy(update={"resources": spec.resources.model_copy(update={"policy": "spot-only"})})
    assert reliance_line(quiet, SPOT_TASK) is None  # FAILOVER, no switching: nothing relies on it

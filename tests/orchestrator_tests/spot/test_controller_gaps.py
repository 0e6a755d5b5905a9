"""The cloud controller across gaps (a laptop asleep for 8 hours), on a fake clock and a real run store:
it never acts on a stale view, never launches for a run that has ended, finishes a switch a kill
interrupted, and only one controller of two acts. SkyPilot is scripted at the SDK boundary."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from sky_double import Clock

from orchestrator.spot.controller import Config, Controller, ControllerHooks, Plan
from orchestrator.spot.controller_state import STATE_RECORD
from orchestrator.spot.policy import Mode, make_policy
from orchestrator.spot.task_resources import spot_first
from trainer.runstore.store import RunStore

H = 3600.0
TASK = {
    "name": "job",
    "resources": {
        "ordered": [
            {"infra": "aws/us-east-1", "accelerators": {"V100": 1}, "use_spot": True},
            {"infra": "aws/us-east-1", "accelerators": {"V100": 1}, "use_spot": False},
        ],
        "job_recovery": {"strategy": "FAILOVER", "recover_on_exit_codes": [75]},
    },
}
FINAL = ("SUCCEEDED", "CANCELLED", "FAILED")


class Killed(BaseException):
    """The controller process dies here (a laptop lid, a kill -9)."""


class Scripted:
    """SkyPilot at the SDK boundary: records set by the test; `gone` = its jobs controller stopped."""

    def __init__(self) -> None:
        self.records: dict[int, dict[str, Any]] = {}
        self.launched: list[dict[str, Any]] = []
        self.cancelled: list[int] = []
        self.gone: str | None = None  # None, "empty" or "raises"
        self.kill_after_cancel = False

    def launch(self, task: dict[str, Any], name: str) -> int:
        self.launched.append(copy.deepcopy(task))
        job_id = len(self.launched)
        self.records[job_id] = {"job_id": job_id, "status": "PENDING", "recovery_count": 0}
        return job_id

    def queue(self, job_ids: list[int]) -> list[dict[str, Any]]:
        if self.gone == "raises":
            raise ConnectionError("SkyPilot: cannot read the managed jobs queue")
        if self.gone == "empty":
            return []
        return [copy.deepcopy(self.records[j]) for j in job_ids if j in self.records]

    def cancel(self, job_id: int) -> None:
        self.cancelled.append(job_id)
        self.records[job_id]["status"] = "CANCELLED"
        if self.kill_after_cancel:
            self.kill_after_cancel = False
            raise Killed

    def place(self, job_id: int, status: str, spot: bool = True, recoveries: int = 0) -> None:
        kind = "[spot]" if spot else ""
        self.records[job_id].update(
            status=status, cloud="aws", region="us-east-1", recovery_count=recoveries,
            cluster_resources=f"1x{kind}(gpus=V100:1)", resources="[Spot]" if spot else "[On-demand]",
        )  # fmt: skip

    def live(self) -> list[int]:
        return [j for j, r in self.records.items() if r["status"] not in FINAL]


def is_spot(record: dict[str, Any]) -> bool | None:
    return "[spot]" in str(record.get("cluster_resources") or "") if record.get("cluster_resources") else None


def controller(tmp_path: Path, client: Scripted, clock: Clock, policy: str = "spot-fallback") -> Controller:
    plan = Plan("job-1", make_policy(policy), spot_first(TASK), 0.0, 30 * H, 300.0, step_s_hint=60.0)
    job_dir = tmp_path / "job"
    job_dir.mkdir(parents=True, exist_ok=True)
    store = RunStore(str(tmp_path / "run"), retry_seconds=1)
    config = Config(tick_s=60.0, spot_wait_s=600.0)
    hooks = ControllerHooks(placed_spot=is_spot)
    return Controller(plan, client, store, job_dir, config, hooks=hooks, clock=clock, where="t")


def progress(store: RunStore, step: int, state: str = "running", at: float = 0.0) -> None:
    store.write_progress(
        {"state": state, "step": step, "total_steps": 1000, "steps_per_s": 1 / 60,
         "last_checkpoint_step": step, "updated_at": at}
    )  # fmt: skip


def started(tmp_path: Path, policy: str = "spot-fallback") -> tuple[Scripted, Controller, Clock]:
    client, clock = Scripted(), Clock()
    ctl = controller(tmp_path, client, clock, policy)
    ctl.launch(Mode.SPOT, "launch")
    client.place(1, "RUNNING")
    progress(ctl.store, 10)
    assert ctl.tick()
    return client, ctl, clock


def run_for(ctl: Controller, clock: Clock, seconds: float) -> None:
    """Tick every `tick_s` for `seconds` (the controller awake)."""
    end = clock.now + seconds
    while clock.now < end:
        clock.now += ctl.config.tick_s
        ctl.tick()


def test_the_spot_list_carries_its_on_demand_fallback() -> None:
    tasks = spot_first(TASK)
    assert [e["use_spot"] for e in tasks[Mode.SPOT]["resources"]["ordered"]] == [True, False]
    assert [e["use_spot"] for e in tasks[Mode.ON_DEMAND]["resources"]["ordered"]] == [False]


def test_a_gap_while_running_changes_nothing(tmp_path: Path) -> None:
    client, ctl, clock = started(tmp_path)
    clock.now += 8 * H  # (a) the laptop slept; the job kept running
    progress(ctl.store, 400, at=clock.now)
    assert ctl.tick() and client.cancelled == [] and len(client.launched) == 1


def test_a_job_recovered_during_the_gap_is_left_alone(tmp_path: Path) -> None:
    client, ctl, clock = started(tmp_path)
    clock.now += 8 * H  # (b) preempted and recovered by SkyPilot while nobody watched
    client.place(1, "RUNNING", recoveries=2)
    progress(ctl.store, 300, at=clock.now)
    assert ctl.tick() and client.cancelled == [] and len(client.launched) == 1


@pytest.mark.parametrize("gone", ["empty", "raises"])
@pytest.mark.parametrize(
    ("ended", "expect"),
    [("finished", "finished"), ("budget", "budget"), ("cancel", "cancelled")],
)
def test_a_run_that_ended_while_skypilots_controller_stopped_is_never_relaunched(
    tmp_path: Path, gone: str, ended: str, expect: str
) -> None:
    client, ctl, clock = started(tmp_path)
    store = ctl.store
    epoch = store.claim_epoch({"attempt": 1})
    assert epoch == 1
    if ended == "finished":
        progress(store, 1000, state="finished", at=clock.now + 7 * H)
    else:
        store.update_epoch_record(ended="stopped", stop_reason=ended)
    clock.now += 8 * H  # (c) it ended an hour before wake; SkyPilot's jobs controller is down since
    client.gone = gone
    client.records[1]["status"] = "SUCCEEDED"
    assert ctl.tick() is False
    assert ctl.state.ended == expect and client.launched[1:] == [] and client.cancelled == []


def test_a_run_skypilot_forgot_without_an_end_in_the_store_ends_failed_not_relaunched(tmp_path: Path) -> None:
    client, ctl, clock = started(tmp_path)
    failed: list[str] = []
    ctl.hooks = dataclasses.replace(ctl.hooks, on_failed=failed.append)
    clock.now += 8 * H
    client.gone = "empty"
    assert ctl.tick()  # first sight of an empty queue: wait (an API server restart lists it again)
    clock.now += ctl.config.gone_after_s
    assert ctl.tick() is False and ctl.state.ended == "gone"
    assert failed and "no managed job" in failed[0] and len(client.launched) == 1
    client.gone = "raises"  # a queue that only raises never ends a run: it waits
    other = controller(tmp_path / "b", Scripted(), Clock())
    other.launch(Mode.SPOT, "launch")
    other.client.gone = "raises"
    other.clock.now += 8 * H
    assert other.tick() and other.tick() and other.state.ended is None


def test_a_switch_interrupted_by_the_gap_is_finished_once(tmp_path: Path) -> None:
    client, ctl, clock = started(tmp_path)
    client.place(1, "RECOVERING", recoveries=1)
    run_for(ctl, clock, 720)  # no spot for 10 min: spot-fallback goes on-demand
    assert ctl.state.relaunch is None and client.launched[-1]["resources"]["ordered"][0]["use_spot"] is False
    # (d) mid-switch: a running job asked to checkpoint, then the laptop sleeps
    client, ctl, clock = started(tmp_path / "d", "deadline")
    ctl.plan.deadline_s = 2 * H  # far behind its deadline: the safety net wants on-demand now
    ctl.tick()
    assert ctl.state.pending is not None and ctl.state.pending.asked_checkpoint
    clock.now += 8 * H  # the trainer saved, exited 75, SkyPilot restarted it (the restart stops at once)
    client.place(1, "RUNNING", recoveries=1)
    progress(ctl.store, 10, state="preempted", at=clock.now)
    ctl.tick()
    assert client.cancelled == [1] and len(client.launched) == 2 and client.live() == [2]
    ctl.tick()
    assert len(client.launched) == 2


def test_two_controllers_started_at_once_only_one_acts(tmp_path: Path) -> None:
    client, first, clock = started(tmp_path)
    second = controller(tmp_path, client, clock)
    assert second.tick() is False and "held by" in (second.yielded or "")
    client.place(1, "RECOVERING", recoveries=1)
    for _ in range(12):  # both awake: the one with the lease renews it, the other never acts
        clock.now += 60
        assert second.tick() is False
        first.tick()
    assert len(client.launched) == 2 and client.live() == [2]


def test_a_kill_between_cancel_and_launch_is_finished_by_the_next_controller(tmp_path: Path) -> None:
    client, ctl, clock = started(tmp_path)
    client.place(1, "RECOVERING", recoveries=1)
    client.kill_after_cancel = True
    with pytest.raises(Killed):
        run_for(ctl, clock, 720)
    assert (
        client.live() == [] and ctl.store.read_json_or_none(STATE_RECORD)["relaunch"]["mode"] == "on-demand"
    )
    clock.now += 8 * H  # the dead controller's lease expired; a new one (any machine) takes over
    again = controller(tmp_path, client, clock)
    assert again.tick()
    assert len(client.launched) == 2 and client.live() == [2]
    assert client.launched[1]["resources"]["ordered"][0]["use_spot"] is False
    assert again.state.relaunch is None


def test_a_relaunch_whose_load_would_pass_the_budget_is_not_begun(tmp_path: Path) -> None:
    """B1: before a relaunch the controller counts the load time earlier attempts measured: $1.00 spent
    of $1.05, and a restart that loads for 300 s ($0.083 at $1/h) would pass it; the next interval alone
    (1 step, 60 s: $0.017) would not. The job ends at its budget; nothing is launched."""
    client, ctl, clock = started(tmp_path)
    job = {"resources": {"budget_usd": 1.05}, "checkpoint": {"every": 1}}
    ctl.store.write_spec({"job": job, "run_id": "job-1", "output_uri": str(tmp_path / "out")})
    trainer = RunStore(str(tmp_path / "run"))
    loaded = {"phases": {"process_start_s": 60.0, "model_load_s": 230.0, "checkpoint_read_s": 10.0}}
    trainer.claim_epoch({"attempt": 1, "hourly_usd": 1.0, "started_at": 0.0, "measured": loaded})
    trainer.update_epoch_record(ended_at=3600.0)
    client.place(1, "RECOVERING", recoveries=1)  # preempted: spot-fallback relaunches on demand
    run_for(ctl, clock, 720)
    assert len(client.launched) == 1 and ctl.state.ended == "budget", ctl.state
    assert ctl.state.relaunch is None

"""The cloud controller against a SkyPilot double that replays spot traces (tests/sky_double.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sky_double import Clock, ReplaySky

from orchestrator.spot.controller import Config, Controller, Plan, status_fields
from orchestrator.spot.controller_state import STATE_FILE
from orchestrator.spot.policy import Mode, make_policy
from orchestrator.spot.task_resources import split_resources
from trainer.runstore.store import RunStore
from trainer.stops.interruptions import request_stop
from trainer.stops.stop_request import STOP_REQUEST, StopRequestWatcher

H = 3600.0
GAP = 300.0
TASK = {
    "name": "job",
    "resources": {
        "ordered": [
            {"infra": "aws/us-east-1", "accelerators": {"V100": 1}, "use_spot": True},
            {"infra": "aws/us-east-2", "accelerators": {"V100": 1}, "use_spot": True},
            {"infra": "aws/us-east-1", "accelerators": {"V100": 1}, "use_spot": False},
        ],
        "job_recovery": {"strategy": "FAILOVER", "recover_on_exit_codes": [75]},
    },
}


def world(
    tmp_path: Path, up: list[bool], policy: str, deadline_h: float | None, hours: float = 8.0
) -> tuple[ReplaySky, Controller, Clock]:
    clock = Clock()
    store = RunStore(str(tmp_path / "run"), retry_seconds=1)
    sky = ReplaySky(
        up=up,
        gap_s=GAP,
        clock=clock,
        store=store,
        total_steps=int(hours * 60),
        step_s=60.0,
        ckpt_steps=10,
        restart_s=300.0,
    )
    plan = Plan(
        job_id="job-1",
        policy=make_policy(policy),
        tasks=split_resources(TASK),
        start_s=0.0,
        deadline_s=None if deadline_h is None else deadline_h * H,
        restart_overhead_s=300.0,
        step_s_hint=60.0,
    )
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    controller = Controller(plan, sky, store, job_dir, Config(tick_s=120.0), clock=clock, where="test")
    return sky, controller, clock


def drive(sky: ReplaySky, controller: Controller, clock: Clock, limit_h: float = 30.0) -> None:
    controller.launch(Mode.SPOT, "launch")
    while clock.now < limit_h * H:
        sky.advance(controller.config.tick_s)
        if not controller.tick():
            return
    raise AssertionError("the job did not end")


def ticks(hours: float) -> int:
    return int(hours * H / GAP)


def test_split_resources_keeps_one_kind_each() -> None:
    tasks = split_resources(TASK)
    assert [e["use_spot"] for e in tasks[Mode.SPOT]["resources"]["ordered"]] == [True, True]
    assert [e["use_spot"] for e in tasks[Mode.ON_DEMAND]["resources"]["ordered"]] == [False]
    assert tasks[Mode.SPOT]["resources"]["job_recovery"] == TASK["resources"]["job_recovery"]
    assert len(TASK["resources"]["ordered"]) == 3  # the original is left alone


def test_deadline_job_rides_out_a_long_outage_on_demand_and_returns_to_spot(tmp_path: Path) -> None:
    # spot for 2 h, then none for 6 h, then spot again; 8 h of work due in 12 h
    up = [True] * ticks(2) + [False] * ticks(6) + [True] * ticks(30)
    sky, controller, clock = world(tmp_path, up, "deadline", deadline_h=12)
    drive(sky, controller, clock)
    assert sky.finished_at is not None and sky.finished_at <= 12 * H  # the deadline holds
    switches = controller.state.switches
    kinds = [(s["from"], s["to"]) for s in switches]
    assert kinds[0] == ("spot", "on-demand")
    # to on demand during the outage, once behind the uniform-progress line (not at its first minute)
    assert 2.5 * H < switches[0]["at"] < 4 * H
    assert ("on-demand", "spot") in kinds
    # back on spot for good once it is back (after the outage)
    assert switches[-1]["to"] == "spot" and switches[-1]["at"] >= 8 * H
    assert all(s["why"] for s in switches) and [s["attempt"] for s in switches] == list(
        range(2, len(switches) + 2)
    )
    # every relaunch came after the previous managed job was cancelled; never two alive at once
    calls = [c for c in sky.calls if c[0] != "queue"]
    assert calls[0] == ("launch", ("spot", "job-1"))
    for before, after in zip(calls[1:-1:2], calls[2::2], strict=False):
        assert before[0] == "cancel" and after[0] == "launch"
    cost = sky.spot_s / H * 0.66 + sky.ondemand_s / H * 3.06
    assert cost < 0.8 * (8 * H + 300) / H * 3.06  # cheaper than on demand alone
    assert not (tmp_path / "run" / STOP_REQUEST).exists()  # removed before each relaunch


def test_spot_only_never_switches_and_misses_the_deadline(tmp_path: Path) -> None:
    up = [True] * ticks(2) + [False] * ticks(6) + [True] * ticks(30)
    sky, controller, clock = world(tmp_path, up, "spot-only", deadline_h=12)
    drive(sky, controller, clock)
    assert controller.state.switches == [] and sky.ondemand_s == 0
    assert sky.finished_at is not None and sky.finished_at > 12 * H
    assert sky.jobs[1].recovery_count == 1  # SkyPilot's own recovery brought it back


def test_spot_fallback_goes_on_demand_for_good(tmp_path: Path) -> None:
    up = [True] * ticks(2) + [False] * ticks(6) + [True] * ticks(30)
    sky, controller, clock = world(tmp_path, up, "spot-fallback", deadline_h=None)
    drive(sky, controller, clock)
    assert [(s["from"], s["to"]) for s in controller.state.switches] == [("spot", "on-demand")]
    # spot counts as missing after spot_wait_s (10 min) of a pending spot launch
    assert controller.state.switches[0]["at"] == pytest.approx(2 * H + 600, abs=120)


def test_switch_from_a_running_job_waits_for_the_checkpoint(tmp_path: Path) -> None:
    up = [True] * ticks(30)
    sky, controller, clock = world(tmp_path, up, "deadline", deadline_h=12)
    controller.launch(Mode.SPOT, "launch")
    sky.advance(20 * 60)
    controller.tick()
    assert sky.jobs[1].status == "RUNNING"
    step = sky.step
    controller._begin_switch(Mode.ON_DEMAND, "test", sky.queue([1])[0], {"step": step}, clock())
    assert controller.state.pending.asked_checkpoint
    assert ("cancel", 1) not in sky.calls  # not before the trainer has saved
    sky.advance(60)  # the trainer sees the request, checkpoints and stops
    controller.tick()
    assert ("cancel", 1) in sky.calls and sky.jobs[2].spot is False
    assert sky.saved == step  # nothing lost by the switch


def test_status_says_where_the_controller_runs_and_when_it_died(tmp_path: Path) -> None:
    up = [True] * ticks(30)
    sky, controller, clock = world(tmp_path, up, "deadline", deadline_h=12)
    controller.launch(Mode.SPOT, "launch")
    controller.tick()
    fields = status_fields(tmp_path / "job", now=clock(), config=controller.config)["controller"]
    assert fields["alive"] and fields["where"] == "test" and fields["mode"] == "spot"
    late = status_fields(tmp_path / "job", now=clock() + 3600, config=controller.config)["controller"]
    assert not late["alive"] and "SkyPilot's own recovery" in late["note"] and "ftorch resume" in late["note"]
    assert (tmp_path / "job" / STATE_FILE).stat().st_mode & 0o077 == 0


def test_trainer_watches_the_run_store_for_a_stop_request(tmp_path: Path) -> None:
    class Flag:
        reason = None

        def set(self, reason: str) -> None:
            self.reason = reason

        def is_set(self) -> bool:
            return self.reason is not None

    store = RunStore(str(tmp_path / "run"), retry_seconds=1)
    flag = Flag()
    watcher = StopRequestWatcher(flag, store, poll_s=0.01)
    assert not watcher.check() and not flag.is_set()
    store.write_json(STOP_REQUEST, {"reason": "cancel", "at": watcher.since - 60})
    assert not watcher.check()  # a request from before this attempt (an old cancel) is stale
    request_stop(store, "policy switch to on-demand: behind")
    assert watcher.check() and "switch to on-demand" in (flag.reason or "")


def test_switches_reach_the_registry_and_ftorch_status(tmp_path: Path, ftorch_home: Path, capsys) -> None:
    """The wiring: each relaunch is recorded like a launch (attempts, cost kept), status shows them."""
    import sys

    from orchestrator.backends.skypilot_controller import registry_hooks
    from orchestrator.cli import app as cli
    from orchestrator.jobfile.spec import load_job
    from orchestrator.registry import Registry
    from orchestrator.views.status import status_one

    run_uri = str(tmp_path / "run")
    spec = load_job(Path("examples/llama3-8b-qlora-deadline.yaml"), [f"checkpoint.uri={tmp_path}"])
    registry = Registry()
    job = registry.create_job("job-1", spec.name, "skypilot", run_uri, run_uri + "/output", spec.model_dump())
    up = [True] * ticks(2) + [False] * ticks(6) + [True] * ticks(30)
    sky, controller, clock = world(tmp_path, up, "deadline", deadline_h=12)
    controller.job_dir = registry.job_dir(job.job_id)
    controller.config.tick_s = GAP  # fewer ticks: each one writes the registry

    controller.hooks = registry_hooks(registry, job.job_id)
    drive(sky, controller, clock)
    registry.set_state(job.job_id, "SUCCEEDED", "finished")
    row = registry.get(job.job_id)
    assert row.backend_job_id == str(len(sky.jobs))  # the newest managed job is the one status follows
    switches = status_one(job.job_id)["controller"]["switches"]
    assert [s["to"] for s in switches][:2] == ["on-demand", "spot"]
    sys.argv = ["ftorch", "status", job.job_id]
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code
    out = capsys.readouterr().out
    assert "controller on test: ended" in out and "attempt 2: spot -> on-demand" in out
    attempts = registry.attempts(job.job_id)
    # one attempt per placement: the first spot run, then one per switch (the probes that found no spot
    # never ran); each ended by the switch that followed it, with the controller's reason
    assert attempts[0].spot is True and attempts[1].spot is False
    assert attempts[0].end_reason.startswith("preempted") and "switched to spot" in attempts[1].end_reason
    assert [s["attempt"] for s in switches][:2] == [2, 3]


def test_dry_run_shows_the_controllers_plan(ftorch_home: Path, capsys) -> None:
    import sys

    from orchestrator.cli import app as cli

    sys.argv = [
        "ftorch",
        "launch",
        "examples/llama3-8b-qlora-deadline.yaml",
        "--backend",
        "skypilot",
        "--dry-run",
        "--set",
        "resources.budget_usd=100",
    ]
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code
    out = capsys.readouterr().out
    assert "controller: policy deadline" in out and "deadline: 20h" in out
    assert "spot list: aws L40S" in out and "on-demand list:" in out
    assert "cancel, relaunch with the other list" in out
    # the budget is the trainer's now (trainer/stops/budget.py), no longer the controller's spend.json
    assert "budget: $100;" in out and "the trainer stops itself" in out and "STOPPED (budget)" in out
    assert "relaunch with the lost region's offers last" in out


def test_the_controller_process_is_built_from_the_registry(tmp_path: Path, ftorch_home: Path) -> None:
    from orchestrator.backends import skypilot
    from orchestrator.backends.skypilot_controller import for_job, save_tasks, tasks_for
    from orchestrator.jobfile.spec import load_job
    from orchestrator.registry import Registry

    spec = load_job(Path("examples/llama3-8b-qlora-deadline.yaml"))
    registry = Registry()
    job = registry.create_job("job-2", spec.name, "skypilot", str(tmp_path / "run"), "out", spec.model_dump())

    _plan, task = skypilot.render_job(spec, job.job_id, job.run_uri)
    tasks = tasks_for(spec, job.job_id, job.run_uri, task, skypilot.render_job)
    assert set(tasks) == {Mode.SPOT, Mode.ON_DEMAND}  # on-demand offers added: the job has no fallback
    save_tasks(registry.job_dir(job.job_id), tasks, 300.0, 12 * H)
    controller = for_job(job.job_id)
    assert controller.plan.deadline_s == pytest.approx(job.created_at + 20 * H)
    assert controller.plan.policy.name == "deadline" and controller.plan.work_s_hint == 12 * H
    assert (registry.job_dir(job.job_id) / "controller_tasks.json").stat().st_mode & 0o077 == 0


def test_resume_restarts_a_dead_controller_of_a_running_job(
    tmp_path: Path, ftorch_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.backends import skypilot_controller
    from orchestrator.errors import UserError
    from orchestrator.jobfile.spec import load_job
    from orchestrator.jobs import lifecycle as jobs
    from orchestrator.registry import Registry
    from orchestrator.spot.controller_state import write_state

    spec = load_job(Path("examples/llama3-8b-qlora-deadline.yaml"))
    registry = Registry()
    job = registry.create_job("job-3", spec.name, "skypilot", str(tmp_path / "run"), "out", spec.model_dump())
    registry.set_state(job.job_id, "RUNNING", None)
    job_dir = registry.job_dir(job.job_id)
    skypilot_controller.save_tasks(job_dir, split_resources(TASK), 300.0, 3600.0)
    write_state(job_dir, {"mode": "spot", "heartbeat_at": 1.0, "where": "laptop (pid 1)", "switches": []})
    note = status_fields(job_dir)["controller"]["note"]
    assert "not alive" in note and "SkyPilot's own recovery" in note
    started: list[str] = []
    monkeypatch.setattr(skypilot_controller, "spawn", lambda reg, j: started.append(j.job_id) or 1)
    assert "controller is started again" in jobs.resume(job.job_id, [])
    assert started == [job.job_id]
    # a live controller holds the run's lease (a heartbeat alone no longer counts): never a second
    from trainer.runstore.lease import Lease

    Lease(RunStore(str(tmp_path / "run")), "server (pid 2)", ttl_s=600).acquire()
    with pytest.raises(UserError, match="only"):  # alive: nothing to restart, and running jobs do not resume
        jobs.resume(job.job_id, [])


def test_cancel_waits_for_the_checkpoint_then_cancels(tmp_path: Path, ftorch_home: Path) -> None:
    """`ftorch cancel` on SkyPilot: stop request in the run store, the trainer saves, then the cancel;
    one implementation with the controller's switch (controller.stop_then_cancel)."""
    from orchestrator.backends.skypilot import cancel_job
    from orchestrator.jobfile.spec import load_job
    from orchestrator.registry import Registry

    spec = load_job(Path("examples/llama3-8b-qlora-deadline.yaml"), [f"checkpoint.uri={tmp_path}"])
    registry = Registry()
    job = registry.create_job("job-1", spec.name, "skypilot", str(tmp_path / "run"), "out", spec.model_dump())
    sky, controller, clock = world(tmp_path, [True] * ticks(30), "deadline", deadline_h=12)
    controller.launch(Mode.SPOT, "launch")
    sky.advance(28 * 60)
    registry.update(job.job_id, backend_job_id="1")
    job = registry.get(job.job_id)
    step = sky.step
    assert step > sky.saved  # work since the last periodic checkpoint
    message = cancel_job(registry, job, client=sky, store=controller.store, clock=clock, sleep=sky.advance)
    assert ("cancel", 1) in sky.calls and sky.saved == step  # saved before the cancel: nothing lost
    assert "checkpoint saved after 10 s" in message
    assert registry.get(job.job_id).state == "CANCELLED"
    assert controller.store.read_json_or_none(STOP_REQUEST) is None


def test_cancel_does_not_wait_past_its_bound(tmp_path: Path) -> None:
    from orchestrator.spot.controller import stop_then_cancel

    sky, controller, clock = world(tmp_path, [True] * ticks(30), "deadline", deadline_h=12)
    controller.launch(Mode.SPOT, "launch")
    sky.advance(25 * 60)
    waited: list[float] = []
    outcome = stop_then_cancel(sky, controller.store, 1, "user", timeout_s=600, clock=clock,
                               sleep=lambda s: (waited.append(s), setattr(clock, "now", clock.now + s)))  # fmt: skip
    assert outcome == {"asked_checkpoint": True, "saved": False, "waited_s": 600.0}  # a hung trainer
    assert sum(waited) == 600 and ("cancel", 1) in sky.calls

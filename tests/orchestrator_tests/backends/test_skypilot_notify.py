"""What a SkyPilot job does with nobody watching: the rendered `ordered` list falls back to on demand by
itself (deadline, spot-fallback), and SkyPilot's jobs controller posts what a dead trainer cannot say
through the task's `event_callback`, bounded.

The callback is run by SkyPilot 0.14.1's own `sky.jobs.utils.event_callback_func` (the function its jobs
controller calls on every status change), in-process with a private HOME, against a real HTTP receiver
on 127.0.0.1; the task is the rendered one, loaded by SkyPilot's own `Task.from_yaml_config`.
"""

from __future__ import annotations

import asyncio
import copy
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, ftorch
from http_fakes import Hook

from orchestrator.backends import skypilot_render as sr
from orchestrator.backends.skypilot import render_job
from orchestrator.jobfile.spec import load_job

DEADLINE = REPO / "examples/llama3-8b-qlora-deadline.yaml"
ALL_ON = "notify.on=[succeeded,failed,budget,preempted,cancelled,resumed]"


@pytest.fixture(scope="module")
def sky(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """SkyPilot with a private HOME (its jobs state database and callback logs go there)."""
    sky = pytest.importorskip("sky")
    home = tmp_path_factory.mktemp("sky-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("SKYPILOT_DISABLE_LOCAL_API_SERVER", "1")
        yield sky


@pytest.fixture()
def hook() -> Iterator[Hook]:
    server = Hook()
    yield server
    server.close()


class Hang:
    """A receiver that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        for conn in self.held:
            conn.close()
        self.sock.close()


def render(path: Path, *overrides: str) -> tuple[Any, dict[str, Any]]:
    spec = load_job(path, list(overrides), check_support=False)
    return render_job(spec, "job-1", "s3://b/ftorch/job-1", environ={})


def run_callback(sky: Any, task: dict[str, Any], status: str, job_id: int = 7) -> float:
    """SkyPilot's own callback runner for `status`, as its jobs controller calls it; returns seconds taken."""
    from sky.jobs import utils as jobs_utils

    loaded = sky.Task.from_yaml_config(copy.deepcopy(task))
    callback = jobs_utils.event_callback_func(job_id, 0, loaded)
    start = time.monotonic()
    asyncio.run(callback(status))
    return time.monotonic() - start


def test_the_deadline_example_lists_on_demand_after_spot_and_skypilot_keeps_the_order(sky: Any) -> None:
    _plan, task = render(DEADLINE)
    entries = task["resources"]["ordered"]
    spots = [e["use_spot"] for e in entries]
    first_od = spots.index(False)
    assert first_od > 0 and all(spots[:first_od]) and not any(spots[first_od:]), spots
    # SkyPilot's loader keeps `ordered` as a list in this order, spot and on-demand mixed in one list
    loaded = sky.Task.from_yaml_config(copy.deepcopy(task))
    assert isinstance(loaded.resources, list)
    assert [r.use_spot for r in loaded.resources] == spots
    assert {r.job_recovery["strategy"] for r in loaded.resources} == {"EAGER_NEXT_REGION"}


@pytest.mark.parametrize(
    ("overrides", "on_demand_after_spot"),
    [
        (["resources.deadline=null", "resources.policy=spot-fallback"], True),
        (["resources.deadline=null", "resources.fallback=on-demand"], True),
        (["resources.deadline=null"], False),  # spot-only: never on demand
        (["resources.policy=spot-only"], False),  # a deadline the user chose not to act on
        (["resources.spot=false"], None),  # on demand only
    ],
)
def test_which_policies_fall_back_inside_the_task(
    overrides: list[str], on_demand_after_spot: bool | None
) -> None:
    _plan, task = render(DEADLINE, *overrides)
    spots = [e["use_spot"] for e in task["resources"]["ordered"]]
    if on_demand_after_spot is None:
        assert not any(spots)
    elif on_demand_after_spot:
        assert spots[0] and not spots[-1] and spots == sorted(spots, reverse=True)
    else:
        assert all(spots)


def test_the_example_with_notify_renders_a_bounded_event_callback(sky: Any) -> None:
    spec = load_job(DEADLINE, check_support=False)
    assert spec.notify is not None and spec.notify.webhook  # the example carries a notify section
    _plan, task = render(DEADLINE)
    callback = task["event_callback"]
    assert f"timeout -k 2 {sr.CALLBACK_TIMEOUT_S} python3" in callback and "|| true" in callback
    assert 'case "$JOB_STATUS" in RECOVERING|FAILED)' in callback  # the example's on: has no cancelled
    # the URL is in the task's envs (what the callback sees), not in the callback text SkyPilot logs
    assert spec.notify.webhook not in callback
    assert task["envs"][sr.NOTIFY_ENV] == spec.notify.webhook
    loaded = sky.Task.from_yaml_config(copy.deepcopy(task))
    assert loaded.event_callback == callback
    # nothing asked for that a dead trainer cannot say: no callback (the trainer posts succeeded itself)
    _plan, quiet = render(DEADLINE, "notify.on=[succeeded,budget]")
    assert "event_callback" not in quiet and sr.NOTIFY_ENV not in quiet["envs"]
    _plan, none = render(DEADLINE, "notify=null")
    assert "event_callback" not in none


def test_skypilots_callback_posts_once_per_status_it_cannot_leave_to_the_trainer(
    sky: Any, hook: Hook
) -> None:
    _plan, task = render(DEADLINE, f"notify.webhook={hook.url}", ALL_ON)
    statuses = ["SUBMITTED", "STARTING", "STARTED", "RECOVERING", "RECOVERED", "FAILED", "CANCELLING"]
    statuses += ["CANCELLED", "SUCCEEDED"]
    for status in statuses:
        run_callback(sky, task, status)
    got = [(r["body"]["event"], r["body"]["state"]) for r in hook.received]
    assert got == [("preempted", "RECOVERING"), ("failed", "FAILED"), ("cancelled", "CANCELLED")]
    body = hook.received[0]["body"]
    assert hook.received[0]["type"] == "application/json"
    assert body["source"] == "skypilot" and body["job_id"] == "job-1" and body["sky_job_id"] == "7"
    assert body["run_uri"] == "s3://b/ftorch/job-1" and abs(body["at"] - time.time()) < 60
    assert "job-1 PREEMPTED" in body["text"] and "recovering" in body["text"]
    # the trainer's payload format: the same keys, whoever sends
    from trainer.recording.notify import PAYLOAD_KEYS

    assert set(PAYLOAD_KEYS) | {"event", "at", "source", "text", "sky_job_id"} == set(body)


def test_skypilots_callback_gets_the_tasks_envs_never_its_secrets(sky: Any, hook: Hook) -> None:
    """Issue 30: why the webhook stays an env of the task (docs/clouds.md): SkyPilot 0.14.1's callback
    runner (sky/jobs/utils.py event_callback_func) hands the callback `task.envs` and its own variables,
    not `task.secrets`, so a webhook moved to `secrets` is never posted to. The URL is not in the
    callback's text either (SkyPilot logs that). If this fails, SkyPilot passes secrets now: move it."""
    _plan, task = render(DEADLINE, f"notify.webhook={hook.url}", ALL_ON)
    assert hook.url not in task["event_callback"]
    as_secret = copy.deepcopy(task)
    as_secret["secrets"] = {
        **(as_secret.get("secrets") or {}),
        sr.NOTIFY_ENV: as_secret["envs"].pop(sr.NOTIFY_ENV),
    }
    run_callback(sky, as_secret, "FAILED")
    assert hook.received == []
    run_callback(sky, task, "FAILED")
    assert [r["body"]["event"] for r in hook.received] == ["failed"]


def test_a_receiver_that_hangs_holds_skypilot_no_longer_than_the_bound(sky: Any) -> None:
    hang = Hang()
    try:
        _plan, task = render(DEADLINE, f"notify.webhook={hang.url}", ALL_ON)
        took = run_callback(sky, task, "RECOVERING")
        assert hang.held, "the callback reached the receiver"
        assert sr.CALLBACK_TIMEOUT_S - 5 < took < sr.CALLBACK_TIMEOUT_S + 3, took  # it waited, then gave up
        # a receiver that is not there at all: fails fast, never raises into SkyPilot
        _plan, task = render(DEADLINE, "notify.webhook=http://127.0.0.1:9/x", ALL_ON)
        assert run_callback(sky, task, "FAILED") < sr.CALLBACK_TIMEOUT_S
    finally:
        hang.close()


def test_notify_command_is_refused_for_skypilot_in_one_line(tmp_path: Path) -> None:
    done = ftorch("launch", str(DEADLINE), "--dry-run", "--set", "notify.command=echo hi")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "notify.command" in lines[0] and "notify.webhook" in lines[0]
    assert done.stdout == ""

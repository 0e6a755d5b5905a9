"""`ftorch sweep`: one job per grid point as a group with one shared budget, the local device queue
(jobs take turns: PENDING while another holds the device), and `status` ranking the group by held-out loss."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from helpers import ftorch, job_dict, write_data

from orchestrator.backends.local_queue import DeviceQueue
from orchestrator.records import cost_usd
from orchestrator.registry import TERMINAL, Registry


def _sweep_job(tmp_path: Path, tiny_model: Path) -> Path:
    data = write_data(tmp_path / "d.jsonl", "instruction", 48)
    job = job_dict(
        tiny_model,
        data,
        tmp_path / "runs",
        name="sw",
        data={"eval_examples": 8},
        train={"max_steps": 8, "log_every": 2},
        local={"hourly_usd": 0.36},
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _wait_all_ended(registry: Registry, job_ids: list[str], timeout: float = 600.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(registry.get(j).state in TERMINAL for j in job_ids):
            return
        time.sleep(0.5)
    raise AssertionError({j: (registry.get(j).state, registry.get(j).reason) for j in job_ids})


def test_a_two_point_sweep_runs_as_two_jobs_one_after_the_other(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    job_file = _sweep_job(tmp_path, tiny_model)
    done = ftorch("sweep", str(job_file), "--grid", "train.lr=1e-3,2e-2", "--budget", "10", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    ids = [j["job_id"] for j in result["jobs"]]
    assert [j["point"] for j in result["jobs"]] == [{"train.lr": "1e-3"}, {"train.lr": "2e-2"}]
    registry = Registry()
    assert [registry.get(j).spec["train"]["lr"] for j in ids] == [1e-3, 2e-2]
    _wait_all_ended(registry, ids)
    assert [registry.get(j).state for j in ids] == ["SUCCEEDED", "SUCCEEDED"], [
        registry.get(j).reason for j in ids
    ]

    # one after the other: every attempt of the later job starts after the earlier job's last one ended
    spans = {j: [(a.started_at, a.ended_at) for a in registry.attempts(j)] for j in ids}
    first, second = sorted(ids, key=lambda j: spans[j][0][0])
    assert min(s for s, _ in spans[second]) >= max(e for _, e in spans[first])
    # the later one waited its turn, PENDING, naming the job that held the device
    queued = [e for e in registry.events(second) if e["kind"] == "queued"]
    assert queued and first in queued[0]["detail"], registry.events(second)
    states = [e["detail"].split(":")[0] for e in registry.events(second) if e["kind"] == "state"]
    assert states[:3] == ["PENDING", "PENDING", "PROVISIONING"], states

    # one shared budget: the later job got what the earlier one left
    spent_first = cost_usd(registry.attempts(first), registry.get(first).state, time.time())
    assert spent_first > 0
    assert registry.get(second).spec["resources"]["budget_usd"] == pytest.approx(10 - spent_first, abs=1e-6)
    assert registry.get(second).run_store().read_spec()["job"]["resources"]["budget_usd"] == pytest.approx(
        10 - spent_first, abs=1e-6
    )

    # status: the group, ranked by held-out loss
    rows = json.loads(ftorch("status", "--json").stdout)
    assert {r["group"] for r in rows} == {result["group_id"]}
    held = {r["job_id"]: r["eval_loss"] for r in rows}
    assert all(isinstance(v, float) for v in held.values()), held
    assert held[ids[0]] != held[ids[1]]
    best, worst = sorted(ids, key=held.__getitem__)
    text = ftorch("status", env={"COLUMNS": "160"}).stdout
    assert result["group_id"] in text and "of a shared $10.00 budget" in text, text
    lines = [line.split() for line in text.splitlines() if best in line or worst in line]
    assert [(cells[0], cells[1]) for cells in lines] == [("1", best), ("2", worst)], text


def test_a_sweep_with_a_wrong_point_launches_nothing(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    job_file = _sweep_job(tmp_path, tiny_model)
    for grid, says in [
        ("train.lr", "--grid: 'train.lr' is not key.path=v1,v2"),
        ("train.lr=1e-3,", "has an empty value"),
        ("name=a,b", "name cannot vary"),
        ("train.lr=1e-3,-1", "train.lr"),
        ("train.lrr=1,2", "train.lrr"),
    ]:
        done = ftorch("sweep", str(job_file), "--grid", grid)
        assert done.returncode == 2, (grid, done.stdout, done.stderr)
        assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert Registry().jobs() == []
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_device_queue_is_first_come_first_served_and_survives_a_dead_holder(tmp_path: Path) -> None:
    first, second = DeviceQueue(tmp_path, "job-a"), DeviceQueue(tmp_path, "job-b")
    assert first.wait(lambda: False, lambda reason: None)
    told: list[str] = []
    deadline = time.time() + 0.6
    assert not second.wait(lambda: time.time() > deadline, told.append, poll_s=0.05)  # busy: it waited
    assert told == ["queued for this machine's device (job-a is using it)"]
    first.release()
    assert second.wait(lambda: False, told.append)
    assert len(told) == 1  # free: no wait
    # a ticket left by a process that is gone does not hold the line
    (tmp_path / "queue" / f"{1:020d}-ghost").write_text("999999999 1.0\n")
    second.release()
    assert DeviceQueue(tmp_path, "job-c").wait(lambda: False, told.append)
    assert not (tmp_path / "queue" / f"{1:020d}-ghost").exists()

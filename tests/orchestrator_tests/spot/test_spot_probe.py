"""The trainer's side of going back to spot with nobody watching: where an attempt landed (instance
metadata), the probes it records in the run store with their back-off, and one real trainer run that
probes (checkpoint, exit 75) and whose next attempt records that it landed on spot."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import job_dict, prepare_run, run_trainer, write_data
from http_fakes import FakeMetadata, _closed_port_url

from trainer import exitcodes
from trainer.config import JobSpec
from trainer.runstore.store import RunStore
from trainer.stops.lifecycle import on_spot
from trainer.stops.spot_probe import ENV, LANDINGS, SpotProbe, read_landings
from trainer.stops.spot_return import ON_DEMAND, SPOT, Landing

H = 3600.0


@pytest.fixture()
def off_cloud(monkeypatch: pytest.MonkeyPatch) -> None:
    for provider in ("AWS", "GCP", "AZURE"):
        monkeypatch.setenv(f"FTORCH_{provider}_METADATA_URL", _closed_port_url())
    monkeypatch.delenv("FTORCH_ON_SPOT", raising=False)


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_spot_or_on_demand_from_the_metadata_service(
    provider: str, off_cloud: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeMetadata(provider) as fake:
        monkeypatch.setenv(f"FTORCH_{provider.upper()}_METADATA_URL", fake.url)
        assert on_spot() is True
        fake.market = "on-demand"
        assert on_spot() is False
    assert on_spot() is None  # nothing answers: unknown
    assert on_spot({"FTORCH_ON_SPOT": "0"}) is False and on_spot({"FTORCH_ON_SPOT": "1"}) is True


def _spec(tmp_path: Path, deadline: str | None = "20h") -> JobSpec:
    job = job_dict(tmp_path / "model", tmp_path / "data.jsonl", tmp_path / "runs")
    job.setdefault("resources", {})["deadline"] = deadline
    return JobSpec.model_validate(job)


def test_an_attempt_on_demand_probes_when_ahead_and_backs_off(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "store"))
    spec, logs = _spec(tmp_path), []
    t0 = 1_000_000.0
    resolved = {"created_at": t0}
    env = {ENV: json.dumps({"restart_overhead_s": 300}), "FTORCH_ON_SPOT": "0"}
    probe = SpotProbe.open(store, spec, resolved, 2, logs.append, env=env, now=t0 + 2 * H)
    assert probe is not None
    assert read_landings(store) == [Landing(t0 + 2 * H, 2, ON_DEMAND)]
    # 10 h of work, 3 h done at 2.5 h: ahead of the line (1.25 h), but within an hour of falling back
    rate = 1000 / (10 * H)
    assert not probe.due(300, 1000, rate, now=t0 + 2.5 * H)
    assert not probe.due(120, 1000, rate, now=t0 + 3.1 * H)  # an hour on, but behind the line
    assert probe.due(400, 1000, rate, now=t0 + 3.2 * H)  # ahead: probe
    assert read_landings(store)[-1] == Landing(t0 + 3.2 * H, 2, None, probe=True)
    assert "ahead" in probe.reason
    # the next attempt lands on demand again: the probe failed; the next one waits two hours
    again = SpotProbe.open(store, spec, resolved, 3, logs.append, env=env, now=t0 + 3.3 * H)
    assert again is not None and read_landings(store)[-1] == Landing(t0 + 3.2 * H, 2, ON_DEMAND, probe=True)
    assert not again.due(500, 1000, rate, now=t0 + 5.1 * H)
    assert again.due(500, 1000, rate, now=t0 + 5.3 * H)
    # that one lands on spot: recorded, nothing more to do
    assert SpotProbe.open(store, spec, resolved, 4, logs.append, env={**env, "FTORCH_ON_SPOT": "1"}) is None
    assert [x.landed for x in read_landings(store)] == [ON_DEMAND, ON_DEMAND, SPOT]
    assert "landed on spot" in logs[-1]


def test_no_probes_without_the_env_or_a_deadline_policy(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "store"))
    env = {ENV: "{}", "FTORCH_ON_SPOT": "0"}
    resolved = {"created_at": time.time()}
    assert SpotProbe.open(store, _spec(tmp_path), resolved, 1, print, env={"FTORCH_ON_SPOT": "0"}) is None
    assert SpotProbe.open(store, _spec(tmp_path, None), resolved, 1, print, env=env) is None
    assert not store.exists(LANDINGS)  # the local supervisor's jobs: nothing recorded


def test_a_real_trainer_on_demand_probes_and_its_next_attempt_lands_on_spot(
    tiny_model: Path, tmp_path: Path
) -> None:
    data = write_data(tmp_path / "data.jsonl", "instruction", 64)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 40})
    job["checkpoint"]["every"] = 100000  # only the probe makes a checkpoint before the end
    run_uri = prepare_run(job, "probe-run")
    store = RunStore(run_uri)
    resolved = store.read_spec()  # a SkyPilot job's: a deadline (refused on a local run without chaos)
    resolved["job"]["resources"]["deadline"] = "12h"
    store.write_spec({**resolved, "created_at": time.time()})
    # no back-off (probe_base_s 0): it probes at its first check, once it knows its speed
    settings = json.dumps({"restart_overhead_s": 0, "probe_base_s": 0})
    env = {ENV: settings, "FTORCH_ON_SPOT": "0", "FTORCH_NOTICES": "0"}
    first = run_trainer(run_uri, 2, env=env)
    assert first.returncode == exitcodes.PREEMPTED, first.stderr[-3000:]
    assert "probing for spot" in first.stderr + first.stdout
    step = store.complete_checkpoints()[-1].step
    assert 0 < step < 40
    assert read_landings(store)[-1].probe and read_landings(store)[-1].landed is None
    second = run_trainer(run_uri, 3, env={**env, "FTORCH_ON_SPOT": "1"})
    assert second.returncode == exitcodes.OK, second.stderr[-3000:]
    assert read_landings(store)[-1] == Landing(read_landings(store)[-1].at_s, 2, SPOT, probe=True)
    assert "resumed from" in second.stderr + second.stdout

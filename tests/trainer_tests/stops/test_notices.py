"""The cloud preemption-notice watcher against a local server that imitates the metadata services.

The server speaks AWS IMDSv2 (token PUT, then `spot/instance-action` with the token: 404 until a notice,
then the notice JSON), GCE (`instance/preempted` with `Metadata-Flavor: Google`: FALSE, then TRUE) and
Azure scheduled events. The real trainer runs against it: notice -> checkpoint -> exit 75; no notice ->
the run finishes as if there were no watcher.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers import REPO, job_dict, prepare_run, trainer_cmd, write_data
from http_fakes import FakeMetadata, _closed_port_url

from trainer import exitcodes
from trainer.runstore.store import RunStore
from trainer.stops.notices import NoticeWatcher, detect, start_watcher
from trainer.stops.preemption import PreemptionFlag


@pytest.fixture()
def notice_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every provider points at a closed port unless a test points it at a fake server."""
    for provider in ("AWS", "GCP", "AZURE"):
        monkeypatch.setenv(f"FTORCH_{provider}_METADATA_URL", _closed_port_url())
    monkeypatch.setenv("FTORCH_NOTICE_POLL_S", "0.05")
    monkeypatch.delenv("FTORCH_NOTICES", raising=False)
    monkeypatch.delenv("FTORCH_NOTICE_PROVIDERS", raising=False)


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_watcher_sets_the_flag_on_a_notice(
    provider: str, notice_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeMetadata(provider) as fake:
        monkeypatch.setenv(f"FTORCH_{provider.upper()}_METADATA_URL", fake.url)
        flag = PreemptionFlag()
        watcher = start_watcher(flag)
        assert watcher is not None
        assert watcher.detected.wait(5)
        assert watcher.provider == provider
        time.sleep(0.3)  # several polls without a notice: nothing happens
        assert not flag.is_set()
        fake.notice.set()
        deadline = time.time() + 5
        while not flag.is_set() and time.time() < deadline:
            time.sleep(0.02)
        assert flag.is_set(), "the notice did not reach the flag"
        assert provider in (flag.reason or "")
        watcher.join(2)
        assert not watcher.is_alive()
    if provider == "aws":  # IMDSv2: a token was fetched and sent, never the v1 path without one
        assert ("PUT", "/latest/api/token") in fake.requests


def test_not_on_a_cloud_is_detected_fast_and_costs_nothing(notice_env: None) -> None:
    started = time.time()
    flag = PreemptionFlag()
    watcher = NoticeWatcher(flag)
    watcher.start()
    watcher.join(5)
    assert not watcher.is_alive(), "the watcher must stop when no metadata service answers"
    assert watcher.provider is None
    assert time.time() - started < 3
    assert not flag.is_set()


def test_the_wrong_service_is_not_taken_for_a_cloud(
    notice_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GCE-like URL served by something that does not say Metadata-Flavor: Google is not GCE."""
    with FakeMetadata("aws") as not_gcp:
        monkeypatch.setenv("FTORCH_GCP_METADATA_URL", not_gcp.url)
        assert detect(("gcp",), timeout=1) is None


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_a_metadata_service_that_answers_late_is_still_found(
    provider: str, notice_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first probe times out (a VM busy loading a model); the next, with a longer timeout, finds it.

    Before the retry, one slow answer at start-up left the whole run unwatched (a CI failure)."""
    with FakeMetadata(provider) as fake:
        monkeypatch.setenv(f"FTORCH_{provider.upper()}_METADATA_URL", fake.url)
        fake.slow_answers, fake.slow_s = 1, 0.6
        assert detect((provider,), timeout=0.2, rounds=1) is None
        fake.slow_answers = 1
        watcher = detect((provider,), timeout=0.2)
        assert watcher is not None and watcher.name == provider
        assert watcher.poll() is None  # and it polls with the timeout that worked


def test_a_refused_probe_is_not_retried(notice_env: None) -> None:
    """Off a cloud nothing answers: refusals end detection at once, without the longer retries."""
    started = time.time()
    assert detect(timeout=2.0) is None
    assert time.time() - started < 1.5


def test_disabled_by_env(notice_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTORCH_NOTICES", "0")
    assert start_watcher(PreemptionFlag()) is None


# ---- the real trainer ----------------------------------------------------------------------------
def _start_trainer(run_uri: str, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    handle = open(log_path, "wb")  # noqa: SIM115 - closed by the caller via the process
    return subprocess.Popen(trainer_cmd(run_uri), stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def _trainer_env(provider: str, url: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("AWS", "GCP", "AZURE"):
        env[f"FTORCH_{name}_METADATA_URL"] = _closed_port_url()
    env[f"FTORCH_{provider.upper()}_METADATA_URL"] = url
    env.update(FTORCH_NOTICE_POLL_S="0.05", FTORCH_PROGRESS_EVERY_S="0.05", FTORCH_NOTICES="1")
    # a loaded CI machine can take seconds to answer; the product's 0.5 s (then 1, 2 s) is for real VMs
    env["FTORCH_NOTICE_PROBE_TIMEOUT_S"] = "5"
    return env


def test_trainer_checkpoints_and_exits_75_on_an_aws_notice(tiny_model: Path, tmp_path: Path) -> None:
    data = write_data(tmp_path / "data.jsonl", "instruction", 64)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 3000})
    job["checkpoint"]["every"] = 100000  # only the notice makes a checkpoint
    run_uri = prepare_run(job, "notice-run")
    store = RunStore(run_uri)
    log_path = tmp_path / "trainer.log"
    with FakeMetadata("aws") as fake:
        proc = _start_trainer(run_uri, _trainer_env("aws", fake.url), log_path)
        try:
            deadline = time.time() + 120
            while time.time() < deadline and proc.poll() is None:
                progress = store.read_progress() or {}
                if progress.get("step", 0) >= 5:
                    break
                time.sleep(0.05)
            assert proc.poll() is None, log_path.read_text()
            fake.notice.set()
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = log_path.read_text()
    assert code == exitcodes.PREEMPTED, log
    assert "watching aws preemption notices" in log
    assert "preemption notice: aws spot terminate" in log
    checkpoints = store.complete_checkpoints()
    assert len(checkpoints) == 1, log
    step = checkpoints[0].step
    assert 5 <= step < 3000
    assert store.read_progress()["state"] == "preempted"
    assert store.read_progress()["last_checkpoint_step"] == step


def test_trainer_without_a_notice_runs_to_the_end(tiny_model: Path, tmp_path: Path) -> None:
    """On a (fake) GCE VM that is never preempted, the watcher polls and changes nothing."""
    data = write_data(tmp_path / "data.jsonl", "instruction", 64)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 12})
    run_uri = prepare_run(job, "quiet-run")
    log_path = tmp_path / "trainer.log"
    with FakeMetadata("gcp") as fake:
        proc = _start_trainer(run_uri, _trainer_env("gcp", fake.url), log_path)
        code = proc.wait(timeout=120)
    log = log_path.read_text()
    assert code == exitcodes.OK, log
    assert "watching gcp preemption notices" in log
    assert "preemption notice:" not in log and "exiting with code 75" not in log
    assert ("GET", "/computeMetadata/v1/instance/preempted") in fake.requests
    assert (RunStore(run_uri).read_progress() or {}).get("state") == "finished"

"""Faults with nothing lost: transient store errors through a fault-injecting proxy, a permanent outage
mid-run, a full staging disk. Every run ends bitwise equal to an uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import assert_bitwise_equal, write_data
from s3runs import job_for, local_reference, prepare_s3_run, run, s3_final_weights, start, wait_for_line
from s3server import Faults

from trainer import exitcodes


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("data") / "d.jsonl", "instruction", 64)


@pytest.fixture(scope="module")
def expected(tiny_model: Path, data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return local_reference(job_for(tiny_model, data, "unused"), tmp_path_factory.mktemp("ref"))


def test_transient_errors_are_retried_and_the_run_is_bitwise_equal(
    tiny_model: Path, data: Path, expected: dict, s3, fault_proxy
) -> None:
    fault_proxy.set(
        Faults(
            p_500=0.06, p_503=0.06, p_reset_before=0.04, p_reset_after=0.04, p_slow=0.05, slow_s=0.3, seed=5
        )
    )
    store = prepare_s3_run(job_for(tiny_model, data, f"{s3.uri}/runs"), "flaky", s3.endpoint)
    done = run(store, fault_proxy.endpoint, 1)
    assert done.returncode == 0, done.stdout + done.stderr
    injected = sum(fault_proxy.injected.values())
    assert injected >= 10 and {"500", "503", "reset_before", "reset_after"} <= set(fault_proxy.injected)
    assert_bitwise_equal(s3_final_weights(store), expected)


def test_permanent_outage_mid_run_keeps_training_then_stops_cleanly(
    tiny_model: Path, data: Path, expected: dict, s3, fault_proxy
) -> None:
    job = job_for(tiny_model, data, f"{s3.uri}/runs", train={"max_steps": 30})
    store = prepare_s3_run(job, "outage", s3.endpoint)
    proc = start(store, fault_proxy.endpoint, 1, FTORCH_STORE_RETRY_S="1", FTORCH_STORE_OUTAGE_S="2")
    seen: list[str] = []
    assert wait_for_line(proc, "checkpoint 5 saved", seen), "".join(seen)
    fault_proxy.set(Faults(outage="deny"))  # access denied from now on: no retry will fix it
    assert proc.stdout is not None
    seen += list(proc.stdout)
    code = proc.wait(timeout=120)
    log = "".join(seen)
    assert code == exitcodes.STORE_UNAVAILABLE, log
    failed_at = next(i for i, line in enumerate(seen) if "NOT saved" in line)
    assert any("] step " in line for line in seen[failed_at:]), "training stopped at the first failure"
    assert "the last good checkpoint is step-00000005" in log
    fault_proxy.set(Faults())
    info, _ = store.newest_valid_checkpoint()
    assert info.step == 5  # intact
    second = run(store, fault_proxy.endpoint, 2)
    assert second.returncode == 0, second.stdout
    assert "resumed from checkpoints/step-00000005" in second.stdout
    assert_bitwise_equal(s3_final_weights(store), expected)


def test_full_staging_disk_is_a_clear_error_and_loses_nothing(
    tiny_model: Path, data: Path, expected: dict, s3, tmp_path: Path
) -> None:
    store = prepare_s3_run(job_for(tiny_model, data, f"{s3.uri}/runs"), "diskfull", s3.endpoint)
    staging = tmp_path / "staging"
    first = run(store, s3.endpoint, 1, FTORCH_STAGING_DIR=str(staging), FTORCH_FAULTS="disk-full@10")
    assert first.returncode == exitcodes.ERROR, first.stdout
    line = next(x for x in first.stdout.splitlines() if "error:" in x)
    assert "cannot stage checkpoint step-00000010" in line and "No space left on device" in line
    assert "step-00000005 is intact" in line
    assert [c.step for c in store.complete_checkpoints()] == [5]
    assert not list(staging.iterdir())  # nothing half-staged left behind
    second = run(store, s3.endpoint, 2, FTORCH_STAGING_DIR=str(staging))
    assert second.returncode == 0, second.stdout
    assert_bitwise_equal(s3_final_weights(store), expected)

"""Chaos on the real S3 server: each kind of interruption (SIGKILL without notice, SIGTERM with notice,
SIGKILL while an upload is in flight) in a random order at random steps, plus transient store faults
through the proxy, and a tokenised-data cache that later attempts use. The run ends bitwise equal to an
uninterrupted one. `FTORCH_SOAK_ROUNDS=3` repeats each kind three times; the long soak (50+ interruptions)
is `bench/soak_interruptions.py`."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest
from helpers import assert_bitwise_equal, write_data
from s3runs import job_for, local_reference, prepare_s3_run, run, s3_final_weights, start, wait_for_line
from s3server import Faults

from trainer import exitcodes

SEED = int(os.environ.get("FTORCH_TEST_SEED", "20261129"))
KINDS = ["kill", "notice", "kill-mid-upload"]
ROUNDS = int(os.environ.get("FTORCH_SOAK_ROUNDS", "1"))


@pytest.mark.timeout(600)  # 4 trainer processes per round of kinds
def test_chaos_soak_ends_bitwise_equal(tiny_model: Path, tmp_path: Path, s3, fault_proxy) -> None:
    rng = random.Random(SEED)
    data = write_data(tmp_path / "d.jsonl", "instruction", 96)
    job = job_for(
        tiny_model, data, f"{s3.uri}/runs", train={"max_steps": 12 + 16 * ROUNDS}, checkpoint={"every": 4}
    )
    expected = local_reference(job, tmp_path)
    store = prepare_s3_run(job, "soak", s3.endpoint)
    flaky = Faults(
        p_500=0.03, p_503=0.03, p_reset_before=0.02, p_reset_after=0.02, p_slow=0.1, slow_s=0.25, seed=SEED
    )
    fault_proxy.set(flaky)
    kinds = KINDS * ROUNDS  # each kind ROUNDS times, in a random order
    rng.shuffle(kinds)
    done_kinds: list[str] = []
    attempt = 0
    step = 0
    for kind in kinds:
        attempt += 1
        proc = start(store, fault_proxy.endpoint, attempt)
        seen: list[str] = []
        if kind == "kill-mid-upload":  # the upload of the next checkpoint is made slow, then the kill lands
            target = (step // 4 + 1) * 4
            fault_proxy.set(Faults(p_slow=1.0, slow_s=1.5, methods={"PUT"}))
            found = wait_for_line(proc, f"] step {target + 1}/", seen)
        else:
            target = step + rng.randint(1, 7)
            found = wait_for_line(proc, f"] step {target}/", seen)
        assert found, "".join(seen)
        proc.send_signal(signal.SIGTERM if kind == "notice" else signal.SIGKILL)
        assert proc.stdout is not None
        seen += list(proc.stdout)
        code = proc.wait(timeout=120)
        fault_proxy.set(flaky)
        log = "".join(seen)
        if kind == "notice":
            assert code == exitcodes.PREEMPTED, log
        else:
            assert code == -signal.SIGKILL, log
        if kind == "kill-mid-upload":
            assert f"checkpoint step-{target:08d} saved" not in log  # it really died mid-upload
        if attempt > 1:
            assert "tokenised data from the run store's cache" in log
        newest = store.newest_valid_checkpoint()
        step = newest[0].step if newest else 0
        done_kinds.append(kind)
    final = run(store, fault_proxy.endpoint, attempt + 1)
    assert final.returncode == 0, final.stdout
    assert sorted(done_kinds) == sorted(KINDS * ROUNDS)
    assert sum(fault_proxy.injected.values()) > 0
    assert_bitwise_equal(s3_final_weights(store), expected)

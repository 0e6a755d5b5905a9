"""CPU offload (`train.offload: params`, FSDP2's CPUOffloadPolicy) on 2 gloo ranks: the code path runs on
a CPU (where it moves nothing), resume is bitwise exact, and a preempted offloaded run resumes without
offload (train.offload is free in the spec fingerprint: the math is the same)."""

from __future__ import annotations

from pathlib import Path

from fsdp_helpers import SIGTERM, finish, fsdp_job, interrupt, new_run
from helpers import assert_bitwise_equal, final_weights, write_data

from trainer.runstore.store import RunStore


def _set_offload(run_uri: str, value: str) -> None:
    """What `ftorch resume --set train.offload=none` amounts to for the trainer: the run's spec changes."""
    store = RunStore(run_uri)
    spec = store.read_spec()
    spec["job"]["train"]["offload"] = value
    store.write_spec(spec)


def test_offloaded_run_resumes_bitwise_with_and_without_offload(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 48)
    job = fsdp_job(
        tiny_model, data, tmp_path / "runs",
        train={"max_steps": 9, "gradient_checkpointing": True, "offload": "params"}, checkpoint={"every": 3},
    )  # fmt: skip

    reference = new_run(job, "reference")
    out = finish(reference, 1, nproc=2)
    assert "CPU offload (params)" in out, out
    expected = final_weights(reference)

    plain = new_run({**job, "train": {**job["train"], "offload": "none"}}, "plain")
    assert "CPU offload" not in finish(plain, 1, nproc=2)
    assert_bitwise_equal(final_weights(plain), expected)  # on a CPU offload changes no arithmetic

    run_uri = new_run(job, "interrupted")
    code, out, _ = interrupt(run_uri, 1, 2, at_step=4, sig=SIGTERM)
    assert "CPU offload (params)" in out and "exiting with code 75" in out, out
    store = RunStore(run_uri)
    newest = store.complete_checkpoints()[-1]
    assert newest.meta["kind"] == "dcp" and newest.step >= 4
    out = finish(run_uri, 2, nproc=2)  # resumed with offload
    assert f"resumed from checkpoints/step-{newest.step:08d}" in out, out
    assert_bitwise_equal(final_weights(run_uri), expected)

    again = new_run(job, "moved")
    code, out, _ = interrupt(again, 1, 2, at_step=4, sig=SIGTERM)
    assert "exiting with code 75" in out, out
    _set_offload(again, "none")  # the next layout has no offload: the sharded checkpoint loads as well
    out = finish(again, 2, nproc=2)
    assert "resumed from" in out and "CPU offload" not in out, out
    assert_bitwise_equal(final_weights(again), expected)

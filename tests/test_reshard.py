"""Resharding on resume: a run checkpointed by 2 ranks resumes with 1 and with 4, and a single-process run
resumes with 2. The state comes back (training continues to the weights of an uninterrupted run, up to
float summation order: not bitwise, see docs/distributed.md), and the run store can be s3://."""

from __future__ import annotations

from pathlib import Path

import pytest
from fsdp_helpers import (
    SIGTERM,
    finish,
    fsdp_job,
    interrupt,
    max_abs_diff,
    new_run,
    output_weights,
    set_nproc,
)
from helpers import write_data

from trainer.store import RunStore

#: full fine-tuning of a Llama has no dropout: the only randomness is the data order (stateless)
SECTIONS = {"method": "full", "train": {"max_steps": 10}, "checkpoint": {"every": 2}}
#: an uninterrupted 2-rank run and a resharded one differ only in summation order
CLOSE = 2e-5


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[dict, dict]:
    tmp = tmp_path_factory.mktemp("reshard")
    data = write_data(tmp / "d.jsonl", "instruction", 48)
    job = fsdp_job(tiny_model, data, tmp / "runs", **SECTIONS)
    reference = new_run(job, "reference")
    finish(reference, 1, nproc=2)
    return job, output_weights(reference)


def _stop_at(run_uri: str, nproc: int, step: int) -> int:
    code, out, _ = interrupt(run_uri, 1, nproc, at_step=step, sig=SIGTERM)
    assert "is safe; exiting with code 75" in out, out
    return RunStore(run_uri).complete_checkpoints()[-1].step


def test_two_ranks_to_one(setup: tuple[dict, dict]) -> None:
    job, expected = setup
    run_uri = new_run(job, "two-to-one")
    _stop_at(run_uri, 2, 4)
    set_nproc(run_uri, 1)
    out = finish(run_uri, 2, nproc=1)  # plain `python -m trainer`: a world of one, still sharded
    assert "resharding: saved by 2 ranks, resumed by 1" in out, out
    assert "1 ranks, sharded" in out, out
    diff = max_abs_diff(output_weights(run_uri), expected)
    assert diff < CLOSE, diff


def test_one_process_to_two_ranks(setup: tuple[dict, dict]) -> None:
    job, expected = setup
    single = {**job, "local": {**job["local"], "nproc": 1}}
    run_uri = new_run(single, "one-to-two")
    step = _stop_at(run_uri, 1, 4)
    info = RunStore(run_uri).complete_checkpoints()[-1]
    assert info.meta.get("kind") != "dcp" and info.step == step  # the single-process format
    set_nproc(run_uri, 2)
    out = finish(run_uri, 2, nproc=2)
    assert "resharding: a single-process checkpoint resumed by 2 ranks" in out, out
    diff = max_abs_diff(output_weights(run_uri), expected)
    assert diff < CLOSE, diff


def test_two_ranks_to_four_on_s3(setup: tuple[dict, dict], s3, tmp_path: Path) -> None:  # noqa: ANN001
    """Sharded checkpoints through fsspec on a real S3 server (SeaweedFS), resumed by 4 ranks."""
    job, expected = setup
    on_s3 = {**job, "checkpoint": {**job["checkpoint"], "uri": f"{s3.uri}/runs"}}
    run_uri = new_run(on_s3, "two-to-four")
    assert run_uri.startswith("s3://")
    _stop_at(run_uri, 2, 4)
    info = RunStore(run_uri).complete_checkpoints()[-1]
    assert info.meta["kind"] == "dcp" and set(info.meta["dcp_files"]) >= {".metadata", "__1_0.distcp"}
    set_nproc(run_uri, 4)
    out = finish(run_uri, 2, nproc=4)
    assert "resharding: saved by 2 ranks, resumed by 4" in out, out
    diff = max_abs_diff(output_weights(run_uri), expected)
    assert diff < CLOSE, diff

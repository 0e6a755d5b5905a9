"""Resharding on resume: a run checkpointed by 2 ranks resumes with 1 and with 4, and a single-process run
resumes with 2. The state comes back (training continues to the weights of an uninterrupted run, up to
float summation order: not bitwise, see docs/distributed.md), and the run store can be s3://.

The layout changes with the rank count (trainer/layout.py): micro_batch_size 2 per GPU, effective batch
2 x 2 = 4 examples per step runs as 2 x 2 on one rank, 2 x 1 on two and 1 x 1 on four; the effective
batch and the data position are kept, so the resumed run ends at the uninterrupted run's weights. (Every
example is cut to the same length, so the loss normalisation per micro-batch is the same on every
layout.)"""

from __future__ import annotations

import json
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
from helpers import WORDS

from trainer.runstore.store import RunStore

#: full fine-tuning of a Llama has no dropout: the only randomness is the data order (stateless)
SECTIONS = {
    "method": "full",
    "train": {"max_steps": 10, "micro_batch_size": 2, "grad_accum": 2},
    "checkpoint": {"every": 2},
}
LAYOUT = {
    1: "layout: 1 rank, 2/rank x 2 accum = 4/step, none",
    2: "layout: 2 ranks, 2/rank x 1 accum = 4/step, fsdp",
    4: "layout: 4 ranks, 1/rank x 1 accum = 4/step, fsdp",
}


def write_even_text(path: Path, n: int) -> Path:
    """Text examples all longer than max_seq_len: every one is cut to the same number of tokens."""
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(n):
            words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(80)]
            handle.write(json.dumps({"text": " ".join(words)}) + "\n")
    return path


#: an uninterrupted 2-rank run and a resharded one differ only in summation order
CLOSE = 2e-5


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[dict, dict]:
    tmp = tmp_path_factory.mktemp("reshard")
    data = write_even_text(tmp / "d.jsonl", 48)
    job = fsdp_job(
        tiny_model,
        data,
        tmp / "runs",
        **SECTIONS,
    )
    job["data"] = {"path": str(data), "format": "text", "max_seq_len": 32}
    reference = new_run(job, "reference")
    finish(reference, 1, nproc=2)
    return job, output_weights(reference)


def _stop_at(run_uri: str, nproc: int, step: int) -> int:
    code, out, _ = interrupt(run_uri, 1, nproc, at_step=step, sig=SIGTERM)
    assert "is safe; exiting with code 75" in out, out
    assert LAYOUT[nproc] in out, out
    return RunStore(run_uri).complete_checkpoints()[-1].step


def test_two_ranks_to_one(setup: tuple[dict, dict]) -> None:
    job, expected = setup
    run_uri = new_run(job, "two-to-one")
    _stop_at(run_uri, 2, 4)
    set_nproc(run_uri, 1)
    out = finish(run_uri, 2, nproc=1)  # plain `python -m trainer`: a world of one, still sharded
    assert "resharding: saved by 2 ranks, resumed by 1" in out, out
    assert "sharded over 1 ranks" in out, out
    assert LAYOUT[1] in out, out  # the same 4 examples per step, as 2 x 2 on one rank
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
    assert LAYOUT[2] in out, out
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
    assert LAYOUT[4] in out, out
    diff = max_abs_diff(output_weights(run_uri), expected)
    assert diff < CLOSE, diff

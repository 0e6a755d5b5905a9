"""Issue 20, end to end on a CPU: a tiny QLoRA job (bitsandbytes' CPU NF4 base, LoRA adapters, AdamW)
on 2 gloo ranks under FSDP2, preempted twice -- once with a notice (SIGTERM to torchrun's agent, as the
supervisor sends it) and once with none (SIGKILL: the ranks must go with the agent) -- ends bitwise equal
to its uninterrupted run; the same with CPU offload (`train.offload: params`, FSDP2's CPUOffloadPolicy:
on a CPU it moves nothing, but its code path runs and its sharded checkpoints resume)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fsdp_helpers import SIGKILL, SIGTERM, finish, fsdp_job, interrupt, new_run, wait_gone
from helpers import assert_bitwise_equal, final_weights, write_data

from trainer.runstore.store import RunStore

pytest.importorskip("bitsandbytes")

#: paged 8-bit AdamW is one-GPU only (trainer/layout.py): under FSDP QLoRA steps plain AdamW
QLORA = {
    "method": "qlora",
    "lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": "all-linear"},
    "checkpoint": {"every": 2},
}


def _job(tmp_path: Path, tiny_model: Path, offload: str) -> dict:
    data = write_data(tmp_path / "d.jsonl", "instruction", 40)
    train = {"precision": "bf16-mixed", "optimizer": "adamw", "max_steps": 8, "offload": offload}
    return fsdp_job(tiny_model, data, tmp_path / "runs", train=train, **QLORA)


def _preempt(run_uri: str, attempt: int, at_step: int, sig: int) -> str:
    """One preemption of a 2-rank attempt at `at_step`: with a notice it saves and exits 75, without one
    the agent dies and takes its ranks with it. The run is left preempted or crashed, never finished."""
    code, out, workers = interrupt(run_uri, attempt, 2, at_step=at_step, sig=sig)
    if sig == SIGKILL:
        assert code == -9, out
        assert len(workers) == 2 and wait_gone(workers) == [], "a rank outlived the killed torchrun agent"
    else:
        assert "preemption notice" in out and "is safe; exiting with code 75" in out, out
        assert RunStore(run_uri).read_progress()["state"] == "preempted"
    return out


@pytest.mark.parametrize(
    ("offload", "signals"),
    [("none", (SIGTERM, SIGKILL)), ("params", (SIGKILL, SIGTERM))],
    ids=["no-offload", "offload"],
)
def test_qlora_on_two_ranks_preempted_twice_ends_bitwise_equal(
    tmp_path: Path, tiny_model: Path, offload: str, signals: tuple[int, int]
) -> None:
    job = _job(tmp_path, tiny_model, offload)
    reference = new_run(job, "reference")
    out = finish(reference, 1, nproc=2)
    assert "sharded over 2 ranks" in out and ("CPU offload (params)" in out) == (offload == "params"), out
    expected = final_weights(reference)

    run_uri = new_run(job, "preempted")
    first, second = signals
    _preempt(run_uri, 1, at_step=3, sig=first)
    out = _preempt(run_uri, 2, at_step=6, sig=second)
    if first == SIGTERM:  # the notice saved a checkpoint (step 3 or the step all ranks agreed on after it)
        assert "resumed from checkpoints/step-0000000" in out, out  # the second attempt did not start over
    store = RunStore(run_uri)
    newest = store.complete_checkpoints()[-1]
    assert newest.meta["kind"] == "dcp" and newest.meta["world_size"] == 2 and newest.step >= 2
    out = finish(run_uri, 3, nproc=2)
    assert f"resumed from checkpoints/step-{newest.step:08d}" in out, out
    assert ("CPU offload (params)" in out) == (offload == "params"), out
    assert store.read_progress()["state"] == "finished"
    assert_bitwise_equal(final_weights(run_uri), expected)

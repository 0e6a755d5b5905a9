"""Exact resume: runs stopped by SIGKILL at random moments (also mid-checkpoint) and by SIGTERM, then resumed,
end with final weights bitwise equal to an uninterrupted run of the same job."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import (
    REPO,
    assert_bitwise_equal,
    final_weights,
    job_dict,
    prepare_run,
    run_trainer,
    trainer_cmd,
    write_data,
)

from trainer import exitcodes
from trainer.runstore.store import RunStore

SEED = int(os.environ.get("FTORCH_TEST_SEED", "20261129"))


def interrupt_at(
    run_uri: str, attempt: int, at_step: int, sig: int, delay_s: float, env: dict[str, str] | None = None
) -> int:
    """Start the trainer, wait until it logs `at_step`, wait `delay_s` more, send `sig`; its exit code."""
    proc = subprocess.Popen(
        trainer_cmd(run_uri, attempt),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    sent = False
    for line in proc.stdout:
        if not sent and f"] step {at_step}/" in line:
            if delay_s:
                import time

                time.sleep(delay_s)
            proc.send_signal(sig)
            sent = True
    code = proc.wait(timeout=120)
    return code


def reference_weights(tmp_path: Path, job: dict) -> dict:
    run_uri = prepare_run(job, "reference")
    done = run_trainer(run_uri)
    assert done.returncode == 0, done.stdout + done.stderr
    return final_weights(run_uri)


def finish(run_uri: str, attempt: int) -> subprocess.CompletedProcess[str]:
    done = run_trainer(run_uri, attempt)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.parametrize(
    ("fmt", "sections"),
    [
        ("instruction", {}),  # LoRA with dropout: the torch RNG must come back exactly
        ("chat", {"method": "full", "train": {"grad_accum": 2, "max_steps": 24}}),
    ],
    ids=["lora-instruction", "full-chat-accum2"],
)
def test_random_sigkills_resume_bitwise(tmp_path: Path, tiny_model: Path, fmt: str, sections: dict) -> None:
    data = write_data(tmp_path / "d.jsonl", fmt, 64)
    job = job_dict(tiny_model, data, tmp_path / "runs", data={"format": fmt}, **sections)
    expected = reference_weights(tmp_path, job)
    total = job["train"]["max_steps"]

    rng = random.Random(f"{SEED}-{fmt}")
    run_uri = prepare_run(job, "killed")
    kills = sorted(rng.sample(range(2, total - 8), 4))
    for attempt, step in enumerate(kills, start=1):
        # a random delay lands the kill anywhere: mid-step, mid-checkpoint, mid-progress-write
        code = interrupt_at(run_uri, attempt, step, signal.SIGKILL, rng.uniform(0.0, 0.03))
        assert code == -signal.SIGKILL
    finish(run_uri, len(kills) + 1)
    assert_bitwise_equal(final_weights(run_uri), expected)


def test_kills_while_writing_checkpoints_resume_bitwise(tmp_path: Path, tiny_model: Path) -> None:
    """Killed after some files of a checkpoint, and just before its manifest: that checkpoint is never used."""
    data = write_data(tmp_path / "d.jsonl", "text", 64)
    job = job_dict(tiny_model, data, tmp_path / "runs", data={"format": "text"})
    expected = reference_weights(tmp_path, job)
    run_uri = prepare_run(job, "killed")
    store = RunStore(run_uri)

    # synchronous saves: a fault point names a step, and an async writer may skip a step while busy
    sync = {"FTORCH_ASYNC_CHECKPOINT": "0"}
    first = run_trainer(run_uri, 1, env={**sync, "FTORCH_FAULTS": "checkpoint-partial@15"})
    assert first.returncode == -signal.SIGKILL
    assert "checkpoints/step-00000015" not in {c.path for c in store.complete_checkpoints()}
    assert "step-00000015" in store.checkpoint_names()  # the partial folder is there, but not trusted

    second = run_trainer(run_uri, 2, env={**sync, "FTORCH_FAULTS": "before-manifest@25"})
    assert second.returncode == -signal.SIGKILL
    assert "resumed from checkpoints/step-00000010" in second.stdout
    assert "not using checkpoint step-00000015: incomplete" in second.stdout

    third = finish(run_uri, 3)
    assert "resumed from checkpoints/step-00000020" in third.stdout
    assert_bitwise_equal(final_weights(run_uri), expected)
    # leftovers of the killed writes are cleaned up once newer checkpoints exist
    assert all(
        name in {c.path.rsplit("/", 1)[-1] for c in store.complete_checkpoints()}
        for name in store.checkpoint_names()
    )


def test_sigterm_checkpoints_exits_preempted_and_resumes_bitwise(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = job_dict(
        tiny_model,
        data,
        tmp_path / "runs",
        train={"grad_accum": 2, "max_steps": 20},
        checkpoint={"every": 100},
    )  # only the notice makes checkpoints before the end
    expected = reference_weights(tmp_path, job)
    # the interrupted run also measures a separate held-out set every 3 steps: that changes nothing
    held = write_data(tmp_path / "held.jsonl", "instruction", 8, seed=1)
    evaluated = {
        **job,
        "data": {**job["data"], "eval_path": str(held)},
        "train": {**job["train"], "eval_every": 3},
    }
    run_uri = prepare_run(evaluated, "noticed")
    store = RunStore(run_uri)
    rng = random.Random(SEED)
    first_stop, second_stop = sorted(rng.sample(range(2, 19), 2))

    assert interrupt_at(run_uri, 1, first_stop, signal.SIGTERM, 0.0) == exitcodes.PREEMPTED
    saved = store.complete_checkpoints()[-1].step
    assert saved >= first_stop  # the step in flight was finished and saved, nothing lost
    assert store.read_progress()["state"] == "preempted"

    assert interrupt_at(run_uri, 2, max(second_stop, saved + 1), signal.SIGTERM, 0.0) == exitcodes.PREEMPTED
    finish(run_uri, 3)
    assert_bitwise_equal(final_weights(run_uri), expected)
    # the eval curve: in the metrics (`ftorch metrics`) and the training summary, the final point = eval_after
    from orchestrator.cli.outputs import metric_rows

    curve = [
        (r["step"], r["eval_loss"]) for r in metric_rows(store.read_metrics()) if r["eval_loss"] is not None
    ]
    assert [step for step, _ in curve] == [3, 6, 9, 12, 15, 18, 20]
    summary = json.loads((Path(run_uri) / "output" / "training_summary.json").read_text())
    assert [tuple(point) for point in summary["eval_curve"]] == curve
    assert summary["eval_after"]["loss"] == curve[-1][1] and summary["data"]["held_out_examples"] == 8


@pytest.mark.parametrize("optimizer", ["adamw", "paged_adamw_8bit"])
def test_optimizer_in_backward_resumes_bitwise(tmp_path: Path, tiny_model: Path, optimizer: str) -> None:
    """train.optimizer_in_backward (trainer/optim/in_backward.py): the per-parameter optimizer states and
    the LR schedule go through the checkpoint; a run killed (SIGKILL) and noticed (SIGTERM) ends bitwise
    equal to its uninterrupted run (bitsandbytes' paged 8-bit AdamW included, on the CPU)."""
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    train = {"optimizer": optimizer, "optimizer_in_backward": True, "max_grad_norm": None, "max_steps": 16}
    job = job_dict(tiny_model, data, tmp_path / "runs", method="full", train=train, checkpoint={"every": 4})
    expected = reference_weights(tmp_path, job)
    run_uri = prepare_run(job, "killed")
    rng = random.Random(f"{SEED}-{optimizer}")
    kill, notice = rng.randint(3, 7), rng.randint(9, 13)
    assert interrupt_at(run_uri, 1, kill, signal.SIGKILL, rng.uniform(0.0, 0.03)) == -signal.SIGKILL
    assert interrupt_at(run_uri, 2, notice, signal.SIGTERM, 0.0) == exitcodes.PREEMPTED
    finish(run_uri, 3)
    assert_bitwise_equal(final_weights(run_uri), expected)


@pytest.mark.parametrize("loss", ["plain", "chunked"])
def test_each_loss_path_resumes_bitwise(tmp_path: Path, tiny_model: Path, loss: str) -> None:
    """train.loss (trainer/train_step/loss.py): the head in one piece, or chunk by chunk recomputed in backward; a
    run killed (SIGKILL) and noticed (SIGTERM) on either path ends bitwise equal to its uninterrupted run.
    (The default, auto, takes plain here: the other tests of this file run it.)"""
    data = write_data(tmp_path / "d.jsonl", "instruction", 48)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"loss": loss, "max_steps": 12}, checkpoint={"every": 3}
    )
    expected = reference_weights(tmp_path, job)
    run_uri = prepare_run(job, "killed")
    rng = random.Random(f"{SEED}-{loss}")
    kill, notice = rng.randint(2, 5), rng.randint(7, 10)
    assert interrupt_at(run_uri, 1, kill, signal.SIGKILL, rng.uniform(0.0, 0.03)) == -signal.SIGKILL
    assert interrupt_at(run_uri, 2, notice, signal.SIGTERM, 0.0) == exitcodes.PREEMPTED
    finish(run_uri, 3)
    assert_bitwise_equal(final_weights(run_uri), expected)

"""The checkpoint policy over the one-process writer: when it saves, what a failed save means for the
attempt (its exit code), and that measured upload times reach `checkpoint.every: auto`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import job_dict

from trainer import exitcodes
from trainer.async_checkpoint import AsyncCheckpointer
from trainer.checkpoint import TrainerState
from trainer.checkpointer import Checkpointer
from trainer.config import JobSpec
from trainer.distributed import Parallel
from trainer.store import RunStore


def _state() -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def _checkpointer(tmp_path: Path, every: object, asynchronous: bool = False) -> Checkpointer:
    spec = JobSpec.model_validate(
        job_dict(tmp_path / "m", tmp_path / "d.jsonl", tmp_path, checkpoint={"every": every})
    )
    store = RunStore(str(tmp_path / "run"))
    store.claim_epoch({"attempt": 1})
    writer = AsyncCheckpointer(store, keep=2, log=lambda m: None, asynchronous=asynchronous)
    return Checkpointer(Parallel(), store, spec, writer=writer)


def test_every_n_steps_saves_on_the_multiples_and_finish_makes_them_durable(tmp_path: Path) -> None:
    ckpt = _checkpointer(tmp_path, 3)
    model, opt, sched = _state()
    saved = []
    for step in range(1, 8):
        if ckpt.due(step, 0.0):
            ckpt.save(model, opt, sched, TrainerState(step=step, micro_batches=step, tokens_seen=0))
            saved.append(step)
    ckpt.wait()
    assert saved == [3, 6] and ckpt.last_step == 6 and ckpt.durable_step == 6
    assert [c.step for c in ckpt.store.complete_checkpoints()] == [3, 6]


def test_a_fenced_attempt_leaves_with_exit_76_and_writes_nothing(tmp_path: Path) -> None:
    ckpt = _checkpointer(tmp_path, 1)
    RunStore(str(tmp_path / "run")).claim_epoch({"attempt": 2})  # a newer attempt took the run over
    model, opt, sched = _state()
    with pytest.raises(SystemExit) as stopped:
        ckpt.save(model, opt, sched, TrainerState(step=1, micro_batches=1, tokens_seen=0), wait=True)
    assert stopped.value.code == exitcodes.FENCED
    assert ckpt.store.complete_checkpoints() == []


def test_a_save_that_never_became_durable_ends_the_attempt_with_exit_77(tmp_path: Path) -> None:
    ckpt = _checkpointer(tmp_path, 1)
    model, opt, sched = _state()
    ckpt.store.commit_checkpoint = _fail  # type: ignore[method-assign] - the store refuses every save
    ckpt.save(model, opt, sched, TrainerState(step=1, micro_batches=1, tokens_seen=0), wait=True)
    assert ckpt.last_step == 1 and ckpt.durable_step is None
    with pytest.raises(SystemExit) as stopped:
        ckpt.wait()
    assert stopped.value.code == exitcodes.STORE_UNAVAILABLE


def test_measured_upload_times_reach_the_auto_interval(tmp_path: Path) -> None:
    ckpt = _checkpointer(tmp_path, "auto", asynchronous=True)
    model, opt, sched = _state()
    ckpt.save(model, opt, sched, TrainerState(step=1, micro_batches=1, tokens_seen=0))
    ckpt.writer.wait()
    ckpt.poll()  # the next step boundary sees the finished upload
    assert ckpt.writer.last is not None and ckpt.writer.last.upload_s > 0
    assert ckpt.auto.upload_s == ckpt.writer.last.upload_s
    assert ckpt.auto.cost_s is not None  # the blocking time of the save


def _fail(*_args: object, **_kwargs: object) -> None:
    raise OSError("503 ServiceUnavailable")


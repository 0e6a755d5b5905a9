"""Issue 28: fp16's loss scaler skipping a step for an overflowed gradient is normal: the health guard
(trainer/health/guard.py) does not count it as a non-finite step, rolls nothing back and ends nothing.
Without a scaler the same overflow, and a non-finite loss with or without one, count."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import torch
from helpers import run_trainer, write_data

from trainer.config import HealthSpec
from trainer.distributed import Parallel
from trainer.health.guard import HealthGuard
from trainer.health.rules import ROLLBACK, SKIP, STEP, UNHEALTHY
from trainer.runstore.store import RunStore
from trainer.train_step.step import update


def _attempt(scaler: torch.amp.GradScaler | None) -> Any:
    """What the guard reads of the loop's attempt: a tiny model and optimizer, no checkpoint to go to."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    checkpoints = SimpleNamespace(
        before_save=[], wait=lambda: None, load_newest_healthy=MagicMock(return_value=None),
        newest_healthy_step=lambda: None, writer=None,
    )  # fmt: skip
    return SimpleNamespace(
        spec=SimpleNamespace(train=SimpleNamespace(health=HealthSpec())),
        state=SimpleNamespace(health=None, step=0, micro_batches=0, tokens_seen=0),
        opt=SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler),
        par=Parallel(),
        checkpoints=checkpoints,
        store=MagicMock(),
        rec=MagicMock(),
    )


def _step(a: Any, guard: HealthGuard, overflow: bool = False, loss_factor: float = 1.0) -> float | None:
    """One optimizer step as the loop takes it (trainer/loop.py `_train_step`): backward (scaled with a
    scaler), an inf gradient when `overflow` (as `nan-grad-rank0@K` makes it), then `update` with the
    guard's `go`, then `after`."""
    model, scaler = a.opt.model, a.opt.scaler
    loss = model(torch.ones(3, 4)).pow(2).mean() * loss_factor
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if overflow:
        model.weight.grad.view(-1)[0] = float("inf")
    grad_norm = update(model, a.opt.optimizer, 1.0, scaler, guard.go_for(a.state.step + 1, loss.item()))
    a.opt.optimizer.zero_grad(set_to_none=True)
    a.state.step += 1
    guard.after()
    return grad_norm


def _weights(a: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in a.opt.model.parameters()]


def test_fp16_scaler_skips_are_not_counted_rolled_back_or_ended() -> None:
    a = _attempt(torch.amp.GradScaler("cpu", init_scale=2.0**16))
    guard = HealthGuard(a)
    assert guard.scaled
    _step(a, guard)  # a healthy step first
    limit = HealthSpec().max_skips_in_a_row
    for _ in range(limit + 3):  # more overflows in a row than the non-finite steps a rollback waits for
        before, scale = _weights(a), a.opt.scaler.get_scale()
        grad_norm = _step(a, guard, overflow=True)
        assert grad_norm is not None and math.isinf(grad_norm)
        assert all(torch.equal(x, y) for x, y in zip(before, _weights(a), strict=True))  # the scaler skipped
        assert a.opt.scaler.get_scale() == scale / 2  # and backed off, as fp16 training does
        assert guard.verdict.action == STEP, guard.verdict
    assert guard.rules.state.skipped == 0 and guard.rules.state.in_a_row == 0, guard.rules.state
    assert guard.rules.state.healthy and guard.rules.state.rollbacks == []
    a.checkpoints.load_newest_healthy.assert_not_called()  # nothing rolled back
    assert guard.poll(a.state.step) is None  # nothing ended
    before = _weights(a)
    _step(a, guard)  # and training goes on: a finite gradient steps
    assert not all(torch.equal(x, y) for x, y in zip(before, _weights(a), strict=True))


def test_without_the_scaler_the_same_overflow_counts_and_ends_in_a_rollback() -> None:
    a = _attempt(None)
    guard = HealthGuard(a)
    assert not guard.scaled
    limit = HealthSpec().max_skips_in_a_row
    for n in range(1, limit + 1):
        before = _weights(a)
        _step(a, guard, overflow=True)
        assert guard.verdict.action == SKIP and "gradient norm inf" in guard.verdict.reason
        assert guard.rules.state.skipped == n and guard.rules.state.in_a_row == n
        assert all(torch.equal(x, y) for x, y in zip(before, _weights(a), strict=True))
    _step(a, guard, overflow=True)  # one more than allowed: a rollback, here with no checkpoint to go to
    a.checkpoints.load_newest_healthy.assert_called_once()
    assert guard.verdict.action == UNHEALTHY and "no healthy checkpoint" in guard.verdict.reason
    stop = guard.poll(a.state.step)
    assert stop is not None and stop.code == 86


def test_a_non_finite_loss_counts_with_or_without_the_scaler() -> None:
    for scaler in (None, torch.amp.GradScaler("cpu")):
        a = _attempt(scaler)
        guard = HealthGuard(a)
        _step(a, guard, loss_factor=float("nan"))
        assert guard.verdict.action == SKIP and "loss NaN" in guard.verdict.reason, (scaler, guard.verdict)
        assert guard.rules.state.skipped == 1 and not guard.rules.state.healthy
        for _ in range(HealthSpec().max_skips_in_a_row):
            _step(a, guard, loss_factor=float("nan"))
        assert guard.verdict.action in (ROLLBACK, UNHEALTHY)
        a.checkpoints.load_newest_healthy.assert_called_once()


def test_an_fp16_run_whose_scaler_skips_overflowed_steps_finishes_healthy(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The real trainer, fp16-mixed on the CPU: 7 overflowed gradients in a row (more than
    max_skips_in_a_row) are the scaler's skips; no health skip, no rollback, every checkpoint healthy."""
    import json

    from helpers import job_dict, prepare_run

    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"precision": "fp16-mixed", "max_steps": 14})
    run_uri = prepare_run(job, "fp16")
    faults = ",".join(f"nan-grad-rank0@{k}" for k in range(4, 11))  # an inf gradient at steps 4-10
    done = run_trainer(run_uri, env={"FTORCH_FAULTS": faults})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "health:" not in out and "rolled back" not in out, out[-3000:]
    store = RunStore(run_uri)
    record = next(iter(store.epoch_records().values()))
    assert record["ended"] == "finished", record
    assert record["health"]["skipped"] == 0 and record["health"]["rollbacks"] == [], record
    checkpoints = store.complete_checkpoints()
    assert checkpoints and all(c.meta.get("healthy") is not False for c in checkpoints)
    saved = json.loads(store.read_checkpoint(checkpoints[-1])["trainer_state.json"])["extra"]["grad_scaler"]
    assert saved["scale"] <= 2.0**16 / 2**7, saved  # the scaler did skip (and back off) those 7 steps

"""Asynchronous checkpoints: training blocks only for the copy, at most one upload in flight, and a notice
waits for the upload in flight before it writes the final checkpoint."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import torch
from helpers import write_data
from s3runs import job_for, prepare_s3_run, start, wait_for_line
from s3server import Faults

from trainer import exitcodes
from trainer.checkpoints.async_save import AsyncCheckpointer
from trainer.checkpoints.checkpoint import TrainerState, restore
from trainer.runstore.store import RunStore


def _training_state() -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    return model, opt, sched


def test_training_blocks_only_for_the_copy_and_one_upload_is_in_flight(s3, fault_proxy) -> None:
    fault_proxy.set(Faults(p_slow=1.0, slow_s=0.4, methods={"PUT"}))  # every upload request is slow
    store = RunStore(f"{s3.uri}/run", {"endpoint_url": fault_proxy.endpoint})
    model, opt, sched = _training_state()
    writer = AsyncCheckpointer(store, keep=3, log=lambda m: None, asynchronous=True)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    started = time.perf_counter()
    result = writer.save(model, opt, sched, TrainerState(step=1, micro_batches=1, tokens_seen=0))
    returned = time.perf_counter() - started
    assert result is not None and writer.busy()
    assert returned < 0.3, returned  # far less than one slow PUT
    with torch.no_grad():  # training goes on and changes the weights while the upload runs
        for p in model.parameters():
            p.add_(1.0)
    assert writer.save(model, opt, sched, TrainerState(step=2, micro_batches=2, tokens_seen=0)) is None
    writer.wait()
    assert writer.last is not None and writer.last.upload_s >= 0.4
    assert [c.step for c in store.complete_checkpoints()] == [1]
    fresh, fresh_opt, fresh_sched = _training_state()
    restore(store.newest_valid_checkpoint()[1], fresh, fresh_opt, fresh_sched)
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, expected[key])  # the state at the save, not after it


def test_a_notice_waits_for_the_upload_in_flight_then_writes_the_final_one(
    tiny_model: Path, tmp_path: Path, s3, fault_proxy
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    store = prepare_s3_run(job_for(tiny_model, data, f"{s3.uri}/runs"), "notice", s3.endpoint)
    proc = start(store, fault_proxy.endpoint, 1)
    seen: list[str] = []
    assert wait_for_line(proc, "] step 4/", seen), "".join(seen)
    # step 5's upload will take seconds (its files only: the records written with it stay quick)
    fault_proxy.set(Faults(p_slow=1.0, slow_s=1.0, methods={"PUT"}, paths=("/checkpoints/",)))
    assert wait_for_line(proc, "] step 6/", seen), "".join(seen)
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None
    seen += list(proc.stdout)
    log = "".join(seen)
    assert proc.wait(timeout=120) == exitcodes.PREEMPTED, log
    notice = log.index("preemption notice")
    assert log.index("checkpoint 5 saved") > notice  # it was still in flight at the notice
    final = [line for line in seen if "checkpoint " in line and " saved (" in line]
    assert "checkpoint 5 saved" in final[-2]
    assert any(f"checkpoint {n} saved" in final[-1] for n in (6, 7))  # then the final one, at the notice
    assert [c.step for c in store.complete_checkpoints()][-2:] in ([5, 6], [5, 7])

"""The checkpoint policy over the one-process writer: when it saves, what a failed save means for the
attempt (its exit code), and that measured upload times reach `checkpoint.every: auto`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import job_dict

from trainer import exitcodes
from trainer.checkpoints.async_save import AsyncCheckpointer
from trainer.checkpoints.checkpoint import TrainerState
from trainer.checkpoints.checkpointer import Checkpointer
from trainer.config import JobSpec
from trainer.distributed import Parallel
from trainer.runstore.store import RunStore


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


_COUNTING_TRAINER = """
import json, sys
from trainer.runstore import storage

listed, manifests = [], []
_listdir, _read = storage.Storage.listdir, storage.Storage.read_json_or_none


def listdir(self, rel):
    listed.append(rel)
    return _listdir(self, rel)


def read_json_or_none(self, rel):
    if rel.endswith("MANIFEST.json"):
        manifests.append(rel)
    return _read(self, rel)


storage.Storage.listdir, storage.Storage.read_json_or_none = listdir, read_json_or_none
from trainer.__main__ import main

code = main(sys.argv[2:])
with open(sys.argv[1], "w") as handle:
    json.dump({"code": code, "listed": listed, "manifests": manifests}, handle)
"""


def test_a_start_lists_the_run_store_checkpoints_once(tmp_path: Path, tiny_model: Path) -> None:
    """Each listing is a request on s3://: a resuming trainer lists checkpoints/ once, reads each
    manifest once, and still resumes, removes an older attempt's partial save and prunes."""
    import json
    import subprocess
    import sys

    from helpers import REPO, prepare_run, run_trainer, write_data

    data = write_data(tmp_path / "d.jsonl", "instruction", 24)
    job = job_dict(
        tiny_model, data, tmp_path / "ckpt", train={"max_steps": 6}, checkpoint={"every": 2, "keep": 2}
    )
    run_uri = prepare_run(job)
    first = run_trainer(run_uri, 1)
    assert first.returncode == 0, first.stdout + first.stderr
    partial = Path(run_uri) / "checkpoints/step-00000001/e00000001"  # attempt 1 killed mid-save
    partial.mkdir(parents=True)
    (partial / "weights.safetensors").write_bytes(b"half")
    driver = tmp_path / "counting_trainer.py"
    driver.write_text(_COUNTING_TRAINER)
    counts = tmp_path / "counts.json"
    second = subprocess.run(
        [sys.executable, str(driver), str(counts), run_uri, "--attempt", "2"],
        capture_output=True, text=True, timeout=240, cwd=REPO,
    )  # fmt: skip
    log = second.stdout + second.stderr
    found = json.loads(counts.read_text())
    assert found["code"] == 0, log
    assert "resumed from checkpoints/step-00000006 (step 6/6)" in log
    assert "removed incomplete checkpoint(s) left by earlier attempts: step-00000001" in log
    assert found["listed"].count("checkpoints") == 1, found["listed"]
    complete = [m for m in found["manifests"] if "step-00000001" not in m]  # the 2 kept (keep: 2)
    assert len(complete) == 2 and len(set(complete)) == 2, found["manifests"]  # each read once
    assert not (Path(run_uri) / "checkpoints/step-00000001").exists()

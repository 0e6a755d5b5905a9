"""`TrainerState`'s named parts (evaluations, attempt, loss scaler, health) through the one codec, old
checkpoints' `extra` read into them, and the start's checked meta handed to the `Checkpointer` reaching
every manifest its writer commits (no hidden channel on the store)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from helpers import job_dict

from trainer.checkpoints.checkpoint import STATE, Evals, TrainerState
from trainer.checkpoints.checkpointer import Checkpointer
from trainer.config import JobSpec
from trainer.distributed import Parallel
from trainer.health.rules import HealthState
from trainer.runstore.store import RunStore

#: a trainer_state.json as checkpoints wrote it before the parts were named (plus a key nothing names)
OLD = {
    "step": 7,
    "micro_batches": 28,
    "tokens_seen": 900,
    "extra": {
        "eval_before": {"loss": 2.5, "exact_match": 0.0, "examples": 4},
        "attempt": 3,
        "grad_scaler": {"scale": 1024.0, "growth_factor": 2.0, "_growth_tracker": 5},
        "health": {"skipped": 1, "in_a_row": 0, "rollbacks": [], "max_loss": 3.0, "healthy": False},
        "eval_cut_short": 6,
        "left_by_someone": {"x": 1},
    },
}


def test_an_old_checkpoints_extra_is_read_into_the_named_parts() -> None:
    state = TrainerState.from_json(OLD)
    assert (state.step, state.micro_batches, state.tokens_seen) == (7, 28, 900)
    assert state.evals == Evals(before={"loss": 2.5, "exact_match": 0.0, "examples": 4}, cut_short_at=6)
    assert state.attempt == 3
    assert state.scaler == {"scale": 1024.0, "growth_factor": 2.0, "_growth_tracker": 5}
    assert state.health == HealthState(skipped=1, max_loss=3.0, healthy=False)
    assert not hasattr(state, "extra")
    # written back in the same layout; the key that names no part is not kept
    assert TrainerState.from_json(json.loads(json.dumps(state.to_json()))) == state
    assert state.to_json()["extra"] == {k: v for k, v in OLD["extra"].items() if k != "left_by_someone"}


def test_a_fresh_state_writes_no_parts_and_reads_back_the_same() -> None:
    state = TrainerState(step=0, micro_batches=0, tokens_seen=0)
    assert state.to_json() == {"step": 0, "micro_batches": 0, "tokens_seen": 0, "extra": {}}
    assert TrainerState.from_json(state.to_json()) == state
    assert TrainerState.from_json({"step": 1, "micro_batches": 2, "tokens_seen": 3}).evals == Evals()


def test_the_start_meta_given_to_the_checkpointer_is_in_every_manifest(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(job_dict(tmp_path / "m", tmp_path / "d.jsonl", tmp_path))
    store = RunStore(str(tmp_path / "run"))
    store.claim_epoch({"attempt": 2})
    assert not hasattr(store, "checkpoint_meta")
    checked = {"fingerprint": {"model": "m"}, "versions": {"torch": torch.__version__}}
    ckpt = Checkpointer(Parallel(), store, spec, attempt=2, start_meta=checked)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    state = TrainerState(step=1, micro_batches=1, tokens_seen=0, attempt=2)
    state.health = HealthState(healthy=False)
    ckpt.save(model, opt, sched, state, wait=True)
    ckpt.wait()
    (info,) = RunStore(str(tmp_path / "run")).complete_checkpoints()
    assert info.meta == {**checked, "attempt": 2, "healthy": False}
    saved = json.loads(store.read_checkpoint(info)[STATE])
    assert saved["extra"] == {"attempt": 2, "health": HealthState(healthy=False).to_json()}

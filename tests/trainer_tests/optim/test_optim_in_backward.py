"""train.optimizer_in_backward: each parameter steps in its gradient hook (trainer/optim/in_backward.py).
The same weights as the step after backward, never more than one parameter's gradient held, the job's
refusals (grad_accum, fp16-mixed, explicit clipping, several ranks) and exact resume through checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_bitwise_equal, ftorch, job_dict, write_data

from trainer.config import JobSpec
from trainer.layout import layout_for
from trainer.optim.in_backward import InBackwardOptimizer


def _train(tiny_model: Path, spec: JobSpec, steps: int) -> tuple[dict[str, torch.Tensor], Any]:
    """`steps` steps of the trainer's own step functions on the tiny model, in-process."""
    from transformers import AutoModelForCausalLM

    from trainer.loop import lr_lambda_for, make_optimizer
    from trainer.train_step.step import accumulate, update

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    optimizer = make_optimizer(spec, model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_for(spec, steps))
    gen = torch.Generator().manual_seed(1)
    from trainer.data.dataset import Example

    for _ in range(steps):
        ids = torch.randint(3, 60, (4, 16), generator=gen).tolist()
        batch = [Example(input_ids=row, labels=row) for row in ids]
        accumulate(model, [batch], spec=spec, device=torch.device("cpu"), pad_id=0)
        update(model, optimizer, spec.train.max_grad_norm)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, optimizer


def _spec(tmp_path: Path, tiny_model: Path, **train: Any) -> JobSpec:
    data = write_data(tmp_path / "d.jsonl", "text", 8)
    job = job_dict(tiny_model, data, tmp_path / "runs", method="full", train={"max_grad_norm": None, **train})
    return JobSpec.model_validate(job)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "adamw_8bit"])
def test_same_weights_as_the_step_after_backward(tmp_path: Path, tiny_model: Path, optimizer: str) -> None:
    """Per-parameter optimizers, stepped in backward with the scheduled LR (warmup included), give the
    weights and optimizer state of one optimizer stepped after backward, bit for bit."""
    after, plain = _train(tiny_model, _spec(tmp_path, tiny_model, optimizer=optimizer), 5)
    during, wrapped = _train(
        tiny_model, _spec(tmp_path, tiny_model, optimizer=optimizer, optimizer_in_backward=True), 5
    )
    assert isinstance(wrapped, InBackwardOptimizer)
    assert_bitwise_equal(during, after)
    saved, expected = wrapped.state_dict(), plain.state_dict()
    assert saved["param_groups"][0]["lr"] == expected["param_groups"][0]["lr"]
    assert saved["state"].keys() == expected["state"].keys()
    _assert_same_tree(saved["state"], expected["state"])


def _assert_same_tree(got: Any, expected: Any) -> None:
    if isinstance(expected, torch.Tensor):
        assert torch.equal(got, expected)
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            _assert_same_tree(got[key], value)
    else:
        assert got == expected


def test_never_holds_more_than_one_parameters_gradient(tmp_path: Path, tiny_model: Path) -> None:
    """Whenever a gradient is complete, it is the only one alive; after backward none is (the step is done)."""
    from transformers import AutoModelForCausalLM

    from trainer.loop import make_optimizer

    spec = _spec(tmp_path, tiny_model, optimizer_in_backward=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    params = [p for p in model.parameters() if p.requires_grad]
    held: list[int] = []
    for p in params:  # registered first: runs before the optimizer's hook
        p.register_post_accumulate_grad_hook(lambda _p: held.append(sum(q.grad is not None for q in params)))
    before = [p.detach().clone() for p in params]
    optimizer = make_optimizer(spec, model)
    ids = torch.randint(3, 60, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    assert held and max(held) == 1
    assert len(held) == len(params)
    assert all(p.grad is None for p in params)
    assert all(not torch.equal(a, p.detach()) for a, p in zip(before, params, strict=True))
    assert len(optimizer.state) == len(params)


def test_checkpoint_format_loads_back_and_refuses_another_model(tmp_path: Path, tiny_model: Path) -> None:
    spec = _spec(tmp_path, tiny_model, optimizer_in_backward=True)
    _, trained = _train(tiny_model, spec, 2)
    _, fresh = _train(tiny_model, spec, 0)
    fresh.load_state_dict(trained.state_dict())
    a, b = fresh.state_dict(), trained.state_dict()
    assert a["state"].keys() == b["state"].keys()
    _assert_same_tree(a["state"], b["state"])
    short = {**b, "param_groups": [{**b["param_groups"][0], "params": [0, 1]}]}
    with pytest.raises(ValueError, match="this model trains"):
        fresh.load_state_dict(short)


@pytest.mark.parametrize(
    ("train", "field"),
    [
        ({"grad_accum": 2}, "train.grad_accum"),
        ({"precision": "fp16-mixed"}, "train.precision"),
        ({"max_grad_norm": 1.0}, "train.max_grad_norm"),
    ],
)
def test_refusals_name_the_field_exit_2(tmp_path: Path, tiny_model: Path, train: dict, field: str) -> None:
    import yaml

    data = write_data(tmp_path / "d.jsonl", "text", 8)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", method="full", train={"optimizer_in_backward": True, **train}
    )
    if "max_grad_norm" not in train:
        job["train"].pop("max_grad_norm", None)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    done = ftorch("validate", str(path))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and field in lines[0], done.stderr


def test_layout_refuses_several_ranks_and_accumulation(tmp_path: Path, tiny_model: Path) -> None:
    spec = _spec(tmp_path, tiny_model, optimizer_in_backward=True, micro_batch_size=4)
    assert layout_for(spec, 1).ok
    two = layout_for(spec, 2)
    assert not two.ok and "train.optimizer_in_backward runs on 1 GPU" in two.reason
    # the planner's and the trainer's rule holds on its own, past the job file's validation
    from types import SimpleNamespace

    train = SimpleNamespace(micro_batch_size=4, grad_accum=2, optimizer="adamw", optimizer_in_backward=True)
    one = layout_for(SimpleNamespace(train=train), 1)
    assert not one.ok and "train.grad_accum must be 1" in one.reason
    # the default clipping is not applied, not refused
    assert _spec(tmp_path, tiny_model, optimizer_in_backward=True).train.max_grad_norm is None
    assert JobSpec.model_validate(
        job_dict(
            tiny_model,
            tmp_path / "d.jsonl",
            tmp_path / "r",
            method="full",
            train={"optimizer_in_backward": True},
        )
    ).train.optimizer_in_backward

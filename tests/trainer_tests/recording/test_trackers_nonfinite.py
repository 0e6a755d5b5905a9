"""W&B and TensorBoard take a run's non-finite numbers (issue 28 point 5): a NaN loss is never sent as a raw
float; the step logs `train/loss_nonfinite` = 1.0 in its place. A real trainer with `nan@6` (rolled back,
then finishing), both trackers offline, read back from the run store's copies."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import job_dict, prepare_run, run_trainer, wandb_records, write_data

from trainer.recording.trackers import finite_only

STEPS = 12


def test_finite_only_drops_nan_and_inf_and_flags_them() -> None:
    got = finite_only({"train/loss": math.nan, "train/grad_norm": math.inf, "train/lr": 1e-4})
    assert got == {"train/loss_nonfinite": 1.0, "train/grad_norm_nonfinite": 1.0, "train/lr": 1e-4}


@pytest.mark.timeout(600)
def test_a_nan_loss_reaches_wandb_and_tensorboard_as_a_flag_not_a_float(
    tiny_model: Path, tmp_path: Path
) -> None:
    data = write_data(tmp_path / "train.jsonl", "instruction", 60)
    train = {"max_steps": STEPS, "report_to": ["tensorboard", "wandb"]}
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb-local"),
        "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
        "FTORCH_FAULTS": "nan@6",
        **{
            k: str(tmp_path / "wandb-home") for k in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")
        },
    }
    (tmp_path / "wandb-local").mkdir()
    run_uri = prepare_run(job_dict(tiny_model, data, tmp_path / "run", train=train, checkpoint={"every": 4}),
                          run_id="nan-run")  # fmt: skip
    done = run_trainer(run_uri, 1, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "loss NaN at step 6" in out, out[-3000:]

    history: list[tuple[int, dict]] = []
    for folder in sorted((Path(run_uri) / "wandb").glob("offline-run-*-nan-run")):
        for record in wandb_records(folder / "run-nan-run.wandb"):
            if record.HasField("history"):
                items = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item
                }
                history.append((record.history.step.num, items))
    assert history
    numbers = [v for _, items in history for v in items.values() if isinstance(v, float)]
    assert all(math.isfinite(v) for v in numbers)  # no NaN or inf sent
    flagged = [step for step, items in history if items.get("train/loss_nonfinite") == 1.0]
    assert 6 in flagged and all("train/loss" not in dict(history)[s] for s in flagged), history

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(run_uri) / "tensorboard"))
    events.Reload()
    assert all(math.isfinite(e.value) for e in events.Scalars("train/loss"))
    assert 6 in [e.step for e in events.Scalars("train/loss_nonfinite")]
    assert 6 not in [e.step for e in events.Scalars("train/loss")]

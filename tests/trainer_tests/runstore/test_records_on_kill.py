"""Records are written with the checkpoint that covers them (issue 23 points 1 and 2): a trainer killed
without notice between two checkpoints, then resumed, leaves every metrics row and every W&B step of the
run exactly once, with the values of a run that was never stopped, and the summary says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import job_dict, prepare_run, run_trainer, wandb_records, write_data

from trainer.outputs import model_card
from trainer.runstore.store import RunStore

STEPS = 12


def _wandb_history(run_uri: str, run_id: str) -> list[tuple[int, dict[str, float]]]:
    """(step, values) of every history record in the run store's copies of the offline W&B runs (the
    attempts in order): what `wandb sync` of the run store would send."""
    history = []
    for folder in sorted((Path(run_uri) / "wandb").glob(f"offline-run-*-{run_id}")):
        for record in wandb_records(folder / f"run-{run_id}.wandb"):
            if record.HasField("history"):
                items = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item
                }
                history.append((record.history.step.num, items))
    return history


@pytest.fixture(scope="module")
def runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The same 12-step job (checkpoint every 4 steps, TensorBoard and W&B offline) run clean, and run
    again with attempt 1 SIGKILLed at step 10 (checkpoint 8 durable, no metrics or tracker flush since it:
    the time-based flushes are an hour apart), then resumed."""
    root = tmp_path_factory.mktemp("records")
    data = write_data(root / "train.jsonl", "instruction", 60)
    train = {"max_steps": STEPS, "report_to": ["tensorboard", "wandb"]}
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root / "wandb-local"),
        "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
        "FTORCH_ASYNC_CHECKPOINT": "0",
        "FTORCH_PROGRESS_EVERY_S": "3600",
        "FTORCH_TRACKER_FLUSH_S": "3600",
    }
    env.update(
        {k: str(root / "wandb-home") for k in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")}
    )
    (root / "wandb-local").mkdir()
    uris = {}
    for name in ("clean", "killed"):
        job = job_dict(tiny_model, data, root / name, train=train, checkpoint={"every": 4})
        uris[name] = prepare_run(job, run_id=f"{name}-run")
    done = run_trainer(uris["clean"], 1, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    killed = run_trainer(uris["killed"], 1, env={**env, "FTORCH_FAULTS": "kill@10"})
    assert killed.returncode == -9, killed.stdout[-2000:] + killed.stderr[-2000:]
    resumed = run_trainer(uris["killed"], 2, env=env)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resumed from checkpoints/step-00000008" in resumed.stdout
    return uris


def test_metrics_rows_survive_a_kill_once_each_with_the_clean_runs_values(runs: dict[str, str]) -> None:
    clean = RunStore(runs["clean"]).read_metrics()
    rows = RunStore(runs["killed"]).read_metrics()
    assert [r["step"] for r in clean] == list(range(1, STEPS + 1))
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # rows 1-8 were never re-run
    assert [r["loss"] for r in rows] == [r["loss"] for r in clean]  # exact resume: the same losses
    # steps 1-8 as attempt 1 trained them (with checkpoint 8), 9-12 as attempt 2 did (after it)
    assert [r["attempt"] for r in rows] == [1] * 8 + [2] * 4


def test_summary_and_model_card_report_the_runs_first_and_final_loss(runs: dict[str, str]) -> None:
    def summary(run_uri: str) -> dict:
        return json.loads((Path(run_uri) / "output" / model_card.SUMMARY).read_text())

    clean, killed = summary(runs["clean"]), summary(runs["killed"])
    assert killed["first_loss"] == clean["first_loss"] and killed["final_loss"] == clean["final_loss"]
    card = (Path(runs["killed"]) / "output" / model_card.CARD).read_text()
    assert f"{clean['first_loss']:.4f} (first steps) -> {clean['final_loss']:.4f}" in card


def test_wandb_history_has_every_step_once_with_the_clean_runs_losses(runs: dict[str, str]) -> None:
    clean = _wandb_history(runs["clean"], "clean-run")
    history = _wandb_history(runs["killed"], "killed-run")
    assert [step for step, _ in clean] == list(range(1, STEPS + 1))
    assert [step for step, _ in history] == list(range(1, STEPS + 1))  # no gap, no repeat, in order
    assert [v["train/loss"] for _, v in history] == [v["train/loss"] for _, v in clean]
    # the attempt each step was trained in (W&B's copy of attempt 1 may hold fewer steps than it trained:
    # what it lacks up to checkpoint 8 is logged again by attempt 2, from the metrics rows)
    attempts = [(step, v["run/attempt"]) for step, v in history if "run/attempt" in v]
    assert attempts[0] == (1, 1) and attempts[-1] == (9, 2)


def test_tensorboard_has_every_step_once(runs: dict[str, str]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(runs["killed"]) / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, STEPS + 1))


def test_the_next_attempt_records_where_the_killed_one_got_to(runs: dict[str, str]) -> None:
    """The resumed trainer records its start step and the killed one's last reported step (the ledger's
    steps redone; trainer/recording/ledger.py record_start): at least its last checkpoint, at most the kill."""
    from trainer.recording.ledger import attempts_from_records

    records = RunStore(runs["killed"]).epoch_records()
    second = next(r for r in records.values() if r.get("attempt") == 2)
    assert second["start_step"] == 8
    seen = second["previous_attempt_step"]
    assert seen["attempt"] == 1 and 8 <= seen["step"] <= 10, seen
    first, _ = attempts_from_records(records)
    assert first["end_step"] == seen["step"] and first["preempted"]

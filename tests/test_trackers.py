"""`train.report_to: [tensorboard]`: one TensorBoard run per job, readable by TensorBoard, with no step
logged twice after a resume."""

from __future__ import annotations

from pathlib import Path

from helpers import job_dict, prepare_run, run_trainer, write_data


def test_tensorboard_one_run_across_attempts_without_repeated_steps(tiny_model: Path, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = write_data(tmp_path / "train.jsonl", "instruction", 60)
    job = job_dict(
        tiny_model,
        data,
        tmp_path / "runs",
        train={"max_steps": 12, "report_to": ["tensorboard"]},
        data={"eval_examples": 8},
    )
    run_uri = prepare_run(job)
    # attempt 1 logs steps 1-7 (flushed every step) and crashes at 8; its last checkpoint is step 5
    first = run_trainer(run_uri, 1, env={"FTORCH_FAULTS": "crash@8", "FTORCH_TRACKER_FLUSH_S": "0"})
    assert first.returncode != 0 and "injected fault crash@8" in first.stdout + first.stderr
    events = sorted((Path(run_uri) / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    second = run_trainer(run_uri, 2)  # resumes at 5: trains 6-12 again
    assert second.returncode == 0, second.stdout[-2000:]
    assert len(list((Path(run_uri) / "tensorboard").glob("events.out.tfevents.*"))) == 2

    runs = EventAccumulator(str(Path(run_uri) / "tensorboard"))
    runs.Reload()
    tags = runs.Tags()["scalars"]
    assert {
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/tokens_per_s",
        "eval/loss",
        "run/attempt",
    } <= set(tags)
    steps = [e.step for e in runs.Scalars("train/loss")]
    assert steps == list(range(1, 13))  # 6 and 7 were logged by both attempts: the second one's are kept
    assert [e.step for e in runs.Scalars("eval/loss")] == [0, 12]
    assert [(e.step, e.value) for e in runs.Scalars("run/attempt")] == [(1, 1.0), (6, 2.0)]

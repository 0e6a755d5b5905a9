"""progress.json names the newest durable checkpoint as soon as its background upload commits (issue 30,
W4): a running job never shows "checkpoint none yet" while a checkpoint is in the store."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import job_dict, prepare_run, run_trainer, write_data


def test_progress_names_a_checkpoint_committed_in_the_background(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 30}, checkpoint={"every": 10})
    run_uri = prepare_run(job, "w4")
    killed = run_trainer(
        run_uri,
        env={"FTORCH_FAULTS": "kill@19", "FTORCH_PROGRESS_EVERY_S": "0", "FTORCH_ASYNC_CHECKPOINT": "1"},
    )
    assert killed.returncode != 0
    progress = json.loads((Path(run_uri) / "progress.json").read_text())
    manifest = json.loads((Path(run_uri) / "checkpoints" / "step-00000010" / "MANIFEST.json").read_text())
    assert progress["step"] == 19, progress
    # the checkpoint was committed before this snapshot was written: the snapshot must name it
    assert manifest["created_at"] < progress["updated_at"], (manifest["created_at"], progress["updated_at"])
    assert progress["last_checkpoint_step"] == 10, progress

"""Progress, not noise: "checkpoint N saved" is logged for the first save, a save that ends the attempt,
and the first after the interval changes; the rest only at FTORCH_LOG_LEVEL=debug."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import job_dict, prepare_run, run_trainer, write_data


def _saved(output: str) -> list[str]:
    return re.findall(r"(?m)^.*checkpoint (\d+) saved \(.*$", output)


def test_saved_lines_only_when_something_changes(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 40)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 12}, checkpoint={"every": 2})
    done = run_trainer(prepare_run(job, "quiet"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _saved(done.stdout + done.stderr) == ["2", "12"]  # the first save and the final one
    done = run_trainer(prepare_run(job, "loud"), env={"FTORCH_LOG_LEVEL": "debug"})
    assert done.returncode == 0
    assert _saved(done.stdout + done.stderr) == [str(n) for n in range(2, 13, 2)]  # every save, at debug

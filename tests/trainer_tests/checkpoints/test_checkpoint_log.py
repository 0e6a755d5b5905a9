"""Progress, not noise: "checkpoint N saved" is logged for the first save, a save that ends the attempt,
and the first after the interval changes; the rest only at FTORCH_LOG_LEVEL=debug."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import job_dict, prepare_run, run_trainer, write_data


def _saved(output: str) -> list[str]:
    return re.findall(r"(?m)^.*checkpoint (\d+) saved \(.*$", output)


def _skipped(output: str) -> list[str]:
    """Saves that came due while the previous upload was in flight (a loaded machine): skipped by design
    (trainer/checkpoints/async_save.py), and said so at every log level."""
    return re.findall(r"(?m)^.*checkpoint at step (\d+) skipped: .*$", output)


def test_saved_lines_only_when_something_changes(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 40)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 12}, checkpoint={"every": 2})
    done = run_trainer(prepare_run(job, "quiet"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _saved(done.stdout + done.stderr) == ["2", "12"]  # the first save and the final one
    done = run_trainer(prepare_run(job, "loud"), env={"FTORCH_LOG_LEVEL": "debug"})
    assert done.returncode == 0
    out = done.stdout + done.stderr
    saved, skipped = _saved(out), _skipped(out)
    assert saved[0] == "2" and saved[-1] == "12", out[-2000:]
    # every save due is logged at debug: as saved, or (an upload still in flight) as skipped
    assert sorted([*saved, *skipped], key=int) == [str(n) for n in range(2, 13, 2)], out[-2000:]

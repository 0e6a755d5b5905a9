"""`launch --follow` / `resume --follow` exit with a code per end state, so scripts can tell them apart."""

from __future__ import annotations

from pathlib import Path

import yaml
from helpers import ftorch, job_dict, write_data

from orchestrator.follow import FOLLOW_EXIT_CODES


def test_each_end_state_has_its_own_documented_exit_code() -> None:
    assert FOLLOW_EXIT_CODES["SUCCEEDED"] == 0
    codes = [FOLLOW_EXIT_CODES[s] for s in ("FAILED", "CANCELLED", "STOPPED")]
    assert len(set(codes)) == 3 and 0 not in codes and 1 not in codes and 2 not in codes
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    for state, code in FOLLOW_EXIT_CODES.items():
        assert f"{code} {state}" in readme, state


def test_launch_follow_of_a_failing_job_exits_with_the_failed_code(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 6}, local={"max_restarts_on_errors": 0}
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    done = ftorch("launch", str(job_file), "--follow", env={"FTORCH_FAULTS": "crash@2"})
    assert "FAILED" in done.stdout, done.stdout + done.stderr
    assert done.returncode == FOLLOW_EXIT_CODES["FAILED"], done.stdout + done.stderr

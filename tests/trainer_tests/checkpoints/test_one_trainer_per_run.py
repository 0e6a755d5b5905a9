"""One trainer per run. A job that fails under `launch --follow` exits with FAILED's code; two `resume`s
at the same moment start one trainer (the other is refused in one line, exit 2), and the job goes
straight to SUCCEEDED, never FAILED on the way. A trainer that finds itself fenced exits FENCED (76)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import yaml
from helpers import REPO, ftorch, job_dict, prepare_run, trainer_cmd, write_data

from orchestrator.cli.follow import FOLLOW_EXIT_CODES
from orchestrator.registry import Registry
from trainer import exitcodes
from trainer.runstore.store import RunStore


def _ftorch_cmd() -> list[str]:
    import sys

    exe = Path(sys.executable).parent / "ftorch"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "orchestrator.cli.app"]


def test_failed_follow_code_then_two_resumes_start_one_trainer(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 8}, local={"max_restarts_on_errors": 0}
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    done = ftorch("launch", str(job_file), "--follow", env={"FTORCH_FAULTS": "crash@2"})
    assert done.returncode == FOLLOW_EXIT_CODES["FAILED"], done.stdout + done.stderr
    job_id = done.stdout.split()[0]

    env = {k: v for k, v in os.environ.items() if k != "FTORCH_FAULTS"}
    both = [
        subprocess.Popen(
            [*_ftorch_cmd(), "resume", job_id, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for extra in ([], ["--follow"])
    ]
    results = [(p.wait(timeout=300), *p.communicate()) for p in both]
    codes = sorted(code for code, _out, _err in results)
    assert codes == [0, 2], results
    refused = next(err for code, _out, err in results if code == 2)
    assert len(refused.strip().splitlines()) == 1 and job_id in refused, refused

    registry = Registry()
    # the winner may be the resume without --follow: wait for the job's end either way
    deadline = time.monotonic() + 180
    while registry.get(job_id).state not in ("SUCCEEDED", "FAILED") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert registry.get(job_id).state == "SUCCEEDED"
    assert len(registry.attempts(job_id)) == 2  # the failed one and one resumed trainer
    states = [e["detail"] for e in registry.events(job_id) if e["kind"] == "state"]
    after_resume = states[[i for i, s in enumerate(states) if s.startswith("PENDING")][-1] :]
    assert not [s for s in after_resume if s.startswith("FAILED")], states


def test_a_fenced_trainer_exits_76(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    run_uri = prepare_run(job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 8}))
    proc = subprocess.Popen(
        trainer_cmd(run_uri, 1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "holds epoch 1" in line:
            proc.send_signal(signal.SIGSTOP)  # a newer attempt claims the run meanwhile
            RunStore(run_uri).claim_epoch({"attempt": 2})
            proc.send_signal(signal.SIGCONT)
            break
    seen += list(proc.stdout)
    assert proc.wait(timeout=300) == exitcodes.FENCED, "".join(seen)
    assert "fenced:" in "".join(seen)
    assert not (Path(run_uri) / "output").exists()

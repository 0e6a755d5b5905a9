"""Nothing left behind and nothing misreported when an attempt ends badly (issue 23 point 7): no
/tmp/ftorch-tb-* folder per attempt, a checkpoint file linked out of the store is a bad checkpoint (the
previous one is used), a run store deleted under a running trainer ends it failed, not done, and a
stopped trainer's children (tokeniser workers) go with it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import REPO, job_dict, prepare_run, run_trainer, trainer_cmd, write_data


def _job(tmp_path: Path, tiny_model: Path, **train: object) -> str:
    data = write_data(tmp_path / "d.jsonl", "instruction", 40)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 12, **train})
    return prepare_run(job)


def test_tensorboard_leaves_no_temporary_folder_also_after_a_crash(tmp_path: Path, tiny_model: Path) -> None:
    run_uri = _job(tmp_path, tiny_model, report_to=["tensorboard"])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {"TMPDIR": str(scratch)}
    crashed = run_trainer(run_uri, 1, env={**env, "FTORCH_FAULTS": "crash@8"})
    assert crashed.returncode != 0 and "injected fault crash@8" in crashed.stdout + crashed.stderr
    assert list(scratch.glob("ftorch-tb-*")) == []
    done = run_trainer(run_uri, 2, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert list(scratch.glob("ftorch-tb-*")) == []
    assert len(list((Path(run_uri) / "tensorboard").glob("events.out.tfevents.*"))) == 2


def test_a_checkpoint_file_linked_out_of_the_store_falls_back_to_the_previous_one(
    tmp_path: Path, tiny_model: Path
) -> None:
    run_uri = _job(tmp_path, tiny_model, max_steps=10)
    first = run_trainer(run_uri, 1)  # checkpoints 5 and 10, both complete (the last one waited for)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    newest = sorted((Path(run_uri) / "checkpoints").glob("step-*"))[-1]
    assert newest.name == "step-00000010" and (newest / "MANIFEST.json").exists()
    victim = next(p for p in newest.rglob("*") if p.is_file() and p.name != "MANIFEST.json")
    outside = tmp_path / "outside.bin"
    shutil.copyfile(victim, outside)  # even the same bytes: a link out of the store is never read
    victim.unlink()
    victim.symlink_to(outside)
    done = run_trainer(run_uri, 2)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "not using checkpoint checkpoints/step-00000010" in done.stdout
    assert "resumed from checkpoints/step-00000005" in done.stdout


def test_a_run_store_deleted_under_the_trainer_ends_it_failed(tmp_path: Path, tiny_model: Path) -> None:
    run_uri = _job(tmp_path, tiny_model)
    proc = subprocess.Popen(
        trainer_cmd(run_uri), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "checkpoint 5 saved" in line:
            proc.send_signal(signal.SIGSTOP)  # hold it while the store goes away
            shutil.rmtree(run_uri)
            proc.send_signal(signal.SIGCONT)
            break
    rest, _ = proc.communicate(timeout=240)
    out = "".join(lines) + rest
    assert proc.returncode == 2, out[-3000:]
    errors = [line for line in out.splitlines() if "error:" in line]
    assert len(errors) == 1 and "spec.json" in errors[0] and "run store" in errors[0], errors
    assert "done:" not in out and not (Path(run_uri) / "output").exists()


def test_stopping_a_trainer_ends_its_children_too(tmp_path: Path) -> None:
    from orchestrator.backends.local_parts import start_trainer, stop_trainer

    pid_file = tmp_path / "child.pid"
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # a trainer stuck past its grace
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(300)\n"
    )
    with open(tmp_path / "log", "wb") as log:
        proc = start_trainer([sys.executable, "-c", script], log, dict(os.environ))
    deadline = time.time() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.time() < deadline
        time.sleep(0.05)
    child = int(pid_file.read_text())
    stop_trainer(proc, notice=True, grace=0.5, log=lambda _m: None)
    assert proc.poll() is not None
    deadline = time.time() + 10
    while _alive(child) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the trainer's child outlived it"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return False

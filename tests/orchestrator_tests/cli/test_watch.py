"""The live view: it ends by itself when the job ends, survives a resize, and Ctrl-C only stops the
watching (the job and its supervisor go on). One real run: `launch --follow` in a terminal, with a
simulated preemption and notifications."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
import yaml
from fakejobs import add_job
from helpers import REPO, job_dict, write_data
from http_fakes import Hook
from rich.console import Console

from orchestrator.cli import follow
from orchestrator.registry import Registry
from orchestrator.views import status as job_status

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]|\x1b[()][0-9A-Za-z]|\r")


def terminal(width: int = 100) -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=width, height=60, record=True)


@pytest.fixture()
def running(tmp_path: Path, ftorch_home: Path) -> Registry:
    """A RUNNING job whose 'supervisor' is this test process (alive, so nothing reconciles it away)."""
    registry = Registry(ftorch_home)
    add_job(
        registry, tmp_path / "runs", "llama3-8b-support-a1b2c3", "RUNNING", 212, total=600,
        attempts=[
            {"start": 0, "end": 131, "reason": "preempted (with notice, random)", "seconds": 2620},
            {"start": 130, "end": 212, "reason": None, "seconds": 1640},
        ],
        checkpoints=[150, 180, 210], supervisor_pid=os.getpid(),
    )  # fmt: skip
    return registry


def test_watch_of_one_job_ends_when_the_job_ends(running: Registry) -> None:
    threading.Timer(1.0, running.set_state, ("llama3-8b-support-a1b2c3", "SUCCEEDED")).start()
    out = terminal()
    started = time.time()
    assert follow.watch("llama3", out=out, poll_s=0.2) == 0
    assert time.time() - started < 10
    text = out.export_text()
    assert "SUCCEEDED" in text and "output:" in text  # the last frame stays on screen


def test_watch_of_all_jobs_ends_when_none_is_active(running: Registry) -> None:
    threading.Timer(1.0, running.set_state, ("llama3-8b-support-a1b2c3", "CANCELLED")).start()
    out = terminal(60)
    assert follow.watch(None, out=out, poll_s=0.2) == 0
    assert "CANCELLED" in out.export_text()


@pytest.mark.parametrize("on_read", [1, 3], ids=["during-the-first-read", "during-a-later-read"])
def test_ctrl_c_while_a_frame_is_read_stops_the_watching_only(
    running: Registry, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], on_read: int
) -> None:
    """A real SIGINT delivered while the view reads the job (the n-th `_frame`): the first read ran
    outside the live view's try, so a Ctrl-C there escaped as KeyboardInterrupt (exit 130, no line)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    real, reads = follow._frame, []

    def reading(*args: object, **kwargs: object) -> object:
        reads.append(1)
        if len(reads) == on_read:
            signal.raise_signal(signal.SIGINT)  # the terminal's Ctrl-C, in the middle of this read
        return real(*args, **kwargs)

    before = running.events("llama3-8b-support-a1b2c3")
    monkeypatch.setattr(follow, "_frame", reading)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as in `ftorch`
    try:
        code = follow.watch("llama3", out=terminal(), poll_s=0.05)
    except KeyboardInterrupt:
        pytest.fail(f"the Ctrl-C during read {on_read} escaped the watch (ftorch would exit 130)")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 0
    assert len(reads) == on_read  # stopped at that read, not later
    assert "stopped watching; the job goes on" in capsys.readouterr().out
    job = running.get("llama3-8b-support-a1b2c3")
    assert job.state == "RUNNING" and not job.cancel_requested
    assert running.events("llama3-8b-support-a1b2c3") == before


@pytest.mark.parametrize("on_read", [1, 3], ids=["during-the-first-read", "during-a-later-read"])
def test_ctrl_c_that_a_store_files_finalizer_swallows_still_stops_the_watching(
    running: Registry, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], on_read: int
) -> None:
    """A real SIGINT handled while a frame's run-store read drops its file: fsspec's LocalFileOpener is an
    io.IOBase with a Python `closed` property, which IOBase's finalizer evaluates and whose error it clears
    without a word, KeyboardInterrupt included. The view then drew on for ever (`status --watch` still
    running 15 s after Ctrl-C); here the job ends two reads later, so the old view ends instead."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    from fsspec.implementations.local import LocalFileOpener

    job_id = "llama3-8b-support-a1b2c3"
    real_frame, real_closed = follow._frame, LocalFileOpener.closed.fget
    reads: list[int] = []
    fired: list[bool] = []

    def reading(*args: object, **kwargs: object) -> object:
        reads.append(1)
        if len(reads) == on_read + 2:
            running.set_state(job_id, "SUCCEEDED")  # where a lost Ctrl-C would leave the view drawing
        return real_frame(*args, **kwargs)

    def closed(self: LocalFileOpener) -> bool:
        if len(reads) == on_read and not fired and real_closed(self):  # a read file, being finalized
            fired.append(True)
            signal.raise_signal(signal.SIGINT)  # the terminal's Ctrl-C, handled inside the finalizer
        return bool(real_closed(self))

    monkeypatch.setattr(follow, "_frame", reading)
    monkeypatch.setattr(LocalFileOpener, "closed", property(closed))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as in `ftorch`
    try:
        code = follow.watch("llama3", out=terminal(), poll_s=0.05)
    except KeyboardInterrupt:
        pytest.fail(f"the Ctrl-C during read {on_read} escaped the watch (ftorch would exit 130)")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert fired, "no run-store file was finalized during the read: the case is not exercised"
    assert code == 0
    assert "stopped watching; the job goes on" in capsys.readouterr().out, "the Ctrl-C was lost"
    assert len(reads) == on_read  # stopped after that read, not later
    assert running.get(job_id).state == "RUNNING"


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Pty:
    """A command on a pseudo-terminal of a given size, its output collected in the background."""

    def __init__(self, argv: list[str], cols: int, rows: int = 50, env: dict[str, str] | None = None) -> None:
        self.master, slave = pty.openpty()
        _set_size(slave, rows, cols)
        env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in ("COLUMNS", "LINES")}
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env={**env, "TERM": "xterm-256color"},
            start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self.chunks: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.chunks.append(data)

    def text(self, since: int = 0) -> str:
        return ANSI.sub("", b"".join(self.chunks[since:]).decode("utf-8", "replace"))

    def wait_for(self, needle: str, timeout: float, since: int = 0) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if needle in self.text(since):
                return self.text(since)
            if self.proc.poll() is not None:
                time.sleep(0.3)
                break
            time.sleep(0.1)
        assert needle in self.text(since), f"{needle!r} not seen; output:\n{self.text()[-3000:]}"
        return self.text(since)

    def resize(self, rows: int, cols: int) -> None:
        _set_size(self.master, rows, cols)
        os.killpg(self.proc.pid, signal.SIGWINCH)

    def ctrl_c(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)  # what the terminal does: the whole foreground group


#: `ftorch` exec'd with SIGINT ignored, as a non-interactive shell starts a background job (`cmd &`, e.g. the
#: suite run as `scripts/test.sh > log &`) and everything under it: Python then installs no SIGINT handler
IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


@pytest.mark.parametrize("sigint", ["as-started", "ignored-by-the-launcher"])
def test_ctrl_c_stops_watching_and_leaves_the_job_alone_after_a_resize(
    running: Registry, sigint: str
) -> None:
    before = running.events("llama3-8b-support-a1b2c3")
    argv = [str(Path(sys.executable).parent / "ftorch"), "status", "--watch", "llama3"]
    if sigint == "ignored-by-the-launcher":
        argv = [sys.executable, "-c", IGNORING_SIGINT, *argv]
    term = Pty(argv, cols=120)
    try:
        term.wait_for("WHERE", timeout=30)  # the wide attempts table
        mark = len(term.chunks)
        term.resize(40, 50)  # a phone: the attempts become one line each
        term.wait_for("#1 aws:g5.2xlarge", timeout=15, since=mark)
        assert term.proc.poll() is None
        term.ctrl_c()
        assert term.proc.wait(timeout=15) == 0
    finally:
        if term.proc.poll() is None:  # a lost Ctrl-C: the view is still drawing
            os.killpg(term.proc.pid, signal.SIGKILL)
            term.proc.wait()
    assert "stopped watching; the job goes on" in term.text()
    job = running.get("llama3-8b-support-a1b2c3")
    assert job.state == "RUNNING" and not job.cancel_requested
    assert running.events("llama3-8b-support-a1b2c3") == before


def test_launch_follow_in_a_terminal_with_a_preemption_and_notifications(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    hook = Hook()
    try:
        data = write_data(tmp_path / "d.jsonl", "instruction", 64)
        marker = tmp_path / "notified.txt"
        job = job_dict(
            tiny_model, data, tmp_path / "runs", train={"max_steps": 20},
            local={"chaos": {"preempt_at_steps": [8], "notice": True, "grace_s": 20}, "hourly_usd": 3.6},
            notify={
                "webhook": hook.url, "command": f'echo "$FTORCH_EVENT" >> {marker}',
                "on": ["succeeded", "failed", "preempted"],
            },
        )  # fmt: skip
        job_file = tmp_path / "job.yaml"
        job_file.write_text(yaml.safe_dump(job))
        exe = Path(sys.executable).parent / "ftorch"
        # steps slowed (a fault, not a slow machine): the supervisor sees step 8 while there is training left;
        # a simulated preemption that lands after the output is written is no preemption (test_reported_state)
        term = Pty(
            [str(exe), "launch", str(job_file), "--follow"], cols=110, env={"FTORCH_FAULTS": "slow-step@500"}
        )
        assert term.proc.wait(timeout=240) == 0, term.text()[-3000:]
        text = term.text()
        # the live view drew the job, then the summary the quickstart relies on
        assert "attempts" in text and "Ctrl-C stops watching" in text
        assert "trained adapter:" in text and "time lost per preemption" in text and "preemptions 1" in text
        assert "cost $" in text
        events = [r["body"]["event"] for r in hook.received]
        assert events == ["preempted", "succeeded"], events
        assert (
            hook.received[1]["body"]["state"] == "SUCCEEDED" and hook.received[1]["body"]["preemptions"] == 1
        )
        assert marker.read_text().split() == ["preempted", "succeeded"]
        job_id = hook.received[1]["body"]["job_id"]
        detail = job_status.status_one(job_id)
        notes = [e["detail"] for e in detail["events"] if e["kind"] == "notify"]
        assert notes == ["preempted: sent", "succeeded: sent"]
        assert json.dumps(detail, default=str)  # the detail stays JSON-able
    finally:
        hook.close()

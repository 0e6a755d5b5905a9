"""The suite's own leak check (tests/leaks.py): a process a test started and left is found even when it
detached itself (new session, reparented to init), named, and stopped; an unrelated process is not."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid

import psutil
from leaks import MARKER, describe, stop_all, survivors


def _detached_sleeper(env: dict[str, str]) -> int:
    """A `sleep` that outlives the shell that started it (double fork, own session): its pid."""
    code = (
        "import subprocess; "
        "p = subprocess.Popen(['sleep', '120'], start_new_session=True, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_a_detached_process_the_session_started_is_found_named_and_stopped() -> None:
    token = uuid.uuid4().hex
    # this worker's own children that other tests' fixtures keep for the session (the S3 server) are
    # descendants too: they are the session's business, not this test's, so only new ones are compared
    before = {p.pid for p in survivors(token)}  # type: ignore[attr-defined]
    marked = _detached_sleeper({**os.environ, MARKER: token})
    other = _detached_sleeper({k: v for k, v in os.environ.items() if k != MARKER})
    try:
        assert psutil.Process(marked).ppid() != os.getpid()  # reparented: not a child of this process
        found = [p for p in survivors(token) if p.pid not in before]  # type: ignore[attr-defined]
        assert [p.pid for p in found] == [marked]  # type: ignore[attr-defined]
        assert describe(found[0]) == f"pid {marked}: sleep 120"
        stop_all(found, grace=2.0)
        deadline = time.time() + 5
        while psutil.pid_exists(marked) and psutil.Process(marked).status() != psutil.STATUS_ZOMBIE:
            assert time.time() < deadline, "the leaked process was not stopped"
            time.sleep(0.05)
        assert [p for p in survivors(token) if p.pid not in before] == []  # type: ignore[attr-defined]
    finally:
        for pid in (marked, other):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_the_processes_a_test_starts_write_their_temporary_files_in_the_sessions_own_folder() -> None:
    """torchrun, SeaweedFS, SkyPilot and wandb write scratch files wherever TMPDIR says: the session's
    own folder (tests/conftest.py), which is removed at its end, not /tmp, where they piled up."""
    from leaks import SESSION_TMP_PREFIX

    code = "import tempfile; print(tempfile.gettempdir())"
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert os.path.basename(child).startswith(SESSION_TMP_PREFIX), child
    assert os.path.isdir(child) and child == tempfile.gettempdir() == os.environ["TMPDIR"]

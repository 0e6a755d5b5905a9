"""trainer/runstore/scratch.py: a killed process's scratch folder (a SIGKILL skips every cleanup) is removed by the
next process that makes one of the same kind; a live process's, another kind's and another user's stay."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from trainer.runstore import scratch


def _age(path: Path, seconds: float = scratch.QUIET_S + 60) -> Path:
    """As if nothing in `path` had changed for `seconds`."""
    then = time.time() - seconds
    for inner in [*path.rglob("*"), path]:
        os.utime(inner, (then, then), follow_symlinks=False)
    return path


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_makers_folder_is_swept_and_the_others_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"ftorch-export-{_dead_pid()}-abc123"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "model.safetensors").write_bytes(b"x" * 1024)
    _age(dead)
    live = tmp_path / f"ftorch-export-{os.getppid()}-def456"  # pytest's parent: alive
    live.mkdir()
    _age(live, 10 * scratch.QUIET_S)
    busy = tmp_path / f"ftorch-export-{_dead_pid()}-jkl012"  # its pid looks gone, a file still grows there
    (busy / "sub").mkdir(parents=True)
    _age(busy)
    (busy / "sub" / "model.safetensors").write_bytes(b"x")  # (another pid namespace, one /tmp)
    other_kind = tmp_path / f"ftorch-data-{_dead_pid()}-ghi789"
    other_kind.mkdir()
    _age(other_kind)
    not_ours = tmp_path / "ftorch-export-notapid"
    not_ours.mkdir()
    made = scratch.make("ftorch-export-")
    assert Path(made).parent == tmp_path and Path(made).name.startswith(f"ftorch-export-{os.getpid()}-")
    assert oct(Path(made).stat().st_mode & 0o777) == "0o700"
    assert not dead.exists() and live.exists() and other_kind.exists() and not_ours.exists()
    assert busy.exists()  # quiet for less than QUIET_S: left for a later sweep
    with scratch.folder("ftorch-export-") as second:  # a second of this process's own: both stay meanwhile
        assert Path(made).exists() and Path(second).exists()
    assert not Path(second).exists()
    assert scratch.sweep("ftorch-data-") == [str(other_kind)]


def test_a_link_or_a_file_with_a_dead_pid_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("mine")
    _age(keep)
    (tmp_path / f"ftorch-out-{_dead_pid()}-link").symlink_to(keep)
    file = tmp_path / f"ftorch-out-{_dead_pid()}-file"
    file.write_text("a file")
    _age(file)
    for link in tmp_path.glob("ftorch-out-*-link"):
        _age(link)
    assert scratch.sweep("ftorch-out-") == []
    assert (keep / "precious").read_text() == "mine"

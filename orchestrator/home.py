"""$FTORCH_HOME (default ~/.ftorch): this machine's ftorch state (the job registry, logs, caches of traces,
Hub configs and shipped wheels), readable by its owner only. Every folder and file under it is made here."""

from __future__ import annotations

import os
from pathlib import Path


def ftorch_home() -> Path:
    return Path(os.environ.get("FTORCH_HOME") or Path.home() / ".ftorch").expanduser()


def owner_only_umask() -> None:
    """What the CLI process (and the supervisor and controller it starts) creates is owner-only whatever
    the user's umask: a run store holds weights and the resolved job, $FTORCH_HOME its registry and logs
    (issue 30, S5; the trainer does the same in trainer/__main__.py)."""
    os.umask(0o077)


def private_dir(*parts: str) -> Path:
    """$FTORCH_HOME/parts..., made (with $FTORCH_HOME itself) owner-only (0700)."""
    home = ftorch_home()
    path = home.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    for folder in (home, *[home.joinpath(*parts[: i + 1]) for i in range(len(parts))]):
        os.chmod(folder, 0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write `path` (under a private_dir) atomically, owner-only (0600)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)

"""Scratch folders in the system's temp folder that a killed process does not leave there for good.

A SIGKILL, the OOM killer or a power cut skips every cleanup, and an export's scratch folder can hold a
merged model (gigabytes). So each folder's name carries its maker's pid (`<prefix><pid>-<random>`), and
making a new one of a prefix first removes the folders of that prefix whose maker is gone and in which
nothing has changed for QUIET_S. Only this user's folders are touched; a folder whose pid is alive again
(reused) stays: the safe side. The quiet time covers a temp folder shared with another pid namespace
(containers with one /tmp), where a live maker's pid looks gone from here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

#: how long nothing in a dead maker's folder must have changed before it is removed
QUIET_S = 600.0


def _quiet(path: Path, now: float) -> bool:
    """Nothing in `path` (the folder, its entries, their contents' times) changed for QUIET_S."""
    try:
        if now - path.lstat().st_mtime < QUIET_S:
            return False
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                if now - os.lstat(os.path.join(root, name)).st_mtime < QUIET_S:
                    return False
    except OSError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep(prefix: str) -> list[str]:
    """Remove this user's `<prefix><pid>-*` folders in the temp folder whose pid is gone and which have
    been quiet for QUIET_S; what went."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[^/]+$")
    removed = []
    root = Path(tempfile.gettempdir())
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for path in entries:
        match = pattern.match(path.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            info = path.lstat()
        except OSError:
            continue
        if info.st_uid != os.getuid() or not path.is_dir() or path.is_symlink():
            continue
        if not _alive(int(match.group(1))) and _quiet(path, time.time()):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


def make(prefix: str) -> str:
    """A new owner-only scratch folder `<prefix><pid>-<random>`, after sweeping the prefix's dead ones."""
    sweep(prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


@contextlib.contextmanager
def folder(prefix: str) -> Iterator[str]:
    """`make`, removed on the way out (as tempfile.TemporaryDirectory)."""
    path = make(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

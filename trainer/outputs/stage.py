"""A local export is staged whole, then put in place by renames, so a kill leaves either nothing new or
the previous export (issue 30, R4). Next to the target `<parent>/<name>`:

    .<name>.ftorch-export-<pid>     the new export being written (with its marker, written last)
    .<name>.ftorch-replaced-<pid>   an earlier export set aside during the swap, deleted after it

`recover` (at the start of every export to that target) deletes a dead exporter's staging folder, puts
a set-aside export back when the kill fell between the two renames, and removes the `.tmp-*` files that
a killed atomic write leaves. Files end owner-only (0600, folders 0700). No torch here.
"""

from __future__ import annotations

import os
import re
import shutil

from trainer.faults import maybe_die
from trainer.runstore.storage import fsync_dir

STAGE = ".ftorch-export-"
REPLACED = ".ftorch-replaced-"
#: what trainer.runstore.storage's atomic write names its temporary file: `<name>.tmp-<8 hex>`
LEFTOVER = re.compile(r".+\.tmp-[0-9a-f]{8}$")


def _split(target: str) -> tuple[str, str]:
    parent, name = os.path.split(os.path.abspath(target).rstrip("/"))
    return parent, name


def stage_dir(target: str) -> str:
    """This process's staging folder for `target` (its parent is created if missing)."""
    parent, name = _split(target)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    return os.path.join(parent, f".{name}{STAGE}{os.getpid()}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # a staging folder of ours at the start is an earlier (killed) process's pid reused
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _side(target: str, kind: str) -> list[tuple[str, int]]:
    """(path, pid) of the side folders of `kind` next to `target`, oldest pid first."""
    parent, name = _split(target)
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return []
    prefix = f".{name}{kind}"
    found = [(os.path.join(parent, e), e[len(prefix) :]) for e in entries if e.startswith(prefix)]
    return sorted((path, int(pid)) for path, pid in found if pid.isdigit())


def _owner_only(folder: str) -> None:
    os.chmod(folder, 0o700)
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o700)
        for f in files:
            os.chmod(os.path.join(root, f), 0o600)


def publish(folder: str, target: str) -> None:
    """Put the complete export `folder` at `target`: one rename when `target` is absent or empty; an
    earlier export there is set aside by a rename first, and deleted once the new one is in place."""
    _owner_only(folder)
    if os.path.isdir(target) and not os.path.islink(target) and not os.listdir(target):
        os.rmdir(target)
    replaced = None
    if os.path.lexists(target):
        parent, name = _split(target)
        replaced = os.path.join(parent, f".{name}{REPLACED}{os.getpid()}")
        os.rename(target, replaced)
        maybe_die("export", 3)  # tests: a kill between the two renames
    os.rename(folder, target)
    fsync_dir(os.path.dirname(os.path.abspath(target)))
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def recover(target: str) -> None:
    """Undo what a killed export left next to (and in) `target`."""
    for path, pid in _side(target, STAGE):
        if not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
    set_aside = [(path, pid) for path, pid in _side(target, REPLACED) if not _alive(pid)]
    if set_aside and not os.path.lexists(target):  # killed between the renames: the previous one back
        os.rename(set_aside.pop()[0], target)
    for path, _pid in set_aside:
        shutil.rmtree(path, ignore_errors=True)
    if os.path.isdir(target) and not os.path.islink(target):
        for root, _dirs, files in os.walk(target):
            for f in files:
                if LEFTOVER.match(f):
                    os.unlink(os.path.join(root, f))

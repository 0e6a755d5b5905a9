"""The run's environment lock in the run store (docs/environment.md): what `ftorch launch` writes, what a
cloud task installs, what `ftorch env JOB` shows and what `ftorch resume` compares.

- `env/lock.txt`: exact pins (trainer/envlock.py's format). For the skypilot backend, the shipped lock of
  the target (orchestrator/data/locks/<target>.txt, made by scripts/build_lock.py), which every attempt's
  setup installs with no resolution; with `resources.image_id` no lock (the image, pinned by digest, is
  the environment). For the local backend, the versions installed here (ftorch's requirements and theirs).
- `env/lock.json`: where the lock came from (source, target, its sha256) and the ftorch that runs
  (version and the sha256 of its shipped wheel or source tree).
No torch, no sky.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Mapping
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError

LOCK = "env/lock.txt"
INFO = "env/lock.json"
#: the lock a cloud task installs unless the job brings its own image (the GPU images' Python and CUDA)
DEFAULT_TARGET = "cu130-py311"
#: where the rendered setup writes the lock on the instance
REMOTE_LOCK = "/tmp/ftorch-env/lock.txt"
#: docker images must be pinned by digest; other image ids (an AMI, a GCP image) are immutable already
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def shipped_lock(target: str = DEFAULT_TARGET) -> str:
    """A lock shipped with ftorch (package data), checked: exact pins only."""
    from trainer.envlock import LockError, parse

    try:
        text = (resources.files("orchestrator") / "data" / "locks" / f"{target}.txt").read_text(
            encoding="utf-8"
        )
    except (FileNotFoundError, ModuleNotFoundError):
        raise SpecError(
            "resources", f"ftorch ships no environment lock {target!r} ({', '.join(targets())})"
        ) from None
    try:
        parse(text, f"locks/{target}.txt")
    except LockError as exc:
        raise SpecError("resources", f"the shipped lock is damaged: {exc}") from None
    return text


def targets() -> list[str]:
    folder = resources.files("orchestrator") / "data" / "locks"
    return sorted(p.name.removesuffix(".txt") for p in folder.iterdir() if p.name.endswith(".txt"))


def check_image(image_id: str | None) -> None:
    """A docker image is the run's environment only when pinned by digest (a tag moves)."""
    if image_id and image_id.startswith("docker:") and not DIGEST.search(image_id):
        raise SpecError(
            "resources.image_id",
            f"{image_id} is a tag, which can point at other libraries on the next attempt; pin it by digest "
            "(docker:REPO@sha256:...; `docker inspect --format '{{index .RepoDigests 0}}' IMAGE`)",
        )


#: a lock file of your own (another Python or CUDA: scripts/build_lock.py --out FILE) instead of the shipped one
LOCK_FILE_ENV = "FTORCH_LOCK_FILE"


def task_lock(spec: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """The lock a cloud task installs: $FTORCH_LOCK_FILE, else the shipped DEFAULT_TARGET; None when the
    job runs its own (digest-pinned) image."""
    from trainer.envlock import LockError, parse

    check_image(spec.resources.image_id)
    if spec.resources.image_id:
        return None
    path = (os.environ if environ is None else environ).get(LOCK_FILE_ENV)
    if not path:
        return shipped_lock()
    try:
        text = Path(path).read_text(encoding="utf-8")
        parse(text, path)
    except (OSError, LockError) as exc:
        raise SpecError(LOCK_FILE_ENV, f"{exc}; give a lock made by scripts/build_lock.py") from None
    return text


def lock_source(spec: Any, environ: Mapping[str, str] | None = None) -> str:
    if spec.resources.image_id:
        return "image"
    path = (os.environ if environ is None else environ).get(LOCK_FILE_ENV)
    return f"file:{os.path.abspath(path)}" if path else f"shipped:{DEFAULT_TARGET}"


def _unconditional(requires: list[str] | None) -> list[str]:
    """The names of requirements that apply here with no extra (markers evaluated on this machine)."""
    from packaging.requirements import Requirement

    found = []
    for text in requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            found.append(req.name)
    return found


def local_lock() -> str:
    """The versions installed here of ftorch's requirements (every extra that is installed) and theirs."""
    import sys

    from packaging.requirements import Requirement

    from trainer.envlock import normalise

    dists: dict[str, Any] = {}
    for dist in metadata.distributions():  # one pass over the path; the first of a name wins, as for import
        # the folder's name says the distribution's (parsing every METADATA would take seconds)
        name = getattr(dist, "_normalized_name", None) or dist.metadata["Name"] or ""
        dists.setdefault(normalise(name), dist)
    seen: dict[str, str] = {}
    todo = [Requirement(t).name for t in (dists["ftorch"].requires if "ftorch" in dists else None) or []]
    while todo:
        name = normalise(todo.pop())
        if name in seen or name not in dists or name == "ftorch":
            continue
        meta = dists[name].metadata  # parsed once
        seen[name] = meta["Version"]
        todo += _unconditional(meta.get_all("Requires-Dist"))
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    lines = ["# ftorch environment: the versions installed here", "# target: local", f"# python: {python}"]
    return "\n".join([*lines, *(f"{n}=={v}" for n, v in sorted(seen.items()))]) + "\n"


def ftorch_identity(remote: bool, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ftorch that runs: its version and the sha256 of what a task installs (the shipped wheel, or
    the source tree); for a local run, of the source tree or the installed package's RECORD."""
    from orchestrator import __version__
    from orchestrator.backends import ship

    if not remote:
        root = ship.source_root()
        if root is not None:
            return {"version": __version__, "source_sha256": tree_digest(root)}
        record = metadata.distribution("ftorch").read_text("RECORD") or ""
        return {"version": __version__, "record_sha256": hashlib.sha256(record.encode()).hexdigest()}
    install = ship.install_for_task([], environ)
    if install.file_mounts:
        (wheel,) = install.file_mounts.values()
        return {"version": __version__, "wheel_sha256": hashlib.sha256(Path(wheel).read_bytes()).hexdigest()}
    if install.workdir:
        return {"version": __version__, "source_sha256": tree_digest(Path(install.workdir))}
    return {"version": __version__, "pip_spec": install.pip_spec}


def tree_digest(root: Path) -> str:
    """sha256 over the source files a task installs from a workdir (names and contents)."""
    digest = hashlib.sha256()
    for package in ("orchestrator", "trainer", "task_templates"):
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                digest.update(path.relative_to(root).as_posix().encode() + b"\0")
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    digest.update(hashlib.sha256((root / "pyproject.toml").read_bytes()).digest())
    return digest.hexdigest()


def lock_for_launch(spec: Any, remote: bool) -> tuple[str | None, dict[str, Any]]:
    """(env/lock.txt, env/lock.json) for a new run."""
    from trainer.envlock import header

    if remote:
        text, source = task_lock(spec), lock_source(spec)
    else:
        text, source = local_lock(), "installed"
    info: dict[str, Any] = {"source": source, "written_at": time.time(), "ftorch": ftorch_identity(remote)}
    if text is not None:
        info.update(sha256=hashlib.sha256(text.encode()).hexdigest(), target=header(text).get("target"))
    if spec.resources.image_id:
        info["image_id"] = spec.resources.image_id
    return text, info


def write_lock(store: Any, text: str | None, info: dict[str, Any]) -> None:
    if text is not None:
        store.write_bytes(LOCK, text.encode())
    store.write_json(INFO, info)


def read_lock(store: Any) -> tuple[str | None, dict[str, Any]]:
    """The run's lock and its info ((None, {}) for a run launched before locks)."""
    info = store.read_json_or_none(INFO)
    try:
        text = store.read_bytes(LOCK).decode() if store.exists(LOCK) else None
    except FileNotFoundError:
        text = None
    return text, info if isinstance(info, dict) else {}


def next_versions(store: Any, remote: bool, lock: str | None = None) -> dict[str, str | None] | None:
    """The versions the next attempt will run with: the run's lock for a cloud run (`lock`: the one a
    `resume --relock` is about to write; None when it has none: an image, an older run), the installed
    ones here for a local run."""
    from trainer.envlock import RECORDED, installed, parse

    if not remote:
        return installed()
    text = lock if lock is not None else read_lock(store)[0]
    if text is None:
        return None
    pins = parse(text)
    return {name: pins[name].version if name in pins else None for name in RECORDED}


def version_changes(
    store: Any, remote: bool, newest: tuple[int, dict[str, Any]] | None, lock: str | None = None
) -> list[Any]:
    """The COMPARED versions that differ between the newest checkpoint and the next attempt."""
    from trainer.checkpoints.versions import compared_changes

    now = next_versions(store, remote, lock) if newest else None
    if not newest or now is None:
        return []
    return compared_changes(newest[1], now, newest[0])


def describe(text: str | None, info: Mapping[str, Any]) -> str:
    """`ftorch env JOB`: where the lock came from, the ftorch, then the pins."""
    lines = [f"source: {info.get('source', 'unknown (launched before environment locks)')}"]
    for key in ("target", "image_id", "sha256"):
        if info.get(key):
            lines.append(f"{key}: {info[key]}")
    ftorch = info.get("ftorch") or {}
    if ftorch:
        lines.append("ftorch: " + " ".join(f"{k}={v}" for k, v in ftorch.items()))
    if text is not None:
        from trainer.envlock import parse

        pins = parse(text)
        lines.append(f"pins ({len(pins)}):")
        lines += [f"  {p.name}=={p.version}" for p in pins.values()]
    return "\n".join(lines)

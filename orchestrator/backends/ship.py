"""The ftorch a cloud task installs: exactly the code this CLI runs, never a version from a package index.

- From a source tree (a checkout, editable or on PYTHONPATH): the tree is synced as SkyPilot's workdir and
  installed from there (`pip install ".[extras]"`), uncommitted changes included.
- From an installed wheel: the installed distribution is packed back into a wheel (its files as listed in
  its RECORD, a fresh RECORD with their hashes), cached under $FTORCH_HOME/wheels/<content hash>/, shipped
  with the task through `file_mounts` and installed from that file.

`FTORCH_PIP_SPEC` overrides both (e.g. a wheel in a bucket the instances can read).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.home import private_dir

#: where a shipped wheel lands on the instance (SkyPilot copies file_mounts before setup runs)
REMOTE_DIR = "/tmp/ftorch-dist"
#: written by pip at install time; not part of the package
INSTALL_ONLY = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed zip timestamps: the same files make the same wheel


@dataclass
class Install:
    """How the task gets ftorch: a pip spec, plus a workdir or file mounts that carry the code."""

    pip_spec: str
    workdir: str | None = None
    file_mounts: dict[str, str] = field(default_factory=dict)


def source_root() -> Path | None:
    """The ftorch source tree this CLI runs from, if any."""
    root = Path(__file__).resolve().parents[2]  # orchestrator/backends/ship.py -> the repository
    pyproject = root / "pyproject.toml"
    if pyproject.exists() and 'name = "ftorch"' in pyproject.read_text(encoding="utf-8"):
        return root
    return None


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def installed_files() -> tuple[str, str, dict[str, bytes]]:
    """(name, version, {path in the wheel: bytes}) of the installed ftorch that this code belongs to."""
    from importlib import metadata

    try:
        dist = metadata.distribution("ftorch")
    except metadata.PackageNotFoundError:
        raise UserError(
            "ftorch is neither a source tree nor an installed package here; install it "
            "(pip install ftorch-*.whl) or set FTORCH_PIP_SPEC"
        ) from None
    here = Path(__file__).resolve()
    files: dict[str, bytes] = {}
    found_self = False
    for item in dist.files or []:
        rel = item.as_posix()
        parts = rel.split("/")
        if parts[0] == ".." or "__pycache__" in parts or rel.endswith((".pyc", ".pyo")):
            continue  # console scripts (pip makes them again) and bytecode
        if parts[0].endswith(".dist-info") and parts[-1] in INSTALL_ONLY:
            continue
        path = Path(item.locate()).resolve()
        found_self = found_self or path == here
        files[rel] = path.read_bytes()
    if not found_self:
        raise UserError(
            f"the installed ftorch {dist.version} is not the code running ({here}); "
            "reinstall it or set FTORCH_PIP_SPEC"
        )
    return dist.metadata["Name"], dist.version, files


def pack_wheel(name: str, version: str, files: Mapping[str, bytes], dest: Path) -> Path:
    """A wheel (py3-none-any) holding `files`, with a RECORD; written atomically into `dest`."""
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    wheel_name = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    buffer = io.BytesIO()
    record = []
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel in sorted(files):
            info = zipfile.ZipInfo(rel, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, files[rel])
            record.append(f"{rel},{_record_hash(files[rel])},{len(files[rel])}")
        record.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=_EPOCH)
        info.external_attr = 0o644 << 16
        zf.writestr(info, "\n".join(record) + "\n")
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = dest / wheel_name
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, path)
    return path


def installed_wheel(cache: Path | None = None) -> Path:
    """The installed ftorch as a wheel, built once per content (cached by hash)."""
    name, version, files = installed_files()
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(rel.encode() + b"\0" + hashlib.sha256(files[rel]).digest())
    dest = (cache or private_dir("wheels")) / digest.hexdigest()[:16]
    existing = sorted(dest.glob("*.whl")) if dest.exists() else []
    return existing[0] if existing else pack_wheel(name, version, files, dest)


def install_for_task(extras: list[str], environ: Mapping[str, str] | None = None) -> Install:
    """What the task installs: FTORCH_PIP_SPEC, else the source tree (workdir), else the installed wheel."""
    environ = os.environ if environ is None else environ
    suffix = f"[{','.join(extras)}]" if extras else ""
    if environ.get("FTORCH_PIP_SPEC"):
        return Install(environ["FTORCH_PIP_SPEC"])
    root = source_root()
    if root is not None:
        return Install(f".{suffix}", workdir=str(root))
    wheel = installed_wheel()
    remote = f"{REMOTE_DIR}/{wheel.name}"
    return Install(f"{remote}{suffix}", file_mounts={remote: str(wheel)})

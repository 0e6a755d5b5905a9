"""The run's environment: the library versions an attempt runs with, the lock a cloud task installs, and
the checks that they agree (docs/environment.md).

- `installed()`: the versions of RECORDED as this interpreter sees them (package metadata; no import),
  written into every attempt's epoch record and every checkpoint's manifest meta (META_KEY).
- A lock is pip's requirements format with exact pins only: `name==version [--hash=sha256:...]`, and
  `# key: value` header lines (the target it was resolved for). `parse()` refuses anything else, so no
  open range can reach pip through it.
- `python -m trainer.envlock check LOCK`: the task's setup runs it after installing the lock; an
  installed version that differs from its pin exits ENV_MISMATCH with one line naming the package.
  The task runs it as `python -m trainer.runstore.env_refusal LOCK RUN_URI`, which records the refusal
  in the run store instead of exiting (trainer/runstore/env_refusal.py).
- At the trainer's start a resume whose COMPARED versions differ from the newest checkpoint's is refused
  like a fingerprint change (trainer/checkpoints/versions.py: exit 2, one line, both versions), unless
  `ftorch resume --allow-change` recorded the change in spec.json.

No torch here: the orchestrator and the setup step use it before (or without) torch.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata

from trainer import exitcodes

#: the libraries whose version decides the math of a step: a resume under another version is refused
COMPARED = (
    "torch", "transformers", "peft", "accelerate", "bitsandbytes", "datasets", "tokenizers", "numpy",
)  # fmt: skip
#: recorded with every attempt and checkpoint (COMPARED, the storage libraries, ftorch itself)
RECORDED = (*COMPARED, "safetensors", "huggingface-hub", "fsspec", "s3fs", "gcsfs", "ftorch")
#: the key in a checkpoint manifest's meta and in an epoch record
META_KEY = "versions"
#: a change of a library's version, as a fingerprint Change names it ("env.transformers")
FIELD_PREFIX = "env."
#: the installed environment is not the lock (the setup's exit; not in the task's recover_on_exit_codes)
ENV_MISMATCH = exitcodes.ENV_MISMATCH
_PIN = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)((?:\s+--hash=sha256:[0-9a-f]{64})*)$"
)


class LockError(ValueError):
    """A lock line that is not an exact pin (or a duplicate)."""


@dataclass(frozen=True)
class Pin:
    name: str  # normalised (PEP 503)
    version: str
    hashes: tuple[str, ...] = ()

    def line(self) -> str:
        return " ".join([f"{self.name}=={self.version}", *(f"--hash=sha256:{h}" for h in self.hashes)])


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(text: str, where: str = "lock") -> dict[str, Pin]:
    """The pins of a lock, by normalised name. LockError names the line of anything not `name==version`."""
    pins: dict[str, Pin] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        if match is None:
            raise LockError(
                f"{where}:{number}: {line[:80]!r} is not an exact pin (name==version [--hash=sha256:...])"
            )
        name = normalise(match.group(1))
        if name in pins:
            raise LockError(f"{where}:{number}: {name} is pinned twice")
        hashes = tuple(re.findall(r"sha256:([0-9a-f]{64})", match.group(3)))
        pins[name] = Pin(name, match.group(2), hashes)
    return pins


def header(text: str) -> dict[str, str]:
    """The lock's `# key: value` lines (target, python, platform, cuda, built_by)."""
    found = {}
    for raw in text.splitlines():
        if raw.startswith("# ") and ":" in raw:
            key, _, value = raw[2:].partition(":")
            if key.strip().isidentifier():
                found[key.strip()] = value.strip()
    return found


def version_of(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed(names: tuple[str, ...] = RECORDED) -> dict[str, str | None]:
    """name -> installed version (None: not installed), as pip would see it here."""
    return {name: version_of(name) for name in names}


def mismatches(pins: Mapping[str, Pin], lookup: Callable[[str], str | None] = version_of) -> list[str]:
    """One line per pinned package whose installed version differs (or that is missing)."""
    found = []
    for pin in pins.values():
        have = lookup(pin.name)
        if have != pin.version:
            now = "not installed" if have is None else f"{have} is installed"
            found.append(f"{pin.name}: the run's lock pins {pin.version}, {now}")
    return found


def refusal(path: str) -> str | None:
    """`check LOCK`'s one line when this environment is not the lock (None when it is)."""
    try:
        with open(path, encoding="utf-8") as handle:
            pins = parse(handle.read(), path)
    except (OSError, LockError) as exc:
        return f"ftorch: environment: {exc}"
    found = mismatches(pins)
    if not found:
        return None
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"ftorch: environment: {found[0]}{more}; refusing to start ({ADVICE_ENV})"


def matched(path: str) -> str:
    """The line a check that passed prints."""
    with open(path, encoding="utf-8") as handle:
        count = len(parse(handle.read(), path))
    return f"ftorch: environment matches the run's lock ({count} packages)"


def _check(path: str) -> int:
    """`check LOCK`: every pin installed at its version, else one line and ENV_MISMATCH."""
    line = refusal(path)
    if line is None:
        sys.stdout.write(matched(path) + "\n")
        return 0
    sys.stderr.write(line + "\n")
    return ENV_MISMATCH


ADVICE_ENV = "the attempt would not run the run's versions; see docs/environment.md"


def main(argv: list[str] | None = None) -> int:
    """`check LOCK` (exit 0 or ENV_MISMATCH) or `versions` (this interpreter's RECORDED versions, JSON)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "check":
        return _check(args[1])
    if args == ["versions"]:
        sys.stdout.write(json.dumps(installed(), sort_keys=True) + "\n")
        return 0
    sys.stderr.write("usage: python -m trainer.envlock check LOCK | versions\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())

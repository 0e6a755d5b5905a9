"""Resolve the environment lock a cloud task installs, for a target platform, without a GPU.

    python scripts/build_lock.py                       # orchestrator/data/locks/cu130-py311.txt
    python scripts/build_lock.py --find-links DIR --no-index --platform any --out lock.txt  # offline

pip resolves ftorch's dependencies (pyproject.toml: the base list, every extra a task may need) plus
EXTRA_ROOTS as if installing on the target (`--platform`, `--python-version`, `--only-binary=:all:`,
`--ignore-installed`, `--dry-run --report`): nothing is installed here and no GPU is needed. The report
names each distribution pip picked and its wheel's sha256; the lock pins them all
(`name==version --hash=sha256:...`). Limitation: pip evaluates environment markers with the running
interpreter, so run this with the target's Python minor version (the script refuses another one).
The tested set (scripts/constraints-tested.txt: the versions the test suite runs of the libraries a resume
compares) is passed to pip as constraints, so the lock names what was tested; `--untested` leaves it out.
A lock changes only when someone runs this and commits the result (docs/environment.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "orchestrator" / "data" / "locks"
#: the extras a cloud task may need (trackers included: one lock serves every job)
EXTRAS = ("s3", "gcs", "qlora", "tensorboard", "wandb")
#: packages outside ftorch's requirements that a task installs: ftorch's build backend (the task installs
#: ftorch with --no-build-isolation), adlfs for az:// stores, einops for flash-attn
EXTRA_ROOTS = ("setuptools>=68", "wheel", "adlfs>=2024.2", "einops>=0.8")
#: glibc 2.28 (Ubuntu 20.04+, the CUDA images) and every older manylinux tag
PLATFORMS = tuple(f"manylinux_2_{minor}_x86_64" for minor in range(28, 16, -1)) + (
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
DEFAULT_TARGET = "cu130-py311"
#: the versions the suite runs of the compared libraries (scripts/setup.sh installs the suite with them)
TESTED = REPO / "scripts" / "constraints-tested.txt"


def roots(pyproject: Path = REPO / "pyproject.toml", extras: tuple[str, ...] = EXTRAS) -> list[str]:
    """ftorch's requirements (base and `extras`) as pyproject.toml states them, plus EXTRA_ROOTS."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    found = list(project["dependencies"])
    for extra in extras:
        found += project["optional-dependencies"][extra]
    return list(dict.fromkeys([*found, *EXTRA_ROOTS]))


def pip_command(
    requirements: list[str], python: str, platforms: tuple[str, ...], report: Path, pip_args: list[str]
) -> list[str]:
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed"]
    command += ["--report", str(report), "--python-version", python, "--only-binary=:all:"]
    for platform in platforms:
        if platform != "any":
            command += ["--platform", platform]
    return [*command, *pip_args, *requirements]


def lock_lines(report: dict) -> list[str]:
    """`name==version --hash=sha256:...` for every distribution in pip's installation report, by name."""
    from trainer.envlock import Pin, normalise

    pins = []
    for item in report["install"]:
        meta = item["metadata"]
        hashes = (item.get("download_info", {}).get("archive_info", {}).get("hashes") or {}).get("sha256")
        pins.append(Pin(normalise(meta["name"]), meta["version"], (hashes,) if hashes else ()))
    return [p.line() for p in sorted(pins, key=lambda p: p.name)]


def cuda_of(lines: list[str]) -> str:
    """The CUDA runtime the pinned torch wheel brings (its nvidia-cuda-runtime pin), or "none"."""
    for line in lines:
        name, _, rest = line.partition("==")
        if name.startswith("nvidia-cuda-runtime"):
            return ".".join(rest.split()[0].split(".")[:2])
    return "none"


def tested_set(path: Path = TESTED) -> dict[str, str]:
    """name -> version of the tested set (its `name==version` lines)."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            found[name.strip().lower()] = version.strip()
    return found


def header(
    target: str,
    python: str,
    platforms: tuple[str, ...],
    requirements: list[str],
    pins: list[str],
    tested: bool = True,
) -> list[str]:
    return [
        "# ftorch environment lock: the exact versions a cloud task installs, with no resolution",
        "# made by scripts/build_lock.py; change it only by running that again (docs/environment.md)",
        f"# target: {target}",
        f"# python: {python}",
        f"# platform: {platforms[0]}",
        f"# cuda: {cuda_of(pins)}",
        f"# built_at: {time.strftime('%Y-%m-%d', time.gmtime())}",
        f"# roots: {' '.join(r.replace(' ', '') for r in requirements)}",
        f"# tested_set: {TESTED.relative_to(REPO) if tested else 'none (--untested)'}",
    ]


def build(
    requirements: list[str],
    target: str,
    python: str,
    platforms: tuple[str, ...],
    pip_args: list[str],
    tested: bool = True,
) -> str:
    """The lock's text (header, then the sorted pins)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        done = subprocess.run(
            pip_command(requirements, python, platforms, report, pip_args), capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(
                f"pip could not resolve the lock: {(done.stderr or done.stdout).strip()[-2000:]}"
            )
        pins = lock_lines(json.loads(report.read_text(encoding="utf-8")))
    return "\n".join([*header(target, python, platforms, requirements, pins, tested), *pins]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--target", default=DEFAULT_TARGET, help="the lock's name (orchestrator/data/locks/NAME.txt)"
    )
    parser.add_argument("--python", default="3.11", help="the target's Python (major.minor)")
    parser.add_argument("--platform", action="append", help="wheel platform tags (default: manylinux x86_64)")
    parser.add_argument("--requirement", action="append", help="resolve these instead of ftorch's roots")
    parser.add_argument(
        "--out", type=Path, help="where to write (default: orchestrator/data/locks/TARGET.txt)"
    )
    parser.add_argument(
        "--untested", action="store_true", help="resolve without the tested set's constraints"
    )
    args, pip_args = parser.parse_known_args(argv)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if args.python != here:
        sys.stderr.write(
            f"--python: {args.python} needs a Python {args.python} interpreter to run this (pip evaluates "
            f"environment markers with the running one, {here})\n"
        )
        return 2
    platforms = tuple(args.platform or PLATFORMS)
    requirements = args.requirement or roots()
    if not args.untested:
        pip_args = ["--constraint", str(TESTED), *pip_args]
    text = build(requirements, args.target, args.python, platforms, pip_args, tested=not args.untested)
    out = args.out or LOCKS / f"{args.target}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    sys.stdout.write(f"{out}: {sum(1 for line in text.splitlines() if '==' in line)} pins\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())

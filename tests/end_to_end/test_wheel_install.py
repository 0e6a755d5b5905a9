"""A user's install: the built wheel in a fresh virtual environment outside the repository.

The environment gets only the wheel (pip, no dependencies resolved); the dependencies come from the test
venv's site-packages through a plain path entry (no .pth of that folder runs, so its editable ftorch does
not load). From a folder outside the repository it runs `ftorch --version`, a short quickstart with one
preemption, and a SkyPilot dry run whose task ships this same ftorch as a wheel.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

SOURCES = ("pyproject.toml", "README.md", "orchestrator", "trainer", "task_templates")
PIP = [sys.executable, "-m", "pip"]
OFFLINE = ["--quiet", "--no-deps", "--no-index"]


def _build_wheel(tmp: Path) -> Path:
    src = tmp / "src"  # a copy: the build writes build/ and *.egg-info next to the sources
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, src / name)
    built = subprocess.run(
        [*PIP, "wheel", *OFFLINE, "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp / "dist").glob("ftorch-*.whl")
    return wheel


def _venv_with(wheel: Path, tmp: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [*PIP, "--python", str(python), "install", *OFFLINE, str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    # the dependencies (torch, transformers, ...) from this venv, added after the fresh site-packages
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist() if not n.endswith("/RECORD")}


def _plots_from_the_wheel(wheel: Path, run: Any, ftorch: str, job_id: str, user: Path) -> None:
    """The quickstart's environment can plot: the wheel declares the `plot` extra (matplotlib, which
    `scripts/setup.sh s3,plot` installs; here it comes with the test venv's dependencies, pip being
    offline), and `ftorch status JOB --plot` from the wheel writes a PNG of the finished run."""
    metadata = next(v.decode() for n, v in _files(wheel).items() if n.endswith(".dist-info/METADATA"))
    assert "Provides-Extra: plot" in metadata.splitlines(), metadata[:2000]
    assert any(
        line.startswith("Requires-Dist: matplotlib") and 'extra == "plot"' in line
        for line in metadata.splitlines()
    ), metadata[:2000]
    plotted = run(ftorch, "status", job_id, "--plot", "loss.png")
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    png = (user / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR", png[:32]
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 400 and height >= 200 and len(png) > 10_000, (width, height, len(png))


@pytest.mark.timeout(240)
def test_built_wheel_installs_runs_the_quickstart_and_ships_itself(
    tmp_path: Path, quickstart_dir: Path
) -> None:
    wheel = _build_wheel(tmp_path)
    names = set(_files(wheel))
    assert {"task_templates/node.yaml", "orchestrator/data/shapes.json", "trainer/__main__.py"} <= names
    venv = _venv_with(wheel, tmp_path)
    user = tmp_path / "user"  # a folder of the user's, outside the repository
    user.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(FTORCH_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1", PYTHONNOUSERSITE="1")

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=user, env=env, capture_output=True, text=True, timeout=timeout)

    where = run(
        str(venv / "bin" / "python"),
        "-c",
        "import orchestrator, trainer, task_templates, sys; "
        "print(orchestrator.__file__, trainer.__file__, task_templates.__file__, str(sys.path))",
    )
    assert where.returncode == 0, where.stderr
    *module_files, path_repr = where.stdout.split(" ", 3)
    assert all(f.startswith(str(venv)) for f in module_files), where.stdout  # ftorch from the wheel
    # nothing of the checkout on the path, except the test dependencies' folder (which may lie inside it)
    dependencies = sysconfig.get_paths()["purelib"]
    on_path = [p for p in ast.literal_eval(path_repr) if p and p != dependencies]
    assert not [p for p in on_path if p.startswith(str(REPO))], on_path

    ftorch = str(venv / "bin" / "ftorch")
    version = run(ftorch, "--version")
    assert version.returncode == 0 and version.stdout.strip() == "ftorch 0.1.0", version

    # the quickstart, shortened (10 steps, no simulated preemption: test_quickstart.py has those), from the
    # user's folder: the CLI, the supervisor and the trainer all run from the wheel
    shutil.copy(quickstart_dir / "quickstart.yaml", user / "quickstart.yaml")
    (user / "quickstart").symlink_to(quickstart_dir / "quickstart")
    quick = run(
        ftorch,
        "launch",
        "quickstart.yaml",
        "--follow",
        "--set",
        "train.max_steps=10",
        "--set",
        "local.threads=1",
        "--set",
        "local.chaos=null",
        timeout=180,
    )
    assert quick.returncode == 0, quick.stdout[-3000:] + quick.stderr[-2000:]
    assert "trained adapter:" in quick.stdout
    job_id = quick.stdout.splitlines()[0].strip()
    status = json.loads(run(ftorch, "status", job_id, "--json").stdout)
    assert status["state"] == "SUCCEEDED" and status["attempts"] == 1
    assert (Path(status["output_uri"]) / "adapter_model.safetensors").exists()
    _plots_from_the_wheel(wheel, run, ftorch, job_id, user)

    # a SkyPilot dry run: the task installs this ftorch from the wheel it carries, not from an index
    example = str(REPO / "examples/mistral-7b-lora.yaml")
    dry = run(ftorch, "launch", example, "--backend", "skypilot", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr[-2000:]
    task = json.loads(dry.stdout)["task"]
    assert "workdir" not in task
    ((remote, local),) = task["file_mounts"].items()
    assert remote == f"/tmp/ftorch-dist/{wheel.name}"
    assert task["envs"]["FTORCH_PIP_SPEC"] == f"{remote}[s3,gcs]"
    assert "==" not in task["envs"]["FTORCH_PIP_SPEC"] and '"${FTORCH_PIP_SPEC}"' in task["setup"]
    assert _files(Path(local)) == _files(wheel)  # the very same files as the wheel the user installed
    target = tmp_path / "instance"  # what the task's setup does with it, without the dependencies
    check = subprocess.run(
        [*PIP, "install", *OFFLINE, "--target", str(target), local],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr[-2000:]
    assert (target / "task_templates" / "node.yaml").exists()
    assert (target / "trainer" / "__main__.py").exists()

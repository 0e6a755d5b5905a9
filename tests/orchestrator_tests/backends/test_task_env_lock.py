"""The environment lock a SkyPilot task installs (orchestrator/jobfile/envlock.py, trainer/envlock.py,
scripts/build_lock.py): the rendered task carries every pin and no open range reaches pip; the shipped
lock is exact, hashed and satisfies pyproject's ranges; the lock is resolved for a target platform (here
offline, from a local find-links folder); the setup refuses an environment that is not the lock."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, ftorch
from packaging.requirements import Requirement

from orchestrator.backends.skypilot import render_job
from orchestrator.jobfile.spec import load_job
from trainer import envlock

EXAMPLE = REPO / "examples/llama3-8b-chat-qlora.yaml"
sys.path.insert(0, str(REPO / "scripts"))
import build_lock  # noqa: E402


def _expand(text: str, envs: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)(:-[^}]*)?\}", lambda m: envs.get(m.group(1), ""), text)


def _pip_installs(task: dict[str, Any]) -> list[list[str]]:
    """Every `pip install` of the task's setup, as argv after `install`, with the task's envs filled in."""
    found = []
    for line in task["setup"].splitlines():
        if "pip install" not in line:
            continue
        command = line.split("; then ", 1)[-1].removesuffix("; fi")
        argv = shlex.split(_expand(command, task["envs"]))
        found.append(argv[argv.index("install") + 1 :])
    return found


def _heredoc_lock(task: dict[str, Any]) -> str:
    match = re.search(r"<<'FTORCH_LOCK_EOF'\n(.*?)FTORCH_LOCK_EOF\n", task["setup"], re.S)
    assert match, task["setup"][:500]
    return match.group(1)


def assert_only_pins_reach_pip(task: dict[str, Any]) -> dict[str, envlock.Pin]:
    """No pip install in the setup can resolve anything: --no-deps everywhere; its arguments are the lock
    (exact pins only), a local path (ftorch itself) or an exact pin."""
    installs = _pip_installs(task)
    assert len(installs) >= 2, task["setup"]
    pins = envlock.parse(_heredoc_lock(task))  # LockError on any line that is not name==version
    for argv in installs:
        assert "--no-deps" in argv and "--upgrade" not in argv and "-U" not in argv, argv
        args = iter(argv)
        for token in args:
            if token == "-r":
                assert next(args) == task["envs"]["FTORCH_LOCK"]
            elif not token.startswith("-"):
                local = token.startswith((".", "/"))
                assert local or re.fullmatch(r"[\w.-]+==[\w.+!-]+", token), f"{token!r} is an open range"
    return pins


def test_dry_run_json_names_every_pin_and_no_open_range_reaches_pip(ftorch_home: Path) -> None:
    done = ftorch("launch", str(EXAMPLE), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    task = json.loads(done.stdout)["task"]
    pins = assert_only_pins_reach_pip(task)
    shipped = envlock.parse(build_lock.LOCKS.joinpath(f"{build_lock.DEFAULT_TARGET}.txt").read_text())
    assert pins == shipped  # the task carries the shipped lock, hashes included
    for name in ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "datasets", "safetensors"):
        assert f"\n{name}=={shipped[name].version} --hash=sha256:" in task["setup"]
    assert task["envs"]["FTORCH_LOCK_PYTHON"] == "3.11"
    assert (
        "python -m trainer.runstore.env_refusal" in task["setup"]
    )  # then the installed versions are checked
    assert envlock.ENV_MISMATCH not in task["resources"]["job_recovery"]["recover_on_exit_codes"]


@pytest.mark.parametrize(
    "overrides",
    [
        ["resources.gpus=2"],  # the one-node template
        ["resources.nodes=2"],  # the multi-node template
        ["train.attn_implementation=flash_attention_2"],  # flash-attn, outside the lock: pinned
        ["checkpoint.uri=az://container/ftorch"],  # adlfs: in the lock
    ],
)
def test_every_template_and_extra_installs_pins_only(overrides: list[str]) -> None:
    spec = load_job(EXAMPLE, overrides, check_support=False)
    _plan, task = render_job(spec, "j", f"{spec.checkpoint.uri}/j", environ={})
    pins = assert_only_pins_reach_pip(task)
    assert "adlfs" in pins and "einops" in pins


def test_an_image_must_be_pinned_by_digest_and_then_replaces_the_lock(ftorch_home: Path) -> None:
    tagged = ftorch(
        "launch", str(EXAMPLE), "--dry-run", "--set", "resources.image_id=docker:pytorch/pytorch:latest"
    )
    assert tagged.returncode == 2 and tagged.stdout == ""
    assert tagged.stderr.startswith("error: resources.image_id: docker:pytorch/pytorch:latest is a tag")
    assert len(tagged.stderr.strip().splitlines()) == 1
    image = "docker:pytorch/pytorch@sha256:" + "0" * 64
    done = ftorch("launch", str(EXAMPLE), "--dry-run", "--json", "--set", f"resources.image_id={image}")
    assert done.returncode == 0, done.stderr
    task = json.loads(done.stdout)["task"]
    assert task["resources"]["image_id"] == image
    assert "FTORCH_LOCK_EOF" not in task["setup"] and task["envs"]["FTORCH_LOCK"] == ""
    installs = [a for a in _pip_installs(task) if "-r" not in a and any(not t.startswith("-") for t in a)]
    assert installs == [["--quiet", "--no-deps", "--no-build-isolation", task["envs"]["FTORCH_PIP_SPEC"]]]


def test_the_shipped_lock_is_exact_hashed_and_satisfies_pyproject() -> None:
    text = build_lock.LOCKS.joinpath(f"{build_lock.DEFAULT_TARGET}.txt").read_text()
    pins = envlock.parse(text)
    head = envlock.header(text)
    assert head["target"] == build_lock.DEFAULT_TARGET and head["python"] == "3.11" and head["cuda"] == "13.0"
    assert all(len(p.hashes) == 1 for p in pins.values())  # one wheel per pin: the target's
    for root in build_lock.roots():  # what pyproject.toml asks for, every extra a task may need
        req = Requirement(root)
        pin = pins[envlock.normalise(req.name)]
        assert req.specifier.contains(pin.version, prereleases=True), (root, pin.version)
    assert any(n.startswith("nvidia-cuda-runtime") for n in pins)  # a CUDA build of torch, not the CPU one


def test_the_shipped_lock_pins_the_tested_set_which_is_what_this_suite_runs() -> None:
    """One source of truth for the versions: the tested set names every library a resume compares (and
    the pins that keep SkyPilot's click<8.2 free of conflicts); the shipped GPU lock pins exactly those
    versions; this suite's environment has them (the CPU build of the same torch release): a lock that
    moves on its own, or a suite run on other releases, fails here."""
    text = build_lock.LOCKS.joinpath(f"{build_lock.DEFAULT_TARGET}.txt").read_text()
    pins, tested = envlock.parse(text), build_lock.tested_set()
    assert envlock.header(text)["tested_set"] == "scripts/constraints-tested.txt"
    assert set(envlock.COMPARED) <= set(tested)
    for name, version in tested.items():
        installed = (envlock.version_of(name) or "not installed").split("+", 1)[
            0
        ]  # 2.13.0+cpu: the CPU build
        assert (pins[name].version, installed) == (version, version), name


def test_the_suites_environment_leaves_no_conflict_for_pip_to_report() -> None:
    """The tested set agrees with SkyPilot 0.14's click<8.2: the environment the suite runs in (the one
    route, scripts/setup.sh, with the skypilot extra) is one a user's install reaches, not one pip
    complains about."""
    import importlib.util

    assert importlib.util.find_spec("sky") is not None, "the skypilot extra is part of what is checked"
    check = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0, check.stdout + check.stderr


# ---- resolving for a target platform, offline ------------------------------------------------------
def _wheel(folder: Path, name: str, version: str, tag: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal wheel: METADATA (with its requirements), WHEEL, RECORD."""
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    wheel = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"
    path = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{info}/METADATA", meta)
        zf.writestr(f"{info}/WHEEL", wheel)
        zf.writestr(f"{info}/RECORD", "")
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build(tmp_path: Path, links: Path, *args: str) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "lock.txt"
    command = [
        sys.executable,
        str(REPO / "scripts/build_lock.py"),
        "--requirement",
        "alpha",
        "--out",
        str(out),
    ]
    return subprocess.run(
        [*command, "--target", "test-py311", *args, "--no-index", "--find-links", str(links)],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_lock_is_resolved_for_the_target_platform_offline(tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    alpha = _wheel(links, "alpha", "1.0", "py3-none-any", ("beta>=1", "numpy>=1"))
    numpy_tested = _wheel(links, "numpy", build_lock.tested_set()["numpy"], "py3-none-any")
    numpy_newer = _wheel(links, "numpy", "99.0", "py3-none-any")  # newer than the tested set's
    beta_linux = _wheel(links, "beta", "2.0", "cp311-cp311-manylinux_2_28_x86_64")
    beta_mac = _wheel(links, "beta", "3.0", "cp311-cp311-macosx_11_0_arm64")  # newer, another platform
    _wheel(links, "beta", "2.0", "cp311-cp311-macosx_11_0_arm64")

    done = _build(tmp_path, links)  # the default target: manylinux x86_64, whatever this machine is
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "lock.txt").read_text()
    tested = envlock.Pin("numpy", build_lock.tested_set()["numpy"], (_sha(numpy_tested),))
    assert envlock.parse(text) == {
        "alpha": envlock.Pin("alpha", "1.0", (_sha(alpha),)),
        "beta": envlock.Pin("beta", "2.0", (_sha(beta_linux),)),
        "numpy": tested,  # the tested set's version, not the newest
    }
    assert envlock.header(text)["python"] == "3.11" and envlock.header(text)["target"] == "test-py311"
    done = _build(tmp_path, links, "--untested")
    assert done.returncode == 0, done.stderr
    untested = (tmp_path / "lock.txt").read_text()
    assert envlock.parse(untested)["numpy"] == envlock.Pin("numpy", "99.0", (_sha(numpy_newer),))
    assert envlock.header(untested)["tested_set"] == "none (--untested)"

    done = _build(tmp_path, links, "--platform", "macosx_11_0_arm64")
    assert done.returncode == 0, done.stderr
    assert envlock.parse((tmp_path / "lock.txt").read_text())["beta"] == envlock.Pin(
        "beta", "3.0", (_sha(beta_mac),)
    )

    other = _build(tmp_path, links, "--python", "3.10")  # markers would be judged by this 3.11
    assert other.returncode == 2 and other.stderr.startswith("--python: 3.10 needs a Python 3.10")


# ---- the setup's refusals --------------------------------------------------------------------------
def test_the_check_refuses_a_version_that_is_not_the_locks_in_one_line(tmp_path: Path) -> None:
    lock = tmp_path / "lock.txt"
    have = envlock.version_of("transformers")
    lock.write_text(f"# python: 3.11\npyyaml=={envlock.version_of('pyyaml')}\ntransformers==4.56.0\n")
    done = subprocess.run(
        [sys.executable, "-m", "trainer.envlock", "check", str(lock)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == envlock.ENV_MISMATCH == 78
    assert done.stderr.strip().splitlines() == [
        f"ftorch: environment: transformers: the run's lock pins 4.56.0, {have} is installed; refusing to "
        f"start ({envlock.ADVICE_ENV})"
    ]
    lock.write_text("transformers>=4.56\n")  # a range is not a lock
    done = subprocess.run(
        [sys.executable, "-m", "trainer.envlock", "check", str(lock)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 78 and "is not an exact pin" in done.stderr
    lock.write_text(f"transformers=={have}\n")
    done = subprocess.run(
        [sys.executable, "-m", "trainer.envlock", "check", str(lock)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0 and "matches the run's lock (1 packages)" in done.stdout


def test_the_setup_refuses_a_python_the_lock_was_not_made_for(tmp_path: Path) -> None:
    spec = load_job(EXAMPLE, check_support=False)
    _plan, task = render_job(spec, "j", "gs://b/j", environ={})
    envs = {**task["envs"], "FTORCH_LOCK": str(tmp_path / "env" / "lock.txt"), "FTORCH_LOCK_PYTHON": "3.99"}
    done = subprocess.run(
        ["bash", "-c", task["setup"]],
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", **envs},
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 78, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"ftorch: environment: python: the run's lock is for Python 3.99, this machine has "
        f"{sys.version_info.major}.{sys.version_info.minor}; refusing to start (docs/environment.md)"
    ]
    assert envlock.parse((tmp_path / "env" / "lock.txt").read_text()) == envlock.parse(_heredoc_lock(task))

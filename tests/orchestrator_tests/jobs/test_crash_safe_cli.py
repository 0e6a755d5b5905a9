"""`attach` and `export` are crash-safe (issue 30, R3 R4): a kill inside either leaves nothing or the
previous state, and running the command again completes it, with nothing left behind."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers import ftorch
from support.adopted import Runs, copy_store, make_runs, same_adapter

from orchestrator.registry import Registry
from trainer.outputs.export import MARKER
from trainer.runstore.scratch import QUIET_S

DEFAULT = Path("exports") / "step-00000010"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Runs:
    return make_runs(tmp_path_factory.mktemp("crash-cli-runs"), tiny_model)


def _leftovers(folder: Path) -> list[str]:
    return sorted(
        str(p)
        for p in folder.rglob("*")
        if ".tmp-" in p.name or ".ftorch-export-" in p.name or "replaced" in p.name
    )


def test_a_kill_inside_attach_registers_nothing_and_attach_again_completes(
    runs: Runs, tmp_path: Path, ftorch_home: Path
) -> None:
    """R3: a SUCCEEDED run killed part way through its registration is not left FAILED ("supervisor
    (pid None) is gone") nor "already registered": it is not there, and the next attach registers it."""
    store = copy_store(runs.clean, tmp_path / "bucket" / runs.run_id)
    killed = ftorch("attach", str(store), env={"FTORCH_FAULTS": "attach@1"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert Registry().jobs() == []
    assert "no job" in ftorch("status", runs.run_id).stderr
    again = ftorch("attach", str(store))
    assert again.returncode == 0 and f"{runs.run_id} attached" in again.stdout, again.stderr
    detail = json.loads(ftorch("status", runs.run_id, "--json").stdout)
    assert detail["state"] == "SUCCEEDED" and detail["attempts"] == 1, detail


def test_a_killed_export_leaves_nothing_and_a_rerun_completes(
    runs: Runs, tmp_path: Path, ftorch_home: Path
) -> None:
    """R4: killed with the export staged: no folder that looks like an adapter; the re-run into the same
    default folder completes (tokenizer and marker there, the same adapter bytes); a kill while an earlier
    export is swapped out is undone by the next run; nothing `.tmp-*` or staged is left."""
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id)
    assert ftorch("attach", str(store)).returncode == 0
    reference = ftorch("export", runs.run_id, "--to", str(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr
    killed = ftorch("export", runs.run_id, env={"FTORCH_FAULTS": "export@2"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert not (store / DEFAULT).exists()
    again = ftorch("export", runs.run_id)
    assert again.returncode == 0, again.stderr
    assert (store / DEFAULT / MARKER).exists() and (store / DEFAULT / "tokenizer_config.json").exists()
    assert same_adapter(store / DEFAULT, tmp_path / "reference")
    swapped = ftorch("export", runs.run_id, env={"FTORCH_FAULTS": "export@3"})  # between the two renames
    assert swapped.returncode == -9
    assert ftorch("export", runs.run_id).returncode == 0
    assert same_adapter(store / DEFAULT, tmp_path / "reference") and (store / DEFAULT / MARKER).exists()
    assert _leftovers(store) == []
    modes = {oct(p.stat().st_mode & 0o777) for p in (store / DEFAULT).rglob("*")}
    assert modes <= {"0o600", "0o700"}, modes


def test_a_killed_export_with_force_is_completed_beside_the_users_files(
    runs: Runs, tmp_path: Path, ftorch_home: Path
) -> None:
    """R4: --force into a folder with the user's files, killed part way: a re-run (with --force, or
    without: the pending marker says it is an export) completes; the user's file stays; no `.tmp-*`."""
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id)
    assert ftorch("attach", str(store)).returncode == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    scratch = tmp_path / "tmp"  # the system's temp folder for both runs: the export is written there first
    scratch.mkdir()
    env = {"TMPDIR": str(scratch)}
    killed = ftorch(
        "export", runs.run_id, "--to", str(mine), "--force", env={**env, "FTORCH_FAULTS": "export@12"}
    )
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert json.loads((mine / MARKER).read_text()).get("pending") is True
    (left,) = scratch.glob("ftorch-export-*")  # a SIGKILL skips every cleanup: the next export sweeps it,
    then = time.time() - QUIET_S - 60  # once nothing in it has changed for QUIET_S (as if killed long ago)
    for path in [*left.rglob("*"), left]:
        os.utime(path, (then, then))
    (mine / "adapter_model.safetensors.tmp-0123abcd").write_bytes(b"half")  # a kill inside a write
    again = ftorch("export", runs.run_id, "--to", str(mine), "--force", env=env)
    assert again.returncode == 0, again.stderr
    assert not left.exists() and list(scratch.iterdir()) == []
    assert (mine / "notes.txt").read_text() == "the user's"
    assert "pending" not in json.loads((mine / MARKER).read_text())
    assert (mine / "adapter_model.safetensors").exists() and _leftovers(mine) == []

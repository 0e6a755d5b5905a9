"""Soak of adopted runs (issue 30): 10 kills spread over `attach`, `resume` and `export` of a copied, a
moved and a twice-copied run store, each adopted on its own machine (FTORCH_HOME). Every final adapter
is bitwise the clean run's, every export bitwise the clean run's export of the same step, and every
output is in the store it belongs to (the original of a copy is left exactly as it was)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import ftorch
from support.adopted import copy_store, make_runs, same_adapter

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _ended(run_id: str, env: dict[str, str], timeout: float = 300.0) -> dict:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        detail = json.loads(ftorch("status", run_id, "--json", env=env).stdout)
        if detail["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "STOPPED"):
            return detail
        time.sleep(0.5)
    raise AssertionError(f"{run_id} did not end")


def test_ten_kills_over_attach_resume_and_export_of_moved_and_copied_stores(
    tmp_path: Path, tiny_model: Path
) -> None:
    from trainer.outputs.export import export

    (tmp_path / "made").mkdir()
    runs = make_runs(tmp_path / "made", tiny_model)
    rid = runs.run_id
    original = copy_store(runs.crashed, tmp_path / "original" / rid)
    copied = copy_store(original, tmp_path / "copy" / rid, output_uri=str(original / "output"))
    moved = copy_store(original, tmp_path / "moved-from" / rid)
    first_copy = copy_store(original, tmp_path / "c1" / rid, output_uri=str(original / "output"))
    twice = copy_store(first_copy, tmp_path / "c2" / rid, output_uri=str(first_copy / "output"))
    new_place = tmp_path / "moved-to" / rid
    new_place.parent.mkdir()
    shutil.move(str(moved), new_place)
    moved = new_place
    untouched = {p: _snapshot(p) for p in (original, first_copy)}
    kills = 0
    stores = {"copied": copied, "moved": moved, "twice": twice}
    homes = {name: {"FTORCH_HOME": str(tmp_path / f"home-{name}")} for name in stores}

    for name, store in stores.items():  # kills 1-3: inside attach; the next attach completes it
        env = homes[name]
        killed = ftorch("attach", str(store), env={**env, "FTORCH_FAULTS": "attach@1"})
        assert killed.returncode == -9, killed.stderr
        kills += 1
        attached = ftorch("attach", str(store), env=env)
        assert attached.returncode == 0 and "FAILED" in attached.stdout, attached.stdout + attached.stderr

    for name, store in stores.items():  # kills 4-6: the resumed trainer killed; the supervisor restarts it
        env = homes[name]
        resumed = ftorch("resume", rid, env={**env, "FTORCH_FAULTS": "kill@13:2"})
        assert resumed.returncode == 0, resumed.stderr
        kills += 1
        detail = _ended(rid, env)
        assert detail["state"] == "SUCCEEDED" and detail["output_uri"] == str(store / "output"), detail
        assert detail["attempts"] >= 3, detail  # the crashed one, the killed resume, the one that finished
        assert same_adapter(store / "output", runs.clean / "output"), name

    exports = [  # kills 7-10: staged, between the renames, beside a user's files, staged again
        ("copied", "export@2", ()),
        ("copied", "export@3", ()),
        ("moved", "export@12", ("--to", str(tmp_path / "mine"), "--force")),
        ("twice", "export@2", ()),
    ]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    for name, fault, args in exports:
        env = homes[name]
        if fault == "export@3":  # a swap needs an earlier export in place
            assert ftorch("export", rid, *args, env=env).returncode == 0
        killed = ftorch("export", rid, *args, env={**env, "FTORCH_FAULTS": fault})
        assert killed.returncode == -9, killed.stdout + killed.stderr
        kills += 1
        again = ftorch("export", rid, *args, env=env)
        assert again.returncode == 0, again.stderr
    assert kills == 10

    newest = max(int(p.name.split("-")[1]) for p in (runs.clean / "checkpoints").iterdir())
    reference = tmp_path / "reference"
    export(str(runs.clean), str(reference), step=newest)
    for folder in (copied / "exports" / f"step-{newest:08d}", twice / "exports" / f"step-{newest:08d}",
                   tmp_path / "mine"):  # fmt: skip
        assert same_adapter(folder, reference), folder
        assert not [p for p in folder.rglob("*") if ".tmp-" in p.name]
    assert (tmp_path / "mine" / "notes.txt").read_text() == "the user's"
    for store in stores.values():  # nothing staged or set aside is left next to any export
        leftovers = [
            p for p in store.rglob("*") if ".ftorch-export-" in p.name or ".ftorch-replaced-" in p.name
        ]
        assert leftovers == [], leftovers
    for folder, before in untouched.items():
        assert _snapshot(folder) == before, f"{folder} was written to by a store adopted from it"
    assert not (tmp_path / "moved-from" / rid).exists()
    assert not os.path.exists(original / "output") and not os.path.exists(first_copy / "output")

"""The run store's checkpoint rules: visible only with a manifest, verified on read, newest good one wins,
retention, metric history across attempts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.runstore.storage import is_transient
from trainer.runstore.store import CorruptCheckpoint, RunStore


def _store(tmp_path: Path) -> RunStore:
    return RunStore(str(tmp_path / "run"))


def _commit(store: RunStore, step: int) -> None:
    store.commit_checkpoint(step, {"weights.safetensors": f"w{step}".encode() * 10, "state.json": b"{}"})


def test_checkpoint_without_manifest_is_invisible(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _commit(store, 10)
    (tmp_path / "run/checkpoints/step-00000020").mkdir()
    (tmp_path / "run/checkpoints/step-00000020/weights.safetensors").write_bytes(b"half")
    assert [c.step for c in store.complete_checkpoints()] == [10]
    skipped: list[str] = []
    info, blobs = store.newest_valid_checkpoint(on_skip=lambda what, why: skipped.append(why))
    assert info.step == 10 and blobs["weights.safetensors"] == b"w10" * 10
    assert skipped == ["incomplete (no manifest)"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest-garbage", "manifest-wrong-step"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path, damage: str) -> None:
    store = _store(tmp_path)
    for step in (10, 20, 30):
        _commit(store, step)
    folder = tmp_path / "run/checkpoints/step-00000030"
    weights = folder / "weights.safetensors"
    if damage == "flip":
        data = bytearray(weights.read_bytes())
        data[3] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-2])
    elif damage == "delete":
        weights.unlink()
    elif damage == "manifest-garbage":
        (folder / "MANIFEST.json").write_text('{"step": 30, "files": {')
    else:
        manifest = json.loads((folder / "MANIFEST.json").read_text())
        (folder / "MANIFEST.json").write_text(json.dumps({**manifest, "step": 31}))
    info, blobs = store.newest_valid_checkpoint()
    assert info.step == 20 and blobs["weights.safetensors"] == b"w20" * 10


def test_read_checkpoint_verifies_against_the_manifest(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _commit(store, 5)
    info = store.complete_checkpoints()[0]
    (tmp_path / "run/checkpoints/step-00000005/state.json").write_bytes(b"[]")
    with pytest.raises(CorruptCheckpoint, match="does not match its manifest"):
        store.read_checkpoint(info)


def test_keep_the_newest_and_clean_old_leftovers(tmp_path: Path) -> None:
    store = _store(tmp_path)
    (tmp_path / "run/checkpoints/step-00000001").mkdir(parents=True)  # an interrupted write, older
    for step in (10, 20, 30, 40):
        _commit(store, step)
    (tmp_path / "run/checkpoints/step-00000050").mkdir()  # newer than all: maybe a save in progress
    removed = store.prune_checkpoints(keep=2)
    assert sorted(removed) == ["step-00000001", "step-00000010", "step-00000020"]
    assert [c.step for c in store.complete_checkpoints()] == [30, 40]
    assert "step-00000050" in store.checkpoint_names()


def test_metric_history_prefers_the_latest_attempt_for_a_step(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.write_metrics_part(1, 0, [{"step": s, "loss": 1.0, "attempt": 1} for s in range(1, 6)])
    store.write_metrics_part(2, 0, [{"step": s, "loss": 2.0, "attempt": 2} for s in range(4, 8)])
    rows = store.read_metrics()
    assert [r["step"] for r in rows] == list(range(1, 8))
    assert [r["attempt"] for r in rows] == [1, 1, 1, 2, 2, 2, 2]


def test_memory_filesystem_works_too() -> None:
    store = RunStore("memory://ftorch-test/run")
    _commit(store, 3)
    assert store.newest_valid_checkpoint()[0].step == 3


def test_transient_vs_permanent_errors() -> None:
    assert is_transient(ConnectionResetError())
    assert is_transient(TimeoutError())
    assert is_transient(OSError("An error occurred (SlowDown) when calling the PutObject operation"))
    assert not is_transient(FileNotFoundError("nope"))
    assert not is_transient(PermissionError("denied"))
    assert not is_transient(OSError(28, "No space left on device"))

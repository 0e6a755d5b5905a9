"""Tampered or damaged run-store files (issue 30, M1-M4, L1): skipped with one warning line, or refused
with one line where they would change the math; never a traceback. Each test tampers with a copy of a
real run store (adopted.py) and drives the real CLI or trainer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import ftorch, run_trainer
from support.adopted import Runs, copy_store, make_runs, same_adapter, wait_ended

from trainer.runstore.lease import LEASE_DIR, Lease
from trainer.runstore.store import RunStore

EPOCH_1 = "fence/epoch-00000001.json"
MANIFEST_10 = "checkpoints/step-00000010/MANIFEST.json"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Runs:
    return make_runs(tmp_path_factory.mktemp("tamper-runs"), tiny_model)


def _edit(path: Path, change: dict) -> None:
    data = json.loads(path.read_text())
    for dotted, value in change.items():
        *parents, last = dotted.split(".")
        here = data
        for key in parents:
            here = here[key]
        here[last] = value
    path.write_text(json.dumps(data))


def _attached(runs: Runs, tmp_path: Path) -> Path:
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id)
    assert ftorch("attach", str(store)).returncode == 0
    return store


@pytest.mark.parametrize(
    "change",
    [
        {"measured.step_s": "abc"},  # M1 as found
        {"measured.phases.model_load_s": None, "measured.peak_rss_bytes": "x", "claimed_at": "abc"},
        {"measured.phases": [1], "attempt": "one", "measured.checkpoint_blocking_s": [2]},
    ],
)
def test_a_fence_record_with_values_of_the_wrong_type_is_skipped_with_a_warning(
    runs: Runs, tmp_path: Path, ftorch_home: Path, change: dict
) -> None:
    """M1: `status JOB` (and --json, logs) answer, with one warning line, not a ValueError."""
    store = _attached(runs, tmp_path)
    _edit(store / EPOCH_1, change)
    for command in (("status", runs.run_id), ("status", runs.run_id, "--json"), ("logs", runs.run_id)):
        shown = ftorch(*command)
        assert shown.returncode == 0, (command, shown.stderr)
        assert "Traceback" not in shown.stderr
        warnings = [line for line in shown.stderr.splitlines() if line.startswith("warning:")]
        assert len(warnings) <= 1 and "epoch-00000001.json" in "".join(warnings), shown.stderr
    detail = json.loads(ftorch("status", runs.run_id, "--json").stdout)
    assert detail["last_checkpoint_step"] == 10 and detail["attempts"] == 1


def test_a_fingerprint_that_is_no_record_refuses_the_resume(
    runs: Runs, tmp_path: Path, ftorch_home: Path
) -> None:
    """M2: a non-dict fingerprint does not turn the change check off: the CLI and the trainer refuse in
    one line naming it; --allow-change takes the job as it is."""
    store = _attached(runs, tmp_path)
    _edit(store / MANIFEST_10, {"meta.fingerprint": "tampered"})
    refused = ftorch("resume", runs.run_id, "--set", "train.lr=0.5")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "fingerprint is a str" in refused.stderr
    trainer = run_trainer(str(store), attempt=2)
    assert trainer.returncode != 0 and "fingerprint is a str, not a record" in trainer.stdout + trainer.stderr
    assert "Traceback" not in trainer.stderr
    taken = ftorch("resume", runs.run_id, "--allow-change")
    assert taken.returncode == 0, taken.stderr
    detail = wait_ended(runs.run_id)
    assert detail["state"] == "SUCCEEDED", detail
    assert same_adapter(store / "output", runs.clean / "output")


def test_a_fence_record_that_is_a_link_is_history_not_a_failure(
    runs: Runs, tmp_path: Path, ftorch_home: Path
) -> None:
    """M3: a symlinked epoch record (leading out of the store) is skipped; the resume runs to the end."""
    store = _attached(runs, tmp_path)
    outside = tmp_path / "outside.json"
    outside.write_text((store / EPOCH_1).read_text())
    (store / EPOCH_1).unlink()
    os.symlink(outside, store / EPOCH_1)
    shown = ftorch("status", runs.run_id)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert ftorch("resume", runs.run_id).returncode == 0
    detail = wait_ended(runs.run_id)
    assert detail["state"] == "SUCCEEDED", detail
    assert same_adapter(store / "output", runs.clean / "output")
    assert os.path.islink(store / EPOCH_1) and json.loads(outside.read_text())["attempt"] == 1


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"step": "abc"}, "its manifest's step 'abc' is not the folder's step 10"),
        ({"created_at": "abc", "epoch": "x"}, "its manifest's epoch is not a number"),
        ({"files": {"../../escape": {"size": 1, "sha256": "0"}}}, "files are not relative paths"),
        ({"meta": [1]}, "its manifest's meta is not an object"),
    ],
)
def test_a_damaged_manifest_is_reported_as_such_and_the_previous_checkpoint_used(
    runs: Runs, tmp_path: Path, change: dict, said: str
) -> None:
    """M4: a manifest that is there but damaged is named for what it is (not "no manifest"), the run
    resumes from the checkpoint before it, and nothing raises."""
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id)
    _edit(store / MANIFEST_10, change)
    listing = RunStore(str(store)).list_checkpoints()
    assert [c.step for c in listing.complete] == [5] and said in listing.problems["step-00000010"]
    resumed = run_trainer(str(store), attempt=2, env={"FTORCH_ASYNC_CHECKPOINT": "0"})
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    out = resumed.stdout + resumed.stderr
    assert f"not using checkpoint step-00000010: {said}" in out or said in out, out[-3000:]
    assert "no manifest" not in out
    assert same_adapter(store / "output", runs.clean / "output")


@pytest.mark.parametrize("expires_at", ["abc", None, [1], 1e300, float("inf")])
def test_a_lease_with_an_unreadable_or_absurd_expiry_counts_as_expired(
    runs: Runs, tmp_path: Path, expires_at: object
) -> None:
    """L1: lease_holder() answers (no ValueError) and a lease 'held' for ever does not block a controller."""
    from orchestrator.backends.skypilot_controller import lease_holder

    store = RunStore(str(copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id)))
    record = {"holder": "someone", "acquired_at": 1.0, "expires_at": expires_at, "released": False}
    store.write_bytes(f"{LEASE_DIR}/00000001.json", json.dumps(record).encode())
    assert lease_holder(store) is None
    assert Lease(store, "me", 60.0).acquire() == 2
    assert lease_holder(store) == "me"


@pytest.mark.parametrize(
    ("acquired_in", "expires_in"),
    [(0.0, 23 * 3600.0), (0.0, 3 * 3600.0), (-3600.0, 3600.0), (7200.0, 7380.0)],
)
def test_a_lease_is_held_at_most_a_few_times_its_own_ttl(
    tmp_path: Path, acquired_in: float, expires_in: float
) -> None:
    """Issue 30: a lease whose expiry is far ahead (hours, not minutes), whose claimed ttl is over the
    bound, or that was 'acquired' well in the future counts as expired: no 24 h hold on a controller."""
    from orchestrator.backends.skypilot_controller import lease_holder

    now = 1_000_000.0
    store = RunStore(str(tmp_path / "bucket" / "run"))
    record = {"holder": "someone", "acquired_at": now + acquired_in, "expires_at": now + expires_in}
    store.write_bytes(f"{LEASE_DIR}/00000001.json", json.dumps(record).encode())
    assert lease_holder(store, now) is None
    assert Lease(store, "me", 180.0, clock=lambda: now).acquire() == 2
    assert lease_holder(store, now) == "me"
    assert lease_holder(store, now + 179.0) == "me"  # its own ttl
    assert lease_holder(store, now + 181.0) is None


def test_an_honest_lease_of_another_holder_still_blocks(tmp_path: Path) -> None:
    """The bound does not weaken the lease: a renewed, in-ttl lease (a little clock skew included) holds."""
    from trainer.runstore.lease import LeaseHeld

    now = 1_000_000.0
    store = RunStore(str(tmp_path / "bucket" / "run"))
    Lease(store, "other", 180.0, clock=lambda: now + 30.0).acquire()  # its clock 30 s ahead
    with pytest.raises(LeaseHeld):
        Lease(store, "me", 180.0, clock=lambda: now).acquire()


def test_export_of_an_attached_run_uses_the_registered_model_not_the_stores(
    runs: Runs, tmp_path: Path, ftorch_home: Path
) -> None:
    """Issue 30: spec.json's `model` changed after registration (by whoever can write the bucket) is not
    what `ftorch export` loads: the registry's spec (the one the user attached) is; nor is the summary
    read from an `output_uri` planted there."""
    store = _attached(runs, tmp_path)
    registered = json.loads((store / "spec.json").read_text())["job"]["model"]
    planted = str(tmp_path / "planted-model")  # would fail to load (nothing there) if it were used
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "training_summary.json").write_text(json.dumps({"steps": 10, "planted": True}))
    _edit(store / "spec.json", {"job.model": planted, "output_uri": str(elsewhere)})
    exported = ftorch("export", runs.run_id, "--to", str(tmp_path / "exported"))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert "from step 10" in exported.stdout, exported.stdout
    config = json.loads((tmp_path / "exported" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == registered != planted
    assert planted not in (tmp_path / "exported" / "README.md").read_text()
    assert "planted" not in json.loads((tmp_path / "exported" / "training_summary.json").read_text())
    # generate (and chat) load the registered model too: the planted path would fail to load
    answered = ftorch("generate", runs.run_id, "--prompt", "Hello", "--max-new-tokens", "2")
    assert answered.returncode == 0, answered.stdout + answered.stderr


@pytest.mark.parametrize(
    "damage",
    [
        {"data": "x"},  # found: a KeyError/AttributeError out of `ftorch export`
        {"first_loss": "low", "attempts": None, "eval_after": {"loss": "0.1"}},
        {"method": "rm -rf", "lora": {"r": 8}},
        "not an object",
    ],
)
def test_a_damaged_training_summary_is_not_used_by_export_and_is_rebuilt(
    runs: Runs, tmp_path: Path, ftorch_home: Path, damage: dict | str
) -> None:
    """The run's output/training_summary.json is store data: an export of the step it describes checks
    each field the card reads; a damaged one is skipped with one warning and rebuilt from the metrics."""
    store = copy_store(runs.clean, tmp_path / "bucket" / runs.run_id)
    assert ftorch("attach", str(store)).returncode == 0
    summary_file = store / "output" / "training_summary.json"
    honest = json.loads(summary_file.read_text())
    tampered = {**honest, **damage} if isinstance(damage, dict) else damage
    summary_file.write_text(json.dumps(tampered))
    exported = ftorch("export", runs.run_id, "--to", str(tmp_path / "exported"))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert "Traceback" not in exported.stderr
    warnings = [line for line in exported.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "training_summary.json: not used" in warnings[0], exported.stderr
    written = json.loads((tmp_path / "exported" / "training_summary.json").read_text())
    for key in ("method", "base_model", "steps", "first_loss", "final_loss", "hyperparameters"):
        assert written[key] == honest[key], key  # rebuilt from the run's own metrics and the job
    counted = ("training_examples", "training_tokens")  # what only the damaged file said: not recorded
    assert {k: v for k, v in written["data"].items() if k not in counted} == {
        k: v for k, v in honest["data"].items() if k not in counted
    }
    card = (tmp_path / "exported" / "README.md").read_text()
    assert "rm -rf" not in card and "low" not in card
    # an honest summary is used as it is (with no warning)
    summary_file.write_text(json.dumps(honest))
    again = ftorch("export", runs.run_id, "--to", str(tmp_path / "exported"))
    assert again.returncode == 0 and "warning:" not in again.stderr, again.stderr
    assert json.loads((tmp_path / "exported" / "training_summary.json").read_text())["attempts"] == 1

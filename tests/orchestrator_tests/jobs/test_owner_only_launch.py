"""Every file ftorch writes in a run store or in $FTORCH_HOME is owner-only (issue 30, S5), whatever the
user's umask: a real `ftorch launch --follow` of a tiny local job and an `ftorch export` into its store,
started under umask 022; then the whole run store (spec.json, env/lock.*, checkpoints, fence, metrics,
output, exports; a local job keeps no plan.json) and $FTORCH_HOME (registry.db, jobs/<id>/supervisor.log,
logs/, queue/, device.lock) are walked: no file readable by group or others, no folder they may enter."""

from __future__ import annotations

from pathlib import Path

import yaml
from helpers import ftorch, job_dict, open_to_others, write_data


def test_a_followed_local_launch_writes_owner_only_files(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path, umask_022: None
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    runs = tmp_path / "runs"
    job = job_dict(tiny_model, data, runs, train={"max_steps": 4}, checkpoint={"every": 2})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    done = ftorch("launch", str(path), "--follow", timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    stores = [p.parent for p in runs.rglob("spec.json")]
    assert len(stores) == 1, stores
    store = stores[0]
    for rel in ("spec.json", "output/adapter_model.safetensors"):
        assert (store / rel).exists(), rel
    assert list(store.glob("checkpoints/*")), "no checkpoint was written"
    assert list(store.glob("env/lock.*")), "no lock file was written"
    assert any(ftorch_home.rglob("*.log")), sorted(map(str, ftorch_home.rglob("*")))
    exported = ftorch("export", store.name)  # into the run store: <run store>/exports/step-N
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert list(store.glob("exports/*/adapter_model.safetensors")), sorted(map(str, store.rglob("*")))
    # every folder on the way from the bucket root to the store is ftorch's too
    assert open_to_others(runs) == []
    assert open_to_others(ftorch_home) == []

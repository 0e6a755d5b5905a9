"""The run's library versions on the local backend, on real trainer processes: the launch writes the
lock into the run store, every attempt records its versions (epoch record and checkpoint manifest), and a
resume under other versions is refused with one line (exit 2), or allowed, recorded and shown, with
--allow-change (trainer/envlock.py, orchestrator/jobfile/envlock.py)."""

from __future__ import annotations

import json
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from helpers import REPO, ftorch, job_dict, prepare_run, run_trainer, write_data

from orchestrator.registry import TERMINAL
from orchestrator.views import status as job_status
from trainer.envlock import parse
from trainer.runstore.store import MANIFEST, RunStore

TRANSFORMERS = metadata.version("transformers")


def _launch(tmp_path: Path, job: dict[str, Any]) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    done = ftorch("launch", str(path), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["job_id"]


def _wait(job_id: str, predicate: Any, timeout: float = 180.0) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        detail = job_status.status_one(job_id)
        if predicate(detail):
            return detail
        time.sleep(0.2)
    raise AssertionError(json.dumps(job_status.status_one(job_id), default=str)[:2000])


def _newest_manifest(store: RunStore) -> tuple[str, dict[str, Any]]:
    newest = store.complete_checkpoints()[-1]
    rel = f"{newest.path}/{MANIFEST}"
    return rel, json.loads(store.read_bytes(rel))


def test_versions_are_recorded_and_a_changed_version_is_refused_or_allowed_and_shown(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 100000}, checkpoint={"every": 1000}
    )
    job_id = _launch(tmp_path, job)
    _wait(job_id, lambda d: d["state"] == "RUNNING" and (d["step"] or 0) >= 3)
    assert ftorch("cancel", job_id).returncode == 0
    detail = _wait(job_id, lambda d: d["state"] in TERMINAL)
    store = RunStore(detail["run_uri"])

    # the launch wrote the run's lock: this machine's versions, exact pins; `ftorch env` shows it
    pins = parse(store.read_bytes("env/lock.txt").decode())
    assert pins["transformers"].version == TRANSFORMERS and pins["torch"].version == metadata.version("torch")
    shown = ftorch("env", job_id)
    assert shown.returncode == 0 and f"transformers=={TRANSFORMERS}" in shown.stdout, shown.stderr
    assert "source: installed" in shown.stdout
    as_json = json.loads(ftorch("env", job_id, "--json").stdout)
    assert as_json["source"] == "installed" and as_json["pins"]["transformers"] == TRANSFORMERS
    assert len(as_json["ftorch"]["source_sha256"]) == 64  # the ftorch that ran: this source tree
    # the attempt record and the checkpoint manifest carry the versions
    (record,) = store.epoch_records().values()
    assert record["versions"]["transformers"] == TRANSFORMERS and record["versions"]["peft"]
    rel, manifest = _newest_manifest(store)
    assert manifest["meta"]["versions"]["transformers"] == TRANSFORMERS
    step = manifest["step"]

    # the checkpoint says it was made under another transformers: the resume is refused, in one line
    manifest["meta"]["versions"]["transformers"] = "4.56.0"
    store.write_bytes(rel, json.dumps(manifest).encode())
    refused = ftorch("resume", job_id)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = refused.stderr.strip()
    assert "\n" not in line and line == (
        f"error: env.transformers: changed from 4.56.0 to {TRANSFORMERS} since checkpoint step {step}; "
        "resuming would not continue the same run (pass --allow-change to resume anyway)"
    )
    assert job_status.status_one(job_id)["state"] == "CANCELLED"  # nothing started

    # --allow-change resumes, records the change (with the new max_steps, so that it ends), status shows it
    allowed = ftorch("resume", job_id, "--set", f"train.max_steps={step + 6}", "--allow-change")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    detail = _wait(job_id, lambda d: d["state"] in TERMINAL)
    assert detail["state"] == "SUCCEEDED" and detail["step"] == step + 6
    changes = detail["allowed_changes"][-1]["changes"]
    assert {
        "field": "env.transformers",
        "from": "4.56.0",
        "to": TRANSFORMERS,
        "checkpoint_step": step,
    } in changes
    text = ftorch("status", job_id)
    assert f"env.transformers 4.56.0 -> {TRANSFORMERS}" in text.stdout, text.stdout
    newest = store.epoch_records()[max(store.epoch_records())]
    assert newest["allowed_version_changes"][0]["field"] == "env.transformers"
    assert _newest_manifest(store)[1]["meta"]["versions"]["transformers"] == TRANSFORMERS


def _other_transformers(folder: Path, version: str) -> Path:
    """Package metadata saying `version` of transformers is installed (what `pip install -U` leaves behind),
    ahead on the path; the code imported stays the same."""
    info = folder / f"transformers-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n")
    return folder


def test_the_trainer_refuses_to_resume_under_another_installed_version(
    tmp_path: Path, tiny_model: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    run_uri = prepare_run(job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 4}))
    first = run_trainer(run_uri)
    assert first.returncode == 0, first.stderr[-2000:]
    newer = _other_transformers(tmp_path / "upgraded", "99.0.0")
    again = run_trainer(run_uri, attempt=2, env={"PYTHONPATH": f"{newer}:{REPO}"})
    assert again.returncode == 2, again.stderr[-2000:]
    log = again.stdout + again.stderr
    assert f"env.transformers: changed from {TRANSFORMERS} to 99.0.0 since checkpoint step 4" in log

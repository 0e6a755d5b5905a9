"""A SkyPilot run keeps its environment lock across resumes (env/lock.txt in its store, not whatever
this ftorch ships now), and moves to other versions only on purpose: `ftorch resume --relock` is refused
with one line naming the package and both versions, and with --allow-change replaces the run's lock,
records the change and submits a task that installs the new pins.

Faults injected: SkyPilot's API server is a double at the SDK boundary (submit keeps the task); the run
store is a real S3 server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, ftorch

from orchestrator.backends import skypilot_controller, skypilot_sdk
from orchestrator.errors import UserError
from orchestrator.jobfile import envlock as runenv
from orchestrator.jobfile.spec import load_job
from orchestrator.jobs import lifecycle as jobs
from orchestrator.registry import JobState, Registry
from trainer import envlock
from trainer.runstore.store import RunStore


def _pins_of(task: dict[str, Any]) -> dict[str, envlock.Pin]:
    body = task["setup"].split("<<'FTORCH_LOCK_EOF'\n", 1)[1].split("FTORCH_LOCK_EOF\n", 1)[0]
    return envlock.parse(body)


def test_a_cloud_run_keeps_its_lock_and_moves_only_with_relock_and_allow_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3: Any
) -> None:
    monkeypatch.setenv("FTORCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    at = [f"checkpoint.uri={s3.uri}/ftorch", f"checkpoint.storage_options={{endpoint_url: '{s3.endpoint}'}}"]
    spec = load_job(REPO / "examples/llama3-8b-qlora.yaml", at)
    registry = Registry()
    run_uri = f"{s3.uri}/ftorch/q-1"
    registry.create_job("q-1", spec.name, "skypilot", run_uri, f"{run_uri}/output", spec.model_dump())
    store = RunStore(run_uri, s3.options, retry_seconds=5)
    # what the launch wrote, and a checkpoint made under the lock's versions
    launched, info = runenv.lock_for_launch(spec, remote=True)
    assert info["source"] == f"shipped:{runenv.DEFAULT_TARGET}" and launched is not None
    runenv.write_lock(store, launched, info)
    store.write_spec(
        {"job": spec.model_dump(mode="json"), "run_id": "q-1", "output_uri": f"{run_uri}/output"}
    )
    pins = envlock.parse(launched)
    store.commit_checkpoint(10, {"x.bin": b"x"}, meta={"versions": {n: p.version for n, p in pins.items()}})

    # this ftorch now ships another transformers (a lock file of one's own stands in for an upgrade)
    other = launched.replace(
        f"transformers=={pins['transformers'].version} ", "transformers==9.9.9 ", 1
    ).replace("target: cu130-py311", "target: newer")
    (tmp_path / "newer.txt").write_text(other)
    monkeypatch.setenv(runenv.LOCK_FILE_ENV, str(tmp_path / "newer.txt"))

    submitted: list[dict[str, Any]] = []
    monkeypatch.setattr(skypilot_sdk, "enabled_clouds", lambda: ["gcp", "aws", "lambda", "runpod"])
    monkeypatch.setattr(skypilot_sdk, "submit", lambda _j, task, _s: submitted.append(task) or 8)
    monkeypatch.setattr(skypilot_sdk, "queue", lambda *_a, **_k: [{"job_id": 8, "status": "PENDING"}])
    # each relaunch's controller (a detached process that would outlive the test) is only recorded
    controllers: list[str] = []
    monkeypatch.setattr(skypilot_controller, "spawn", lambda _reg, j: controllers.append(j.job_id) or 1)

    registry.set_state("q-1", JobState.FAILED, "SkyPilot FAILED")
    jobs.resume("q-1", [])  # a plain resume installs the run's own lock, not the newer one
    assert _pins_of(submitted[-1]) == pins

    registry.set_state("q-1", JobState.FAILED, "SkyPilot FAILED")
    with pytest.raises(UserError) as refused:
        jobs.resume("q-1", [], relock=True)
    assert str(refused.value) == (
        f"env.transformers: changed from {pins['transformers'].version} to 9.9.9 since checkpoint step 10; "
        "resuming would not continue the same run (pass --allow-change to resume anyway)"
    )
    assert runenv.read_lock(store)[0] == launched  # nothing written
    assert len(submitted) == 1

    said = jobs.resume("q-1", [], allow_change=True, relock=True)
    assert "env.transformers" in said and "9.9.9" in said
    text, info = runenv.read_lock(store)
    assert text == other and info["source"] == f"file:{tmp_path / 'newer.txt'}"
    assert _pins_of(submitted[-1])["transformers"].version == "9.9.9"
    assert controllers == ["q-1", "q-1"]  # each relaunch starts the job's controller
    allowed = store.read_spec()["allowed_changes"][-1]["changes"]
    assert allowed == [
        {
            "field": "env.transformers",
            "from": pins["transformers"].version,
            "to": "9.9.9",
            "checkpoint_step": 10,
        }
    ]


def test_a_cloud_launch_writes_the_shipped_lock_and_the_ftorch_it_ships_and_env_shows_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3: Any
) -> None:
    """`ftorch launch` of a SkyPilot job (the real launch path; SkyPilot's API server a double at the SDK
    boundary): the run store gets the lock ftorch ships (env/lock.txt, its source and sha256 in
    env/lock.json) and the digest of the ftorch the task installs; the submitted task installs exactly
    those pins; `ftorch env JOB --json` shows them."""
    import hashlib
    import json

    import fsspec

    monkeypatch.setenv("FTORCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv(runenv.LOCK_FILE_ENV, raising=False)
    fs = fsspec.filesystem("s3", **s3.options)
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    fs.pipe_file(f"{s3.uri}/data/support.jsonl", (json.dumps(chat) + "\n").encode())
    at = [
        f"checkpoint.uri={s3.uri}/ftorch",
        f"checkpoint.storage_options={{endpoint_url: '{s3.endpoint}'}}",
        f"data.path={s3.uri}/data/support.jsonl",
        "checkpoint.region=us-east-1",
    ]
    submitted: list[dict[str, Any]] = []
    monkeypatch.setattr(skypilot_sdk, "enabled_clouds", lambda: ["gcp", "aws", "lambda", "runpod"])
    monkeypatch.setattr(skypilot_sdk, "submit", lambda _j, task, _s: submitted.append(task) or 9)
    monkeypatch.setattr(skypilot_sdk, "queue", lambda *_a, **_k: [{"job_id": 9, "status": "PENDING"}])
    monkeypatch.setattr(skypilot_controller, "spawn", lambda _reg, _j: 1)
    job_id = jobs.launch(str(REPO / "examples/llama3-8b-qlora.yaml"), at)["job_id"]

    shipped = (REPO / "orchestrator/data/locks" / f"{runenv.DEFAULT_TARGET}.txt").read_text()
    store = RunStore(Registry().get(job_id).run_uri, s3.options, retry_seconds=5)
    text, info = runenv.read_lock(store)
    assert text == shipped and info["source"] == f"shipped:{runenv.DEFAULT_TARGET}"
    assert info["sha256"] == hashlib.sha256(shipped.encode()).hexdigest()
    digest = info["ftorch"].get("wheel_sha256") or info["ftorch"].get("source_sha256")
    assert digest is not None and len(digest) == 64 and int(digest, 16) >= 0  # what the task installs
    (task,) = submitted
    assert _pins_of(task) == envlock.parse(shipped)

    shown = ftorch("env", job_id, "--json")  # FTORCH_HOME: this test's
    assert shown.returncode == 0, shown.stderr
    env = json.loads(shown.stdout)
    assert env["source"] == f"shipped:{runenv.DEFAULT_TARGET}"
    assert env["pins"]["torch"] == envlock.parse(shipped)["torch"].version

"""The quickstart with its checkpoints on S3: `ftorch launch examples/quickstart.yaml --set
checkpoint.uri=s3://...` against the test's SeaweedFS, with the endpoint from AWS_ENDPOINT_URL. Shortened
to 60 steps with the two preemptions at steps 20 and 45 (test_quickstart.py runs the full quickstart)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ftorch

from trainer.runstore.store import RunStore


@pytest.mark.timeout(900)
def test_quickstart_on_s3_survives_two_preemptions(quickstart_dir: Path, ftorch_home: Path, s3) -> None:
    uri = f"{s3.uri}/runs"
    done = ftorch(
        "launch",
        str(quickstart_dir / "quickstart.yaml"),
        "--set",
        f"checkpoint.uri={uri}",
        "--set",
        "local.threads=1",
        "--set",
        "train.max_steps=60",
        "--set",
        "local.chaos.preempt_at_steps=[20, 45]",
        "--follow",
        env=s3.env,
        timeout=800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "preempted (with notice" in done.stdout and "preempted (without notice" in done.stdout
    job_id = done.stdout.splitlines()[0].strip()
    status = json.loads(ftorch("status", job_id, "--json", env=s3.env).stdout)
    assert status["state"] == "SUCCEEDED" and status["preemptions"] == 2
    assert status["run_uri"].startswith(uri) and status["output_uri"].startswith("s3://")
    store = RunStore(status["run_uri"], s3.options)
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(store.listdir("output"))
    assert store.epochs() == [1, 2, 3]  # one fencing epoch per attempt
    assert status["eval_after"]["loss"] < status["eval_before"]["loss"]

"""The README's quickstart, end to end: generated model and data, two simulated preemptions, a trained adapter."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import ftorch


def test_quickstart_survives_two_preemptions_and_learns(quickstart_dir: Path, ftorch_home: Path) -> None:
    # as the README runs it; one trainer thread because other tests may run beside this one
    job = str(quickstart_dir / "quickstart.yaml")
    done = ftorch("launch", job, "--set", "local.threads=1", "--follow", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    out = done.stdout
    assert "preempted (with notice" in out and "preempted (without notice" in out
    assert "trained adapter:" in out and "held-out check:" in out

    job_id = out.splitlines()[0].strip()  # launch prints the job id first
    status = json.loads(ftorch("status", job_id, "--json").stdout)
    assert status["state"] == "SUCCEEDED" and status["preemptions"] == 2 and status["attempts"] == 3
    assert (Path(status["output_uri"]) / "adapter_model.safetensors").exists()
    assert (Path(status["output_uri"]) / "adapter_config.json").exists()
    summary = json.loads((Path(status["output_uri"]) / "training_summary.json").read_text())
    assert summary["preemptions"] == 2 and summary["attempts"] == 3 and summary["cost_usd"] == 0.0
    assert "| preemptions | 2 |" in (Path(status["output_uri"]) / "README.md").read_text()
    before, after = status["eval_before"], status["eval_after"]
    assert after["loss"] < before["loss"] / 5  # training worked, clearly
    assert after["exact_match"] >= before["exact_match"] + 0.4
    curve = [loss for _step, loss in status["loss_curve"]]
    assert sum(curve[-10:]) / 10 < sum(curve[:10]) / 10 / 5

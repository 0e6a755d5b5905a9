"""The README's quickstart, end to end: generated model and data, two simulated preemptions, a trained adapter."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import REPO, ftorch


def test_quickstart_survives_two_preemptions_and_learns(tmp_path: Path, ftorch_home: Path) -> None:
    folder = tmp_path / "examples"
    folder.mkdir()
    shutil.copy(REPO / "examples" / "quickstart.yaml", folder / "quickstart.yaml")
    made = subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_quickstart.py"), "--out", str(folder / "quickstart")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr

    done = ftorch("launch", str(folder / "quickstart.yaml"), "--follow", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    out = done.stdout
    assert "preempted (with notice" in out and "preempted (without notice" in out
    assert "trained adapter:" in out and "held-out check:" in out

    job_id = out.splitlines()[0].strip()  # launch prints the job id first
    status = json.loads(ftorch("status", job_id, "--json").stdout)
    assert status["state"] == "SUCCEEDED" and status["preemptions"] == 2 and status["attempts"] == 3
    assert (Path(status["output_uri"]) / "adapter_model.safetensors").exists()
    assert (Path(status["output_uri"]) / "adapter_config.json").exists()
    before, after = status["eval_before"], status["eval_after"]
    assert after["loss"] < before["loss"] / 5  # training worked, clearly
    assert after["exact_match"] >= before["exact_match"] + 0.4
    curve = [loss for _step, loss in status["loss_curve"]]
    assert sum(curve[-10:]) / 10 < sum(curve[:10]) / 10 / 5

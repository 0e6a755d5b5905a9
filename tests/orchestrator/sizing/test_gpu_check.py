"""bench/gpu_check.py runs (CPU mode, tiny shape): the same code path the GPU check takes on CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO


def test_gpu_check_cpu_tiny_mode(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--cpu-tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())
    assert [r["case"] for r in rows] == ["lora-tiny", "qlora-tiny", "full-tiny"]
    for row in rows:
        assert row["estimate_gib"] > 0
        if row["skipped"]:  # QLoRA where bitsandbytes has no CPU support
            assert row["case"] == "qlora-tiny"
            continue
        assert row["tokens_per_s"] > 0 and row["steps"] == 2 and row["peak_rss_gib"] > 0
        assert 0 < row["trainable"] <= row["params"]
    assert "| lora-tiny | cpu |" in done.stdout


def test_gpu_check_without_cuda_points_to_the_cpu_mode() -> None:
    import torch

    if torch.cuda.is_available():
        return
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 2 and "--cpu-tiny" in done.stderr

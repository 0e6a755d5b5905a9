"""bench/gpu_check.py runs (CPU mode, tiny shape): the same code path the GPU check takes on CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO


def test_gpu_check_cpu_tiny_mode(tmp_path: Path) -> None:
    out, facts = tmp_path / "gpu_check.json", tmp_path / "facts.json"
    done = subprocess.run(
        [
            sys.executable,
            "bench/gpu_check.py",
            "--cpu-tiny",
            "--json",
            str(out),
            "--facts",
            str(facts),
            "--learn",
        ],
        capture_output=True,
        text=True,
        timeout=480,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "FTORCH_HOME": str(tmp_path / "home")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())
    # issue 20 added the step in backward, the sharded QLoRA load on 2 (gloo) ranks and CPU offload on 2
    assert [r["case"] for r in rows] == [
        "lora-tiny", "qlora-tiny", "full-tiny", "full-tiny-inbwd", "qlora-tiny-2ranks", "qlora-tiny-offload"
    ]  # fmt: skip
    # train.offload: params really ran FSDP2's CPUOffloadPolicy on the 2 gloo ranks (the 2-rank case
    # without it does not), with the estimate's host RAM next to the measured RSS
    offload, plain = rows[-1], rows[-2]
    assert (offload["offload_policy"], plain["offload_policy"]) == ("CPUOffloadPolicy", "OffloadPolicy")
    assert offload["estimate_host_gib"] > 0 and "| qlora-tiny-offload | cpu |" in done.stdout
    for row in rows:
        assert row["estimate_gib"] > 0
        if row["skipped"]:  # QLoRA where bitsandbytes has no CPU support
            assert row["case"] == "qlora-tiny"
            continue
        assert row["tokens_per_s"] > 0 and row["steps"] == 2 and row["peak_rss_gib"] > 0
        assert 0 < row["trainable"] <= row["params"]
    assert "| lora-tiny | cpu |" in done.stdout
    # the measured facts, as attempt `measured` records: one per case that ran
    measured = {f["case"]: f["measured"] for f in json.loads(facts.read_text())}
    assert set(measured) == {r["case"] for r in rows if not r["skipped"]}
    keys = {"device", "gpu_name", "world_size", "micro_batch_size", "grad_accum", "gradient_checkpointing"}
    keys |= {"peak_allocated_bytes", "peak_reserved_bytes", "tokens_per_s", "step_s"}
    assert all(set(m) == keys and m["device"] == "cpu" and m["tokens_per_s"] > 0 for m in measured.values())
    if "qlora-tiny-2ranks" in measured:  # bitsandbytes with CPU support: the sharded load ran on 2 ranks
        assert measured["qlora-tiny-2ranks"]["world_size"] == 2
    # --learn: the facts are in this machine's planner history, and a CPU's never override a GPU estimate
    assert f"history: {len(measured)} measured cases recorded" in done.stdout
    history = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "history", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "FTORCH_HOME": str(tmp_path / "home")},
    )
    rows = json.loads(history.stdout)["measurements"]
    assert len(rows) == len(measured) and not any(r["plausible"] for r in rows), history.stdout


def test_gpu_check_without_cuda_points_to_the_cpu_mode() -> None:
    import torch

    if torch.cuda.is_available():
        return
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 2 and "--cpu-tiny" in done.stderr

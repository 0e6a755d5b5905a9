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
            "--out",
            str(tmp_path / "rows.jsonl"),
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
        [sys.executable, "-m", "orchestrator.cli.app", "history", "--json"],
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


def test_gpu_check_rehearsal_on_the_image_packages_and_the_carried_wheels(tmp_path: Path) -> None:
    """Issue 32: the GPU check as the lent machine runs it: its image's packages only (here: this venv's
    copies of KINDS.md's list and what they need, no site-packages, `python -S`), plus the wheels
    bench/gpu_wheels.py carries, installed with the device README's command. The stand-in: this venv's
    Python (3.11, the image has 3.12) and its versions, the wheels repacked offline (`pack`) rather than
    downloaded; the cases are CPU ones. Without the wheels every case is a row with its error (isolated,
    written as it ends, each case in its own process as on CUDA); with them the cases run, and a kernel
    that cannot run here is a row saying why."""
    sys.path.insert(0, str(REPO / "bench"))
    import gpu_wheels

    image = tmp_path / "image-site"
    assert gpu_wheels.image_site(image) > 30
    assert not (image / "pydantic").exists() and (image / "torch").exists() and (image / "peft").exists()
    wheels = gpu_wheels.pack(tmp_path / ".whl")
    assert sum(w.stat().st_size for w in wheels) < 16 * 1024**2  # well inside the 64 MiB that travels
    site = tmp_path / "site"
    install = [sys.executable, *gpu_wheels.INSTALL_ARGS, str(site), *map(str, wheels)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)

    def check(pythonpath: list[Path], cases: str, out: Path, *more: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env |= {"PYTHONPATH": os.pathsep.join(map(str, [*pythonpath, REPO])), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-S", "bench/gpu_check.py", "--cpu-tiny", "--cases", cases, "--out", str(out)]
        cmd += more
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)

    # each case in its own process, as on CUDA (the CPU mode runs them in one process by default)
    bare = check([image], "lora-tiny,full-tiny", tmp_path / "bare.jsonl", "--isolate")
    assert bare.returncode == 0, bare.stdout + bare.stderr
    rows = [json.loads(line) for line in (tmp_path / "bare.jsonl").read_text().splitlines()]
    assert [r["case"] for r in rows] == ["lora-tiny", "full-tiny"]
    assert all("No module named 'pydantic'" in r["error"] for r in rows), rows

    spent = check([image], "lora-tiny,full-tiny", tmp_path / "spent.jsonl", "--budget-s", "10")
    rows = [json.loads(line) for line in (tmp_path / "spent.jsonl").read_text().splitlines()]
    assert (
        spent.returncode == 0 and [r["error"] for r in rows] == ["not started: the run's 10 s were spent"] * 2
    )

    carried = check([site, image], "lora-tiny,lora-tiny-liger", tmp_path / "carried.jsonl")
    assert carried.returncode == 0, carried.stdout + carried.stderr
    rows = [json.loads(line) for line in (tmp_path / "carried.jsonl").read_text().splitlines()]
    ran, liger = rows
    assert ran["error"] is None and ran["tokens_per_s"] > 0 and ran["paths"] == "sdpa, loss plain, adamw loop"
    assert liger["skipped"].startswith("liger_fused_ce runs on CUDA GPUs only"), liger
    assert "| lora-tiny | cpu | sdpa, loss plain, adamw loop |" in carried.stdout

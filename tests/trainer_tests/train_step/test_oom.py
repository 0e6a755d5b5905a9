"""Out of memory is not the end of a run (issue 21 point 2), what each attempt measured (point 1) and the
resume check in the log (point 5): real tiny jobs through `ftorch launch --follow`, the out-of-memory
error injected with FTORCH_FAULTS=oom-above@K (the only way to cause one on a CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_helpers import ENV as FSDP_ENV
from helpers import ftorch, job_dict, per_rank, write_data

from orchestrator.registry import Registry
from trainer.layout import Layout, halved
from trainer.resume_check import differences
from trainer.runstore.store import RunStore
from trainer.train_step import oom


def _launch(tmp_path: Path, job: dict[str, Any], name: str, faults: str = "", extra_env: dict | None = None):
    job_file = tmp_path / f"{name}.yaml"
    job_file.write_text(yaml.safe_dump({**job, "name": name}))
    done = ftorch("launch", str(job_file), "--follow", env={"FTORCH_FAULTS": faults, **(extra_env or {})})
    status = ftorch("status", name, "--json")
    assert status.returncode == 0, status.stderr
    return done, json.loads(status.stdout)


def _curve(run_uri: str) -> list[tuple[int, float]]:
    return [(m["step"], m["loss"]) for m in RunStore(run_uri).read_metrics() if m.get("loss") is not None]


def test_out_of_memory_halves_the_micro_batch_and_the_run_succeeds(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    # no LoRA dropout: its masks are drawn per micro-batch, so another split draws other ones (the same
    # run in distribution, not in numbers)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"micro_batch_size": 16, "max_steps": 6},
                   checkpoint={"every": 2}, lora={"dropout": 0.0})  # fmt: skip
    clean, clean_status = _launch(tmp_path, job, "clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr

    done, status = _launch(tmp_path, job, "oom", faults="oom-above@8")
    assert done.returncode == 0, done.stdout + done.stderr
    assert status["state"] == "SUCCEEDED"
    (adapted,) = status["adaptations"]
    assert adapted["from"] == per_rank(16, 1)
    assert adapted["to"] == per_rank(8, 2)
    assert adapted["effective_batch"] == 16 and adapted["attempt"] == 1
    first, second = status["attempt_timeline"]
    assert first["outcome"] == "adapted" and second["outcome"] == "succeeded"
    assert status["preemptions"] == 0
    # the same examples per step: the loss curve of the clean run, up to the sum's order
    clean_curve, curve = _curve(clean_status["run_uri"]), _curve(status["run_uri"])
    assert [s for s, _ in curve] == [s for s, _ in clean_curve] == list(range(1, 7))
    assert [x for _, x in curve] == pytest.approx([x for _, x in clean_curve], rel=1e-5, abs=1e-6)
    # the attempt measured what it ran (CPU: peak RSS, labelled)
    measured = second["measured"]
    assert measured["device"] == "cpu" and measured["peak_allocated_bytes"] is None
    assert measured["peak_rss_bytes"] > 10 * 2**20
    assert (measured["world_size"], measured["micro_batch_size"], measured["grad_accum"]) == (1, 8, 2)
    assert measured["steps"] == 6 and measured["tokens"] > 0 and measured["tokens_per_s"] > 0
    assert measured["checkpoint_blocking_s"] is not None and measured["phases"]["model_load_s"] > 0
    assert set(measured["phases"]) == {"process_start_s", "model_load_s", "checkpoint_read_s", "first_step_s"}
    assert status["measured"] == measured
    assert first["measured"]["steps"] == 0 and first["measured"]["micro_batch_size"] == 16
    # one log line says what changed; the human view says it too
    log = (Registry().job_dir(status["job_id"]) / "logs" / "attempt-001.log").read_text()
    assert "out of memory at step 1 with 16/rank x1: restarting from checkpoint step 0 with 8/rank x2" in log
    shown = ftorch("status", "oom")
    assert "adapted: attempt 1, step 1: out of memory at 16/rank x1 -> 8/rank x2" in shown.stdout, (
        shown.stdout
    )
    assert "#2 measured: cpu: peak RSS" in shown.stdout, shown.stdout
    # the spec keeps what finally ran; the job's own numbers (the data's unit) stay
    resolved = RunStore(status["run_uri"]).read_spec()
    assert oom.current(resolved) == adapted["to"]
    assert resolved["job"]["train"]["micro_batch_size"] == 16


def test_the_smallest_layout_that_still_runs_out_of_memory_asks_for_a_re_plan(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"micro_batch_size": 2, "max_steps": 3})
    done, status = _launch(tmp_path, job, "unfit", faults="oom-above@0")
    assert done.returncode != 0
    assert status["state"] == "FAILED"
    steps = [
        (a["to"]["micro_batch_per_rank"], a["to"]["gradient_checkpointing"]) for a in status["adaptations"]
    ]
    assert steps == [(1, False), (1, True)]
    assert [a["outcome"] for a in status["attempt_timeline"]] == ["adapted", "adapted", "failed"]
    assert status["replan"].startswith(
        "re-plan: out of memory at step 1 with 1/rank x2, gradient checkpointing"
    )
    assert "re-plan" in ftorch("status", "unfit").stdout


def test_out_of_memory_on_two_fsdp_ranks(tmp_path: Path, tiny_model: Path, ftorch_home: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"micro_batch_size": 8, "max_steps": 3},
                   checkpoint={"every": 2})  # fmt: skip
    job["local"] = {**job["local"], "nproc": 2}
    done, status = _launch(tmp_path, job, "fsdp-oom", faults="oom-above@2", extra_env=FSDP_ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert status["state"] == "SUCCEEDED"
    (adapted,) = status["adaptations"]  # 8 per step over 2 ranks: 4/rank -> 2/rank x2
    assert adapted["from"]["micro_batch_per_rank"] == 4 and adapted["to"]["micro_batch_per_rank"] == 2
    assert adapted["to"]["grad_accum_per_rank"] == 2 and adapted["world_size"] == 2
    assert status["attempt_timeline"][-1]["measured"]["world_size"] == 2


def test_a_resume_says_the_lr_and_data_position_are_as_planned(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 6}, checkpoint={"every": 2})
    # synchronous saves: checkpoint 2 is committed before the crash at 3, however loaded the machine
    done, status = _launch(
        tmp_path, job, "resumed", faults="crash@3:1", extra_env={"FTORCH_ASYNC_CHECKPOINT": "0"}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    log = (Registry().job_dir(status["job_id"]) / "logs" / "attempt-002.log").read_text()
    assert "resumed at step 2: lr and data position as planned" in log, log[-3000:]
    assert status["attempt_timeline"][1]["measured"]["phases"]["checkpoint_read_s"] > 0


def test_the_resume_check_names_what_differs() -> None:
    factor = lambda step: (step + 1) / 4 if step < 4 else 1.0  # noqa: E731
    assert differences(2, [0.75e-3], [1e-3], factor, 6, 6) == []
    found = differences(2, [1e-3], [1e-3], factor, 5, 6)
    assert found == [
        "lr 1.000000e-03 where the schedule says 7.500000e-04",
        "data position 5 where 6 was expected",
    ]


def test_halving_keeps_the_effective_batch() -> None:
    layout = Layout(1, 2, 6, 1, 12, 6, "fsdp")
    steps = []
    while layout is not None:
        steps.append((layout.micro_batch, layout.accum))
        assert layout.micro_batch * layout.accum * layout.ranks == 12
        layout = halved(layout)
    assert steps == [(6, 1), (3, 2), (1, 6)]

"""CLI conventions: commands in workflow order, shell completion of job ids and choices, `metrics --json`,
`cancel` of several ids or `--all` (on real queued and running local jobs), `gpus` one row per accelerator
and `gpus NAME` for its instances."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import typing
from pathlib import Path

import yaml
from fakejobs import add_job
from helpers import ftorch, job_dict, write_data

from orchestrator.cli.common import BACKEND_NAMES, WORKFLOW
from orchestrator.cli.outputs import metric_rows
from orchestrator.registry import TERMINAL, Registry
from trainer.runstore.store import RunStore


def test_help_lists_the_commands_in_workflow_order() -> None:
    done = ftorch("--help", env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    # the light entry point's list (orchestrator/cli/fast_help.py): "  name  help" under "Commands:"
    section = done.stdout.split("Commands:", 1)[1]
    listed = [line.split()[0] for line in section.splitlines() if line.startswith("  ") and line.split()]
    commands = [name for name in listed if name in WORKFLOW]
    assert commands == sorted(commands, key=WORKFLOW.index), commands
    assert commands[:6] == ["init", "validate", "estimate", "plan", "gpus", "launch"] or "convert" in commands
    assert {"sweep", "report", "generate", "chat", "export", "metrics"} <= set(commands)


def _complete(words: str, env: dict[str, str]) -> list[str]:
    exe = Path(sys.executable).parent / "ftorch"
    done = subprocess.run(
        [str(exe)],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "_FTORCH_COMPLETE": "complete_bash", "COMP_WORDS": words,
             "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))},
        timeout=60,
    )  # fmt: skip
    return done.stdout.split()


def test_job_ids_and_choices_complete_in_the_shell(tmp_path: Path, ftorch_home: Path) -> None:
    registry = Registry()
    for job_id in ("alpha-111111", "alpha-222222", "beta-333333"):
        add_job(registry, tmp_path / "runs", job_id, "RUNNING", 5)
    env = {"FTORCH_HOME": str(ftorch_home)}
    for command in ("logs", "status", "cancel", "export", "report", "metrics", "generate", "resume"):
        assert sorted(_complete(f"ftorch {command} al", env)) == ["alpha-111111", "alpha-222222"], command
    assert _complete("ftorch cancel alpha-111111 be", env) == ["beta-333333"]  # several ids
    assert _complete("ftorch launch job.yaml --backend sk", env) == ["skypilot"]
    assert _complete("ftorch init --method q", env) == ["qlora"]
    from trainer.config import Backend

    assert tuple(typing.get_args(Backend)) == BACKEND_NAMES


def test_metrics_json_is_the_tables_rows(tmp_path: Path, ftorch_home: Path) -> None:
    add_job(Registry(), tmp_path / "runs", "m-123456", "SUCCEEDED", 12)
    done = ftorch("metrics", "m-123456", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert rows == json.loads(
        json.dumps(metric_rows(RunStore(str(tmp_path / "runs" / "m-123456")).read_metrics()))
    )
    assert [r["step"] for r in rows] == list(range(1, 13)) and isinstance(rows[0]["loss"], float)
    both = ftorch("metrics", "m-123456", "--json", "--csv")
    assert both.returncode == 2 and "choose one" in both.stderr


def test_cancel_finds_every_id_before_touching_any(tmp_path: Path, ftorch_home: Path) -> None:
    supervisor = subprocess.Popen(["sleep", "600"])  # a live process where the job's supervisor would be
    try:
        add_job(Registry(), tmp_path / "runs", "a-111111", "RUNNING", 3, supervisor_pid=supervisor.pid)
        wrong = ftorch("cancel", "a-111111", "nope-000000")
        assert wrong.returncode == 2 and "nope-000000" in wrong.stderr
        assert Registry().get("a-111111").state == "RUNNING" and supervisor.poll() is None  # nothing touched
        assert not Registry().get("a-111111").cancel_requested
        assert ftorch("cancel").returncode == 2 and ftorch("cancel", "--all", "a-111111").returncode == 2
    finally:
        supervisor.kill()
        supervisor.wait()


def test_cancel_several_and_all_stop_queued_and_running_local_jobs(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 48)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 5000}, checkpoint={"every": 20})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    ids = [json.loads(ftorch("launch", str(job_file), "--json").stdout)["job_id"] for _ in range(3)]
    registry = Registry()
    deadline = time.time() + 300
    while time.time() < deadline and not (
        registry.get(ids[0]).state == "RUNNING"
        and (RunStore(registry.get(ids[0]).run_uri).read_progress() or {}).get("step")
    ):
        time.sleep(0.5)
    assert registry.get(ids[0]).state == "RUNNING"
    assert all(
        registry.get(j).state == "PENDING" and "queued" in (registry.get(j).reason or "") for j in ids[1:]
    )
    several = ftorch("cancel", ids[1], ids[2], timeout=300)  # the two waiting their turn
    assert several.returncode == 0, several.stderr
    assert [line.split()[:2] for line in several.stdout.splitlines()] == [
        [ids[1], "CANCELLED"],
        [ids[2], "CANCELLED"],
    ]
    assert registry.get(ids[0]).state == "RUNNING"
    everything = ftorch("cancel", "--all", timeout=300)  # the running one: it checkpoints and stops
    assert everything.returncode == 0, everything.stderr
    assert [registry.get(j).state for j in ids] == ["CANCELLED"] * 3, everything.stdout
    assert not registry.attempts(ids[1]) and not registry.attempts(ids[2])  # the queued ones never started
    assert ftorch("cancel", "--all").stdout.strip() == "no job to cancel: every job has ended"
    assert all(registry.get(j).state in TERMINAL for j in ids)


def test_gpus_is_one_row_per_accelerator_and_gpus_name_its_offers() -> None:
    data = json.loads(ftorch("gpus", "--json", "--offline").stdout)
    names = [r["accelerator"] for r in data["accelerators"]]
    assert len(names) == len(set(names)) == len({o["accelerator"] for o in data["offers"]})
    h100 = next(r for r in data["accelerators"] if r["accelerator"] == "H100")
    offers = [o for o in data["offers"] if o["accelerator"] == "H100"]
    assert h100["offers"] == len(offers) and h100["clouds"] == sorted({o["cloud"] for o in offers})
    assert h100["spot_usd_per_gpu"] == round(
        min(o["spot_hourly_usd"] / o["count"] for o in offers if o["spot_hourly_usd"]), 4
    )
    table = ftorch("gpus", "--offline", env={"COLUMNS": "200"})
    assert sum(1 for line in table.stdout.splitlines() if " H100 " in line) == 1
    detail = ftorch("gpus", "h100", "--offline", "--json")
    assert {o["accelerator"] for o in json.loads(detail.stdout)["offers"]} == {"H100"}
    near = ftorch("gpus", "H10", "--offline")
    assert near.returncode == 2 and "did you mean H100" in near.stderr

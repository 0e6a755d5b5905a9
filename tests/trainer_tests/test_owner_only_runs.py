"""Every file a run writes in its store is owner-only (issue 30, S5), whatever the user's umask: the tree
is walked after a single-process run and after a sharded run with `train.offload: params` (torch's DCP
writer), each started under umask 022."""

from __future__ import annotations

from pathlib import Path

from fsdp_helpers import finish, fsdp_job, new_run
from helpers import job_dict, open_to_others, prepare_run, run_trainer, write_data


def test_a_sharded_offloaded_run_writes_owner_only_files(
    tmp_path: Path, tiny_model: Path, umask_022: None
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 24)
    job = fsdp_job(
        tiny_model,
        data,
        tmp_path / "runs",
        train={"max_steps": 4, "offload": "params"},
        checkpoint={"every": 2},
    )
    run_uri = new_run(job, "offloaded")
    out = finish(run_uri, 1, nproc=2)
    assert "CPU offload (params)" in out, out
    assert list(Path(run_uri).glob("checkpoints/*/e*/*.distcp")), "no sharded files were written"
    assert open_to_others(Path(run_uri)) == []


def test_a_single_process_run_writes_owner_only_files(
    tmp_path: Path, tiny_model: Path, umask_022: None
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    run_uri = prepare_run(job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 4}), "single")
    done = run_trainer(run_uri)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (Path(run_uri) / "output" / "adapter_model.safetensors").exists()
    assert open_to_others(Path(run_uri)) == []

"""FSDP2 under torchrun (2 ranks, gloo on CPU): exact resume after SIGKILL and SIGTERM for LoRA and full
fine-tuning, sharded checkpoints with the manifest last, and the supervisor's view of a torchrun notice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fsdp_helpers import SIGKILL, SIGTERM, finish, fsdp_job, interrupt, new_run, wait_gone
from helpers import assert_bitwise_equal, final_weights, write_data

from trainer.runstore.store import RunStore

CASES = {
    # LoRA with dropout: each rank's torch RNG must come back exactly; gradient checkpointing on
    "lora": {"train": {"max_steps": 12, "gradient_checkpointing": True}, "checkpoint": {"every": 3}},
    # full fine-tuning with gradient accumulation (no dropout in a Llama)
    "full": {"method": "full", "train": {"max_steps": 10, "grad_accum": 2}, "checkpoint": {"every": 3}},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fsdp_resume_after_sigkill_and_sigterm_is_bitwise(
    tmp_path: Path, tiny_model: Path, case: str
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 48)
    job = fsdp_job(tiny_model, data, tmp_path / "runs", **CASES[case])

    reference = new_run(job, "reference")
    out = finish(reference, 1, nproc=2)
    assert "sharded over 2 ranks" in out, out
    expected = final_weights(reference)

    run_uri = new_run(job, "interrupted")
    # a kill with no notice after the checkpoint of step 3 (the workers must go with torchrun's agent)
    code, out, workers = interrupt(run_uri, 1, 2, at_step=4, sig=SIGKILL)
    assert code == -9, out
    assert len(workers) == 2
    assert wait_gone(workers) == [], "a rank outlived the killed torchrun agent"
    # a notice (SIGTERM to torchrun, which forwards it): every rank stops at the same step and saves
    code, out, _ = interrupt(run_uri, 2, 2, at_step=6, sig=SIGTERM)
    assert "preemption notice" in out and "is safe; exiting with code 75" in out, out
    assert code != 0
    store = RunStore(run_uri)
    progress = store.read_progress()
    assert progress["state"] == "preempted" and progress["attempt"] == 2
    newest = store.complete_checkpoints()[-1]
    assert newest.meta["kind"] == "dcp" and newest.meta["world_size"] == 2
    assert newest.step == progress["last_checkpoint_step"] >= 6
    out = finish(run_uri, 3, nproc=2)
    assert f"resumed from checkpoints/step-{newest.step:08d}" in out, out
    assert_bitwise_equal(final_weights(run_uri), expected)


def test_sharded_checkpoint_layout_and_manifest(tmp_path: Path, tiny_model: Path) -> None:
    """Shards of every rank, the small files with sha256, the manifest last; only trainable state.
    With data.packing (each rank collates its packs; the packing check at start runs on every rank)."""
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    job = fsdp_job(tiny_model, data, tmp_path / "runs", train={"max_steps": 4}, checkpoint={"every": 2})
    job["data"]["packing"] = True
    run_uri = new_run(job, "layout")
    assert "packed 32 examples into" in finish(run_uri, 1, nproc=2)
    store = RunStore(run_uri)
    info = store.complete_checkpoints()[-1]
    folder = Path(run_uri) / info.path / info.dir
    names = sorted(p.name for p in folder.iterdir())
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "trainer_state.json"} <= set(names)
    assert {"rng-rank-00000.json", "rng-rank-00001.json"} <= set(names)
    assert set(info.meta["dcp_files"]) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    for name, size in info.meta["dcp_files"].items():
        assert (folder / name).stat().st_size == size
    assert all(len(f["sha256"]) == 64 for f in info.files.values())
    manifest = (Path(run_uri) / info.path / "MANIFEST.json").stat().st_mtime
    assert all((folder / n).stat().st_mtime <= manifest for n in names)
    # LoRA: the DCP metadata names adapter weights only, never the frozen base
    import torch.distributed.checkpoint as dcp

    keys = list(dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata)
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all("lora_" in k for k in model_keys), model_keys
    state = json.loads((folder / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["step"] == info.step


def test_a_torn_sharded_checkpoint_is_skipped(tmp_path: Path, tiny_model: Path) -> None:
    """A shard shorter than its manifest says: the resume falls back to the checkpoint before it."""
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    job = fsdp_job(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 8}, checkpoint={"every": 2, "keep": 3}
    )
    run_uri = new_run(job, "torn")
    interrupt(run_uri, 1, 2, at_step=3, sig=SIGTERM)
    store = RunStore(run_uri)
    older, newest = store.complete_checkpoints()[-2:]
    shard = Path(run_uri) / newest.path / newest.dir / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])
    out = finish(run_uri, 2, nproc=2)
    assert f"not using checkpoint {newest.path}" in out, out
    assert f"resumed from {older.path}" in out, out


def test_supervisor_starts_torchrun_and_reads_rank0_preemption() -> None:
    """nproc > 1 goes through torchrun; its exit code 1 after a forwarded SIGTERM counts as a preemption
    only when rank 0 recorded `preempted` for this very attempt."""
    from types import SimpleNamespace

    from orchestrator.backends.local_supervisor import Supervisor, trainer_command

    assert trainer_command(1, "r", 3)[1:] == ["-m", "trainer", "r", "--attempt", "3"]
    cmd = trainer_command(4, "r", 3)
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--standalone"] and "--nproc-per-node=4" in cmd
    sup = SimpleNamespace(spec=SimpleNamespace(local=SimpleNamespace(nproc=2)), attempt_n=3)
    assert Supervisor.ranks_preempted(sup, 1, {"state": "preempted", "attempt": 3})
    assert not Supervisor.ranks_preempted(sup, 1, {"state": "preempted", "attempt": 2})  # a stale one
    assert not Supervisor.ranks_preempted(sup, 1, {"state": "running", "attempt": 3})  # a crash
    sup.spec.local.nproc = 1
    assert not Supervisor.ranks_preempted(sup, 1, {"state": "preempted", "attempt": 3})

"""The local backend's launch preflight: what the trainer would find only by crashing (and be retried
on) is refused at launch, exit 2, one line, nothing recorded: a LoRA target module the model lacks, a
Hub model that is neither cached nor reachable, local.device: cuda without a GPU. And the trainer
itself ends on such an error once, without a retry."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml
from helpers import ftorch, job_dict, write_data


def _nothing_recorded(tmp_path: Path, home: Path) -> None:
    """No run in the store (launch may have probed that it can write there) and no job in the registry."""
    assert not list((tmp_path / "runs").glob("**/spec.json"))
    registry = home / "registry.db"
    if registry.exists():
        assert sqlite3.connect(registry).execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 0


def _job(tmp_path: Path, model: str, **sections) -> Path:
    data = write_data(tmp_path / "d.jsonl", "instruction", 8)
    job = job_dict(Path(model), data, tmp_path / "runs", **sections)
    job["model"] = model
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.parametrize("targets", [["q_proj", "nonexistent_proj"], ["c_attn"]])
def test_a_missing_target_module_is_refused_at_launch(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path, targets: list[str]
) -> None:
    path = _job(tmp_path, str(tiny_model), lora={"target_modules": targets})
    for command in ("validate", "launch"):
        done = ftorch(command, str(path))
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: lora.target_modules: "), done.stderr
        assert f"{targets[-1]} is not a module of" in lines[0] and "q_proj" in lines[0]  # the valid names
    _nothing_recorded(tmp_path, ftorch_home)


def test_targets_outside_the_layers_and_dotted_suffixes_pass(tmp_path: Path, tiny_model: Path) -> None:
    """lm_head and 'self_attn.o_proj' are modules of a llama (PEFT matches a dotted suffix)."""
    path = _job(tmp_path, str(tiny_model), lora={"target_modules": ["self_attn.o_proj", "lm_head"]})
    done = ftorch("validate", str(path))
    assert done.returncode == 0, done.stderr


def test_the_meta_model_decides_what_the_shape_does_not_know(tiny_model: Path) -> None:
    """A name the shape table does not list is judged on the model built on the meta device."""
    from trainer.model.check import unknown_targets

    cfg = json.loads((tiny_model / "config.json").read_text())
    assert unknown_targets(cfg, ["rotary_emb", "q_proj"])[0] == []  # a module, though not a linear one
    missing, linear = unknown_targets(cfg, ["c_attn", "mlp.up_proj"])
    assert missing == ["c_attn"] and {"q_proj", "gate_proj", "lm_head"} <= set(linear)


def test_a_hub_model_neither_cached_nor_reachable_is_refused(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    path = _job(tmp_path, "acme/not-downloaded")
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    done = ftorch("launch", str(path), env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: model: acme/not-downloaded is not in the Hugging Face cache")
    assert "hf download" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    _nothing_recorded(tmp_path, ftorch_home)


def test_a_hub_model_in_the_cache_launches_offline(tmp_path: Path, tiny_model: Path) -> None:
    """The standard cache's snapshot of a model (config, weights, tokenizer) passes the preflight."""
    from huggingface_hub.file_download import repo_folder_name

    folder = tmp_path / "hf" / "hub" / repo_folder_name(repo_id="acme/tiny", repo_type="model")
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("c" * 40)
    snapshot = folder / "snapshots" / ("c" * 40)
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(tiny_model)
    path = _job(tmp_path, "acme/tiny")
    done = ftorch(
        "validate", str(path), "--json", env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model_source"] == "cache"


def test_device_cuda_without_a_gpu_is_refused(tmp_path: Path, tiny_model: Path, ftorch_home: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    path = _job(tmp_path, str(tiny_model), local={"device": "cuda"})
    done = ftorch("launch", str(path))
    assert done.returncode == 2 and done.stderr.startswith("error: local.device: cuda was asked for"), (
        done.stderr
    )
    _nothing_recorded(tmp_path, ftorch_home)


def test_qlora_without_a_bitsandbytes_for_this_device_is_refused(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    path = _job(tmp_path, str(tiny_model))
    done = ftorch(
        "launch",
        str(path),
        "--set",
        "method=qlora",
        "--set",
        "train.precision=bf16",
        env={"FTORCH_BNB_DEVICES": "cuda"},
    )  # a bitsandbytes build for CUDA only (trainer/model/quant.py's test switch)
    assert done.returncode == 2 and done.stderr.startswith("error: method: qlora cannot run here"), (
        done.stderr
    )
    _nothing_recorded(tmp_path, ftorch_home)


def test_a_model_the_trainer_cannot_load_fails_once_without_retries(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    """config.json in the cache passes the preflight, but the weights are not there and the Hub is off:
    the trainer ends with BAD_CONFIG on its first attempt, and the supervisor does not retry it."""
    import shutil

    from huggingface_hub.file_download import repo_folder_name

    folder = tmp_path / "hf" / "hub" / repo_folder_name(repo_id="acme/config-only", repo_type="model")
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("d" * 40)
    snapshot = folder / "snapshots" / ("d" * 40)
    snapshot.mkdir(parents=True)
    shutil.copy(tiny_model / "config.json", snapshot / "config.json")
    path = _job(tmp_path, "acme/config-only", local={"max_restarts_on_errors": 2, "restart_backoff_s": 0})
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    done = ftorch("launch", str(path), "--follow", env=env, timeout=400)
    assert done.returncode == 3, (done.stdout, done.stderr)  # FAILED
    job_id = done.stdout.splitlines()[0].strip()
    status = json.loads(ftorch("status", job_id, "--json", env=env).stdout)
    assert status["state"] == "FAILED" and status["attempts"] == 1, status
    logs = ftorch("logs", job_id, env=env).stdout
    assert (
        "error: model: acme/config-only: its copy in the Hugging Face cache" in logs
        and "has no weights" in logs
    )
    assert "Traceback" not in logs

"""The words users already use: every problem of a job file in one answer, other tools' names refused
naming ftorch's field, near misses, shorthands, and `ftorch convert` of the axolotl example
docs/convert.md documents."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, ftorch, job_dict, write_data

from orchestrator.errors import SpecError, SpecErrors
from orchestrator.jobfile.spec import load_job, validate_job

DOC = REPO / "docs" / "convert.md"


def _doc_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_an_axolotl_style_file_gets_one_answer_naming_every_field(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 4)
    job: dict[str, Any] = {
        "base_model": str(tiny_model),
        "learning_rate": 2e-4,
        "gradient_accumulation_steps": 4,
        "sequence_len": 512,
        "lora_r": 8,
        "num_epochs": 2,
        "micro_batch_size": 2,
        "data": {"path": str(data)},
        "checkpoint": str(tmp_path / "runs"),
        "train": {"grad_acum": 2},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    done = ftorch("validate", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "error: 8 problems in the job file (fix them all, then run again):", done.stderr
    wanted = {
        "base_model": "ftorch's field is model",
        "learning_rate": "ftorch's field is train.lr",
        "gradient_accumulation_steps": "ftorch's field is train.grad_accum",
        "sequence_len": "ftorch's field is data.max_seq_len",
        "lora_r": "ftorch's field is lora.r",
        "num_epochs": "ftorch's field is train.epochs",
        "micro_batch_size": "train.micro_batch_size",
        "train.grad_acum": "did you mean train.grad_accum?",
    }
    for key, words in wanted.items():
        assert any(line.startswith(f"  {key}: unknown field;") and words in line for line in lines), key
    # 'model: is required' would say nothing new next to base_model's line
    assert not any(line.startswith("  model:") for line in lines)
    assert not (tmp_path / "runs").exists()


def test_one_problem_stays_one_line_with_its_hint() -> None:
    with pytest.raises(SpecError) as caught:
        validate_job({"model": "m", "data": "d", "checkpoint": "c", "epochs": 3}, check_support=False)
    assert not isinstance(caught.value, SpecErrors)
    assert caught.value.field == "epochs"
    assert "did you mean train.epochs?" in caught.value.message and "\n" not in str(caught.value)


def test_string_shorthands_and_skypilot_accelerator_counts(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 4)
    job = {"model": str(tiny_model), "data": "d.jsonl", "checkpoint": "./runs", "output": "./adapter"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    spec = load_job(path)
    assert spec.data.path == str(data)
    assert spec.checkpoint.uri == str(tmp_path / "runs") and spec.output.uri == str(tmp_path / "adapter")
    base = {"model": "llama-3.1-70b", "data": "d", "checkpoint": "c"}
    spec = validate_job({**base, "resources": {"accelerators": ["H100:8", "H200:8"]}}, check_support=False)
    assert spec.resources.accelerators == ["H100", "H200"] and spec.resources.gpus == 8
    for bad, words in (
        ({"accelerators": ["H100:8", "A100:4"]}, "counts disagree (4, 8)"),
        ({"accelerators": ["H100:8"], "gpus": 4}, "counts disagree (4, 8)"),
        ({"accelerators": ["H100:x"]}, "NAME:COUNT"),
    ):
        with pytest.raises(SpecError) as caught:
            validate_job({**base, "resources": bad}, check_support=False)
        assert caught.value.field == "resources.accelerators" and words in caught.value.message


def test_convert_round_trips_the_documented_axolotl_example(tmp_path: Path, tiny_model: Path) -> None:
    source, converted = _doc_blocks()
    assert source == (REPO / "examples" / "axolotl.yml").read_text(encoding="utf-8")
    done = ftorch("convert", "examples/axolotl.yml")
    assert done.returncode == 0, done.stderr
    assert done.stdout == converted, "update docs/convert.md with `ftorch convert examples/axolotl.yml`"
    for key in ("pad_to_sequence_len", "deepspeed", "saves_per_epoch", "wandb_project"):
        assert f"  {key}: " in done.stderr and f"#   {key}: " in done.stdout, key
    # the written job is a ftorch job with the axolotl file's settings
    axolotl = yaml.safe_load(source)
    out = tmp_path / "job.yaml"
    done = ftorch("convert", "examples/axolotl.yml", str(out))
    assert done.returncode == 0 and out.read_text(encoding="utf-8") == converted
    (tmp_path / "data").mkdir()
    write_data(tmp_path / "data" / "alpaca.jsonl", "instruction", 8)
    spec = load_job(out, [f"model={tiny_model}"], check_support=False)  # flash-attn is not installed here
    assert spec.train.attn_implementation == "flash_attention_2" and spec.train.report_to == ["wandb"]
    assert (
        spec.method == "qlora"
        and spec.lora.r == axolotl["lora_r"]
        and spec.lora.target_modules == "all-linear"
    )
    assert spec.train.lr == axolotl["learning_rate"] and spec.train.grad_accum == 4 and spec.train.epochs == 3
    assert spec.train.optimizer == "paged_adamw_8bit" and spec.train.precision == "bf16-mixed"
    assert spec.data.format == "instruction" and spec.data.max_seq_len == 2048 and spec.data.packing
    assert spec.data.eval_fraction == 0.05 and spec.checkpoint.uri == str(tmp_path / "outputs" / "qwen-qlora")
    assert spec.data.path == str(tmp_path / "data" / "alpaca.jsonl")
    done = ftorch("convert", "examples/axolotl.yml", str(out))
    assert done.returncode == 2 and "--force" in done.stderr  # nothing overwritten by surprise


def test_convert_refuses_what_is_not_an_axolotl_mapping(tmp_path: Path) -> None:
    path = tmp_path / "a.yml"
    path.write_text("- a\n- b\n")
    done = ftorch("convert", str(path), str(tmp_path / "job.yaml"))
    assert done.returncode == 2 and done.stderr.startswith("error: AXOLOTL:")
    assert not (tmp_path / "job.yaml").exists()
    path.write_text("base_model: m\nlora_r: 0\ndatasets: [{path: d.jsonl}]\n")
    done = ftorch("convert", str(path))
    assert done.returncode == 2 and "lora.r" in done.stderr


def test_job_dict_helper_still_validates(tmp_path: Path, tiny_model: Path) -> None:
    """The shorthand validators leave the full mappings as they were."""
    data = write_data(tmp_path / "d.jsonl", "instruction", 4)
    spec = validate_job(job_dict(tiny_model, data, tmp_path / "runs"), check_support=False)
    assert spec.checkpoint.uri == str(tmp_path / "runs") and spec.data.path == str(data)

"""The planner counts data.packing: auto by the trainer's rule (trainer/model/attention.py `planned_packing`):
on a CUDA offer, packed where flash-attn is on the image (train.attn_implementation: flash_attention_2,
installed by the task's extra pip), unpacked where it is not (auto and sdpa, counted as SDPA)."""

from __future__ import annotations

from pathlib import Path

from helpers import job_dict, write_data

from orchestrator.backends.skypilot_render import FLASH_ATTN, extra_pip
from orchestrator.jobfile.spec import validate_job
from orchestrator.sizing.memory import settings_from_spec
from orchestrator.sizing.shapes import bundled_shape
from orchestrator.sizing.throughput import accelerator, estimate_time, workload
from trainer.data.packing import packed_count


def _spec(tiny_model: Path, data: Path, tmp_path: Path, attn: str, packing: object = "auto"):  # noqa: ANN202
    job = job_dict(
        tiny_model,
        data,
        tmp_path / "runs",
        data={"format": "text", "max_seq_len": 64, "packing": packing},
        train={"attn_implementation": attn, "micro_batch_size": 2, "max_steps": None, "epochs": 1},
        resources={"backend": "skypilot"},  # an offer's image: flash-attn installed only when asked for
    )
    return validate_job(job, check_support=False)


def test_the_planner_counts_auto_packing_by_the_trainers_rule(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "text", 48)
    flash = _spec(tiny_model, data, tmp_path, "flash_attention_2")
    assert FLASH_ATTN in extra_pip(flash)  # flash-attn on the image: auto packs
    packed = workload(flash)
    assert packed.sequences_per_epoch is not None and packed.sequences_per_epoch < 48
    assert "packed" in packed.source and settings_from_spec(flash).packing is True
    for attn in ("auto", "sdpa"):  # no flash-attn on the image (auto is counted as SDPA): unpacked
        spec = _spec(tiny_model, data, tmp_path, attn)
        assert FLASH_ATTN not in extra_pip(spec)
        plain = workload(spec)
        assert plain.sequences_per_epoch == 48 and "packed" not in plain.source
        assert settings_from_spec(spec).packing is False  # no block mask counted either
    # explicit values keep their meaning: true with SDPA packs and counts the mask; false never packs
    forced = _spec(tiny_model, data, tmp_path, "sdpa", True)
    assert workload(forced).sequences_per_epoch == packed.sequences_per_epoch
    assert settings_from_spec(forced).packing is True
    off = _spec(tiny_model, data, tmp_path, "flash_attention_2", False)
    assert workload(off).sequences_per_epoch == 48 and settings_from_spec(off).packing is False

    # on one A100 offer the packed plan is fewer steps and fewer hours, counted on the same packs
    from orchestrator.sizing.throughput import count_local_tokens

    lengths: list[int] = []
    count_local_tokens(flash.data, lengths)
    assert packed.sequences_per_epoch == packed_count(lengths, 64)
    shape = bundled_shape("meta-llama/Llama-3.1-8B")
    a100 = accelerator("A100")
    assert a100 is not None
    hours = {
        attn: estimate_time(shape, settings_from_spec(spec), 1, workload(spec), a100, 1, "nvlink").hours
        for attn, spec in (("flash", flash), ("auto", _spec(tiny_model, data, tmp_path, "auto")))
    }
    assert packed.steps(2) < workload(_spec(tiny_model, data, tmp_path, "auto")).steps(2)
    assert 0 < hours["flash"] < hours["auto"], hours

"""Issue 32's speed paths, where a CPU can show them: the loss path per job (plain when the logits fit,
chunked when not), the fused kernels' selection and refusal, AdamW's implementation per device, the
fingerprint, the memory estimate's and the time model's terms, and `local.threads: auto`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from helpers import REPO, ftorch, job_dict, write_data

from orchestrator.errors import SpecError
from orchestrator.jobfile.spec import load_job, validate_job
from trainer.checkpoints import fingerprint
from trainer.kernels import CHUNK_ELEMENTS, fused_loss, kernel_problem, loss_path
from trainer.threads import free_cores, thread_count
from trainer.train_step import loss as loss_module

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "lm_head"]}


def _job(tmp_path: Path, tiny_model: Path, **sections: dict) -> dict:
    data = write_data(tmp_path / "d.jsonl", "instruction", 24)
    return job_dict(tiny_model, data, tmp_path / "runs", **sections)


# ---- the loss path ---------------------------------------------------------------------------------------
def test_auto_picks_plain_when_the_logits_fit_in_one_chunk_and_chunked_when_not() -> None:
    vocab = 128256
    fits = CHUNK_ELEMENTS // vocab  # 523 tokens of a 128k vocabulary
    assert loss_path("auto", fits, vocab) == "plain"
    assert loss_path("auto", fits + 1, vocab) == "chunked"
    assert loss_path("auto", 16 * 64, 300) == "plain"  # the quickstart: 16 x 64 tokens, a tiny vocabulary
    assert loss_path("auto", 8 * 2048, vocab) == "chunked"
    for forced in ("plain", "chunked"):
        assert loss_path(forced, 1, 10) == forced and loss_path(forced, 10**6, vocab) == forced


class _HeadCalls:
    """Counts the LM head's forward calls on some tokens (a recomputation in backward is a second call;
    the model's own call with `logits_to_keep` selecting no position is not counted)."""

    def __init__(self, head: torch.nn.Module) -> None:
        self.calls = 0
        self.handle = head.register_forward_hook(self._count)

    def _count(self, _module: object, args: tuple, _output: object) -> None:
        self.calls += int(args[0].numel() > 0)


@pytest.mark.parametrize("method", ["lora", "full"])
def test_the_trainer_step_runs_the_head_once_when_plain_and_per_chunk_twice_when_chunked(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Through trainer.train_step.step.accumulate with train.loss auto: logits that fit run the head once (no
    recomputation in backward); logits over the chunk run it per chunk in the forward and again in the
    backward. The loss and the gradients agree between the two paths."""
    from trainer.data.dataset import load_dataset
    from trainer.model.load import load_model, load_tokenizer
    from trainer.train_step.step import accumulate

    spec = validate_job(_job(tmp_path, tiny_model, method=method, lora=LORA))
    assert spec.train.loss == "auto"
    dataset = load_dataset(spec.data, load_tokenizer(spec), 4, spec.train.seed, {})
    examples = dataset.micro_batch(0)
    device = torch.device("cpu")
    results = {}
    for path, elements in (("plain", CHUNK_ELEMENTS), ("chunked", 8 * 300)):
        monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", elements)
        model = load_model(spec, device)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        vocab = base.config.vocab_size
        tokens = len(examples) * max(len(e.input_ids) for e in examples)
        assert loss_path("auto", tokens, vocab, elements) == path
        counter = _HeadCalls(base.get_output_embeddings())
        loss, _seen = accumulate(model, [examples], spec=spec, device=device, pad_id=dataset.pad_id)
        chunks = -(-tokens // max(1, elements // vocab))
        assert counter.calls == (1 if path == "plain" else 2 * chunks), (path, counter.calls, chunks)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[path] = (loss, grads)
    assert results["chunked"][0] == pytest.approx(results["plain"][0], rel=1e-6)
    for name, grad in results["plain"][1].items():
        torch.testing.assert_close(results["chunked"][1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


# ---- fused kernels: selection and refusal ------------------------------------------------------------------
def test_a_fused_kernel_asked_for_where_it_cannot_run_is_refused_in_one_line(
    tmp_path: Path, tiny_model: Path
) -> None:
    plain_head = {**LORA, "target_modules": ["q_proj", "v_proj"]}
    on_cpu = _job(tmp_path, tiny_model, lora=plain_head, train={"kernels": ["liger_fused_ce"]})
    on_cpu["local"]["device"] = "cpu"
    with pytest.raises(SpecError) as caught:
        validate_job(on_cpu)
    assert caught.value.field == "train.kernels" and "CUDA GPUs only" in caught.value.message
    on_gpu = {**on_cpu, "local": {**on_cpu["local"], "device": "cuda"}}
    with pytest.raises(SpecError) as caught:  # liger-kernel is not installed here
        validate_job(on_gpu)
    assert "needs the liger-kernel package (pip install liger-kernel)" in caught.value.message
    lora_head = {**on_gpu, "lora": LORA}
    with pytest.raises(SpecError) as caught:
        validate_job(lora_head)
    assert "take lm_head out of lora.target_modules" in caught.value.message
    # installed, on a GPU, a plain head: nothing to refuse (the kernel is then what runs)
    assert kernel_problem("liger_fused_ce", "cuda", ["q_proj"], installed=lambda _name: object()) is None
    with pytest.raises(SpecError, match=r"train.kernels\[0\]: .*liger_fused_ce"):  # not a kernel ftorch has
        validate_job(_job(tmp_path, tiny_model, train={"kernels": ["cut_everything"]}))
    # through the CLI: exit 2, one line naming the field
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(on_cpu))
    done = ftorch("launch", str(path))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "train.kernels" in lines[0], done.stderr


def test_the_trainer_refuses_a_kernel_it_cannot_run_and_uses_none_unasked() -> None:
    assert fused_loss([], "cpu") is None and fused_loss([], "cuda") is None
    with pytest.raises(RuntimeError, match=r"^train.kernels: liger_fused_ce runs on CUDA GPUs only"):
        fused_loss(["liger_fused_ce"], "cpu")


# ---- AdamW per device --------------------------------------------------------------------------------------
def test_adamw_is_fused_on_cuda_and_the_loop_elsewhere(tmp_path: Path, tiny_model: Path) -> None:
    from trainer.optim.build import adamw, adamw_impl

    spec = validate_job(_job(tmp_path, tiny_model))
    cpu = [torch.nn.Parameter(torch.zeros(3))]
    assert adamw_impl(cpu) == "loop"
    cuda = [SimpleNamespace(device=torch.device("cuda", 0), is_floating_point=lambda: True)]
    assert adamw_impl(cuda) == "fused"  # the choice only reads the device (no GPU here)
    assert adamw_impl(cuda + cpu) == "loop"  # offloaded state steps on the CPU
    assert adamw(spec, cpu).defaults["foreach"] is False
    assert adamw(spec, cpu, "foreach").defaults["foreach"] is True
    assert adamw(spec, cpu, "fused").defaults["fused"] is True
    from trainer.loop import make_optimizer  # the trainer's optimizer goes through it

    model = torch.nn.Linear(2, 2)
    assert make_optimizer(spec, model).defaults["foreach"] is False


# ---- fingerprint ---------------------------------------------------------------------------------------------
def test_the_loss_path_and_the_kernels_are_fingerprinted(tmp_path: Path, tiny_model: Path) -> None:
    job = validate_job(_job(tmp_path, tiny_model)).model_dump(mode="json")
    recorded = fingerprint.record(job, None)
    assert recorded["fields"]["train.loss"] == "auto" and recorded["fields"]["train.kernels"] == []
    moved = {**job, "train": {**job["train"], "loss": "chunked"}}
    assert [c.field for c in fingerprint.changes(recorded, moved, 5)] == ["train.loss"]
    fused = {**job, "train": {**job["train"], "kernels": ["liger_fused_ce"]}}
    assert [c.field for c in fingerprint.changes(recorded, fused, 5)] == ["train.kernels"]


# ---- memory and time --------------------------------------------------------------------------------------
def test_memory_and_time_count_each_loss_path() -> None:
    from orchestrator.sizing.memory import RAW, Settings, logits_bytes
    from orchestrator.sizing.shapes import bundled_shape
    from orchestrator.sizing.throughput import flops_per_token, path_mfu

    shape = bundled_shape("llama-3.1-8b")
    assert shape is not None
    big = Settings(micro_batch=2, seq_len=4096)  # 8,192 tokens x 128k vocabulary: chunked under auto
    chunk = (1 << 26) // shape.vocab
    assert logits_bytes(shape, big, RAW) == 12 * chunk * shape.vocab
    plain = Settings(micro_batch=2, seq_len=4096, loss="plain")
    assert logits_bytes(shape, plain, RAW) == 12 * 8192 * shape.vocab  # 12 GiB: why auto chunks here
    liger = Settings(micro_batch=2, seq_len=4096, kernels=("liger_fused_ce",))
    # Liger's block: 8192 / ceil(128256 / 4096) = 256 tokens, in 16 bits with its fp32 gradient
    assert logits_bytes(shape, liger, RAW) == 6 * 256 * shape.vocab < logits_bytes(shape, big, RAW)
    small = Settings(micro_batch=1, seq_len=256)  # fits one chunk: plain, the same bytes either way
    assert logits_bytes(shape, small, RAW) == 12 * 256 * shape.vocab

    head = 2.0 * shape.vocab * shape.hidden
    assert flops_per_token(shape, big, 0) - flops_per_token(shape, plain, 0) == pytest.approx(head)
    assert flops_per_token(shape, liger, 0) == flops_per_token(shape, plain, 0)
    assert flops_per_token(shape, small, 0) == flops_per_token(shape, Settings(seq_len=256, loss="plain"), 0)
    assert path_mfu(Settings(attn="flash_attention_2")) == 1.0  # the calibration's stack
    assert path_mfu(Settings(attn="sdpa")) < 1.0 and path_mfu(Settings(attn="eager")) < path_mfu(
        Settings(attn="sdpa")
    )


def test_the_estimate_reads_the_loss_and_kernels_from_the_job(tmp_path: Path, tiny_model: Path) -> None:
    from orchestrator.sizing.memory import settings_from_spec

    job = _job(tmp_path, tiny_model, train={"loss": "plain"})
    s = settings_from_spec(validate_job(job))
    assert s.loss == "plain" and s.kernels == ()


# ---- local.threads: auto ---------------------------------------------------------------------------------
def test_threads_auto_takes_the_free_cores_else_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert thread_count(3) == 3 and thread_count(0) == 0
    assert thread_count("auto", free=1.9) == 2
    assert thread_count("auto", free=1.1) == 1  # one core busy beside it on two cores: one thread
    assert thread_count("auto", free=1.6) == 1  # a half-busy core is not counted
    assert thread_count("auto", free=0.1) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two ranks share the free cores
    assert thread_count("auto", free=4.0) == 2
    import os

    assert 0.0 <= free_cores(0.05) <= (os.cpu_count() or 1)


def test_threads_accepts_auto_and_refuses_other_words(tmp_path: Path, tiny_model: Path) -> None:
    job = _job(tmp_path, tiny_model)
    assert validate_job({**job, "local": {"threads": "auto"}}).local.threads == "auto"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**job, "local": {"threads": "many"}}))
    with pytest.raises(SpecError) as caught:
        load_job(path)
    assert caught.value.field == "local.threads", str(caught.value)
    quickstart = load_job(REPO / "examples" / "quickstart.yaml")
    assert quickstart.local.threads == "auto"


def test_a_cloud_job_installs_the_kernels_it_asks_for(tmp_path: Path, tiny_model: Path) -> None:
    from orchestrator.backends.skypilot_render import extra_pip

    plain_head = {**LORA, "target_modules": ["q_proj", "v_proj"]}
    job = _job(tmp_path, tiny_model, lora=plain_head, train={"kernels": ["liger_fused_ce"]})
    job["resources"] = {"backend": "skypilot", "gpus": 1}
    job["checkpoint"] = {**job["checkpoint"], "uri": "s3://bucket/runs"}
    spec = validate_job(job)  # on a cloud the package is installed there: not refused here
    assert extra_pip(spec).split() == ["liger-kernel==0.8.5"]  # pinned: no open range reaches pip
    assert extra_pip(validate_job({**job, "train": {**job["train"], "kernels": []}})) == ""

"""The lean trainer (what the memory estimate assumes is what runs): the frozen base in the compute dtype,
the loss in chunks without full-vocabulary logits, gradient accumulation normalised by the step's label
tokens, the CUDA allocator's setting recorded, fp16-mixed with its gradient scaler and adafactor working
end to end with exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fsdp_helpers import SIGKILL, finish, fsdp_job, interrupt, max_abs_diff, new_run, output_weights
from helpers import assert_bitwise_equal, final_weights, job_dict, write_data

from trainer.memory import allocator

try:  # before any trainer.model.load.load_model, which hides bitsandbytes from jobs that do not use it
    import bitsandbytes as bnb
except ImportError:  # pragma: no cover - the test extra installs it
    bnb = None
from trainer.runstore.store import RunStore

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "lm_head"]}


def _spec(tmp_path: Path, tiny_model: Path, **sections: dict):
    from orchestrator.jobfile.spec import validate_job

    data = write_data(tmp_path / "d.jsonl", "instruction", 24)
    return validate_job(job_dict(tiny_model, data, tmp_path / "runs", **sections))


def _batches(spec, sizes: list[int]):  # noqa: ANN001, ANN202
    """Global micro-batches of the given sizes, taken in order from the job's data."""
    from trainer.data.dataset import load_dataset
    from trainer.model.load import load_tokenizer

    dataset = load_dataset(spec.data, load_tokenizer(spec), 1, spec.train.seed, {})
    examples = [dataset.micro_batch(i)[0] for i in range(sum(sizes))]
    out, start = [], 0
    for size in sizes:
        out.append(examples[start : start + size])
        start += size
    return out, dataset.pad_id


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


# ---- dtypes --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "precision", "frozen", "trainable"),
    [
        ("lora", "bf16-mixed", torch.bfloat16, torch.float32),
        ("lora", "fp16-mixed", torch.float16, torch.float32),
        ("lora", "bf16", torch.bfloat16, torch.bfloat16),
        ("lora", "fp32", torch.float32, torch.float32),
        ("full", "bf16-mixed", None, torch.float32),
    ],
)
def test_frozen_base_is_in_the_compute_dtype_and_only_trainables_are_fp32(
    tmp_path: Path, tiny_model: Path, method: str, precision: str, frozen: torch.dtype, trainable: torch.dtype
) -> None:
    from trainer.model.load import load_model

    spec = _spec(tmp_path, tiny_model, method=method, lora=LORA, train={"precision": precision})
    model = load_model(spec, torch.device("cpu"))
    params = dict(model.named_parameters())
    assert params and any(p.requires_grad for p in params.values())
    for name, param in params.items():
        wanted = trainable if param.requires_grad else frozen
        assert param.dtype == wanted, (name, param.dtype, wanted)
    if method == "lora":
        assert all("lora_" in n for n, p in params.items() if p.requires_grad)


@pytest.mark.parametrize(
    ("precision", "compute"), [("bf16-mixed", torch.bfloat16), ("fp16-mixed", torch.float16)]
)
def test_qlora_keeps_4bit_weights_and_the_rest_of_the_base_in_the_compute_dtype(
    tmp_path: Path, tiny_model: Path, precision: str, compute: torch.dtype
) -> None:
    if bnb is None:
        pytest.skip("bitsandbytes is not installed")
    from trainer.model.load import load_model

    spec = _spec(
        tmp_path, tiny_model, method="qlora", lora={**LORA, "target_modules": "all-linear"},
        train={"precision": precision, "optimizer": "adamw"},
    )  # fmt: skip
    assert spec.quantization.compute_dtype == {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}[precision]
    model = load_model(spec, torch.device("cpu"))
    packed = {id(m.weight) for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert len(packed) == 2 * 7 and all(
        isinstance(m.weight, bnb.nn.Params4bit) for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)
    )
    kinds = set()
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert "lora_" in name and param.dtype == torch.float32, (name, param.dtype)
            kinds.add("adapter")
        elif id(param) in packed:  # packed 4-bit values, stored in the compute dtype (FSDP shards them)
            assert param.dtype == compute and param.numel() * param.element_size() * 2 < 1e6, name
            kinds.add("4bit")
        else:  # embeddings, norms, lm_head: not quantised, and not upcast to fp32 either
            assert param.dtype == compute, (name, param.dtype)
            kinds.add("16bit")
    assert kinds == {"adapter", "4bit", "16bit"}


# ---- chunked loss ----------------------------------------------------------------------------------------
def test_chunked_loss_and_gradients_equal_the_plain_loss(tmp_path: Path, tiny_model: Path) -> None:
    """fp32: equal to 1e-6 relative (only the summation order of the token losses differs)."""
    from trainer.data.dataset import collate
    from trainer.model.load import load_model
    from trainer.train_step.loss import label_tokens, loss_sum, plain_loss_sum

    spec = _spec(tmp_path, tiny_model, method="full")
    model = load_model(spec, torch.device("cpu"))
    (examples,), pad = _batches(spec, [4])
    batch = collate(examples, pad)
    plain = plain_loss_sum(model, batch)
    plain.backward()
    expected = _grads(model)
    for chunk in (5, None):  # several chunks (the last one short), then the default (one chunk here)
        model.zero_grad(set_to_none=True)
        chunked = loss_sum(model, batch, chunk=chunk)
        chunked.backward()
        torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=0)
        got = _grads(model)
        assert got.keys() == expected.keys() and len(got) == len(list(model.parameters()))
        for name, grad in expected.items():
            torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert plain.item() / label_tokens(examples) > 1.0  # a real loss, not zeros


class _LargestVocabTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """The largest tensor with a vocabulary-sized dimension that any op creates (elements)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(t, torch.Tensor) and self.vocab in t.shape:
                self.largest = max(self.largest, t.numel())
        return out


def test_the_loss_never_creates_full_vocabulary_logits(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.data.dataset import collate
    from trainer.model.load import load_model
    from trainer.train_step import loss as loss_module

    spec = _spec(tmp_path, tiny_model, lora=LORA, train={"precision": "bf16-mixed"})
    model = load_model(spec, torch.device("cpu"))
    (examples,), pad = _batches(spec, [4])
    batch = collate(examples, pad)
    config = model.get_base_model().config
    vocab, hidden = config.vocab_size, config.hidden_size
    logits = batch["input_ids"].numel() * vocab
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 8 * vocab)  # 8 tokens per chunk
    for fn in (loss_module.plain_loss_sum, loss_module.loss_sum):
        with torch.autocast("cpu", dtype=torch.bfloat16), _LargestVocabTensor(vocab) as seen:
            fn(model, batch).backward()
        if fn is loss_module.plain_loss_sum:
            assert seen.largest >= logits  # the plain loss does materialise them: the probe works
        else:  # one chunk's logits, or the head's weight and its gradient
            assert seen.largest <= max(8 * vocab, vocab * hidden) < logits // 10, seen.largest


# ---- gradient accumulation -------------------------------------------------------------------------------
def test_accumulated_gradient_equals_one_big_batch_with_uneven_micro_batches(
    tmp_path: Path, tiny_model: Path
) -> None:
    from trainer.model.load import load_model
    from trainer.train_step.loss import label_tokens
    from trainer.train_step.step import accumulate

    spec = _spec(tmp_path, tiny_model, method="full")
    model = load_model(spec, torch.device("cpu"))
    micro, pad = _batches(spec, [1, 3, 2])
    counts = [label_tokens(m) for m in micro]
    assert len(set(counts)) > 1, counts  # uneven label tokens per micro-batch
    kw = {"spec": spec, "device": torch.device("cpu"), "pad_id": pad}
    big_loss, big_tokens = accumulate(model, [[e for m in micro for e in m]], **kw)
    expected = _grads(model)
    model.zero_grad(set_to_none=True)
    loss, tokens = accumulate(model, micro, **kw)
    assert loss == pytest.approx(big_loss, rel=1e-5)
    assert tokens == sum(len(e.input_ids) for m in micro for e in m) and big_tokens >= tokens  # padding
    for name, grad in expected.items():
        torch.testing.assert_close(_grads(model)[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # the mean of micro-batch means (the old normalisation) is a different gradient: the test can tell
    model.zero_grad(set_to_none=True)
    for m in micro:
        accumulate(model, [m], **kw)
    drift = max(float((g / len(micro) - expected[n]).abs().max()) for n, g in _grads(model).items())
    assert drift > 1e-3, drift


def test_fsdp_accumulation_over_ranks_equals_one_process_with_one_big_batch(
    tmp_path: Path, tiny_model: Path
) -> None:
    """2 ranks x 2 examples x 2 accumulated rounds (trainer/layout.py) == 1 process x 8 examples at once:
    the same examples in every optimizer step, normalised by the step's label tokens over every rank and
    round (a mean of round means would differ: uneven label tokens per round)."""
    data = write_data(tmp_path / "d.jsonl", "instruction", 48)
    sections = {"method": "full", "checkpoint": {"every": 50}}
    sharded = fsdp_job(
        tiny_model,
        data,
        tmp_path / "runs",
        **sections,
        train={"max_steps": 4, "micro_batch_size": 2, "grad_accum": 4},
    )
    single = fsdp_job(
        tiny_model, data, tmp_path / "runs", nproc=1, **sections,
        train={"max_steps": 4, "micro_batch_size": 8, "grad_accum": 1},
    )  # fmt: skip
    a, b = new_run(sharded, "sharded"), new_run(single, "single")
    assert "layout: 2 ranks, 2/rank x 2 accum = 8/step" in finish(a, 1, nproc=2)
    finish(b, 1, nproc=1)
    diff = max_abs_diff(output_weights(a), output_weights(b))
    assert diff < 2e-5, diff


# ---- allocator -------------------------------------------------------------------------------------------
def test_expandable_segments_are_set_unless_the_user_chose_and_recorded_on_cuda() -> None:
    env: dict[str, str] = {}
    allocator.configure(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert allocator.record("cuda", env) == {"setting": "expandable_segments:True", "source": "ftorch"}
    assert allocator.record("cpu", env) is None
    user = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}
    allocator.configure(user)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in user
    assert allocator.record("cuda", user) == {
        "setting": "max_split_size_mb:128",
        "source": "user (PYTORCH_ALLOC_CONF)",
    }


# ---- fp16-mixed with its scaler, adafactor ------------------------------------------------------------
def test_fp16_mixed_with_adafactor_trains_and_resumes_bitwise_with_the_scaler_state(
    tmp_path: Path, tiny_model: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 40)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", lora={**LORA, "dropout": 0.1},
        train={"precision": "fp16-mixed", "optimizer": "adafactor", "max_steps": 8, "max_grad_norm": 1.0},
        checkpoint={"every": 3},
    )  # fmt: skip
    reference = new_run(job, "reference")
    out = finish(reference, 1, nproc=1)
    losses = [float(line.split(" loss ")[1].split()[0]) for line in out.splitlines() if " loss " in line]
    assert len(losses) == 8 and all(x == x and x < 100 for x in losses), out  # finite losses
    run_uri = new_run(job, "killed")
    code, out, _ = interrupt(run_uri, 1, 1, at_step=5, sig=SIGKILL)
    assert code == -9, out
    store = RunStore(run_uri)
    info = store.complete_checkpoints()[-1]
    saved = json.loads(store.read_checkpoint(info)["trainer_state.json"])["extra"]["grad_scaler"]
    assert saved["scale"] > 0 and "_growth_tracker" in saved
    out = finish(run_uri, 2, nproc=1)
    assert f"resumed from checkpoints/step-{info.step:08d}" in out, out
    assert_bitwise_equal(final_weights(run_uri), final_weights(reference))


# ---- what the schema advertises, the planner suggests and launch accepts ----------------------------------
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_the_planners_fp16_suggestion_for_a_t4_is_a_job_launch_accepts(method: str) -> None:
    from orchestrator.jobfile.spec import validate_job
    from orchestrator.sizing.catalog import Catalog, parse_offers
    from orchestrator.sizing.planner import make_plan

    offers = (
        "cloud,instance_type,accelerator,count,gpu_memory_gib,ondemand_usd,spot_usd,regions,interconnect\n"
    )
    offers += "gcp,t4.one,T4,1,15,0.35,0.11,us-central1,n/a\n"
    job = {
        "model": "llama-3.2-1b",
        "method": method,
        "data": {"path": "s3://b/d.jsonl", "max_seq_len": 512, "tokens": 1_000_000},
        "checkpoint": {"uri": "s3://b/ck"},
        "train": {"precision": "bf16-mixed", "gradient_checkpointing": True},
        "resources": {"backend": "skypilot"},
    }
    catalog = Catalog(tuple(parse_offers(offers)), "t4")
    (rejected,) = make_plan(validate_job(job), catalog=catalog).rejected
    assert "use train.precision: fp16-mixed" in rejected.reason
    job["train"] = {**job["train"], "precision": "fp16-mixed", "optimizer": "adafactor"}
    spec = validate_job(job)  # every check launch runs: nothing refused
    assert make_plan(spec, catalog=catalog).chosen is not None
    if method == "qlora":
        assert spec.quantization.compute_dtype == "fp16"


def test_option_checks_name_the_field_and_what_is_valid(tmp_path: Path) -> None:
    from orchestrator.errors import SpecError
    from orchestrator.jobfile.spec import validate_job

    base = {
        "model": "llama-3.2-1b",
        "data": {"path": str(tmp_path / "d.jsonl")},
        "checkpoint": {"uri": str(tmp_path / "ck")},
        "local": {"device": "cpu"},
    }
    with pytest.raises(SpecError, match="train.attn_implementation.*CUDA GPUs only"):
        validate_job({**base, "train": {"attn_implementation": "flash_attention_2"}})
    with pytest.raises(SpecError, match="local.nproc.*'adafactor' runs on 1 GPU"):
        validate_job(
            {**base, "train": {"optimizer": "adafactor", "micro_batch_size": 2}, "local": {"nproc": 2}}
        )
    qlora = {**base, "method": "qlora", "train": {"precision": "fp16-mixed"}}
    with pytest.raises(Exception, match="quantization.compute_dtype: bf16 does not match"):
        validate_job({**qlora, "quantization": {"compute_dtype": "bf16"}})
    # a SkyPilot job installs flash-attn after torch, built against it (outside pip's build isolation)
    from orchestrator.backends.skypilot_render import extra_pip

    cloud = validate_job(
        {**base, "checkpoint": {"uri": "s3://b/ck"}, "data": {"path": "s3://b/d.jsonl", "tokens": 10**6},
         "train": {"attn_implementation": "flash_attention_2"}, "resources": {"backend": "skypilot"}},
        check_support=False,
    )  # fmt: skip
    # pinned: no open range reaches pip
    assert extra_pip(cloud).split() == ["--no-build-isolation", "flash-attn==2.8.3.post2"]

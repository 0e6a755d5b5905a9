"""What point 1 of issue 11 changed, measured on the CPU in one run, side by side.

    .venv/bin/python bench/lean_trainer.py [--vocab 128256] [--tokens 1024]

1. Parameter bytes of a LoRA model (all-linear, r=16) of a small Llama shape under bf16-mixed: the frozen
   base as the trainer loaded it before (fp32) and now (bf16, the compute dtype). Built on the meta device
   (no memory), with the trainer's own dtype rule and PEFT.
2. Peak bytes allocated (CPU allocator, torch profiler) while the loss of one micro-batch runs forward
   and backward, for a tiny body with a long vocabulary: the model's own loss (full fp32 logits) vs
   trainer/train_step/loss.py (the LM head per chunk, recomputed in backward).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from trainer.train_step import loss as lean_loss  # noqa: E402

MIB = 1024 * 1024


def _llama_config(vocab: int, hidden: int, layers: int, inter: int):  # noqa: ANN202
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 256),
        tie_word_embeddings=False,
    )


def parameter_bytes(config, base_dtype: torch.dtype) -> tuple[int, int, int]:  # noqa: ANN001
    """(frozen bytes, trainable bytes, trainable params) of a LoRA model whose base loads in base_dtype."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=base_dtype)
        model = get_peft_model(
            model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
        )
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return frozen, sum(p.numel() * p.element_size() for p in trainable), sum(p.numel() for p in trainable)


def peak_bytes(fn) -> int:  # noqa: ANN001
    """Peak of the CPU allocator's live bytes over fn(), from the profiler's allocation records."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    live = peak = 0
    for event in events:
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens in the micro-batch (2 rows)")
    args = parser.parse_args()

    print("1. LoRA (all-linear, r=16) under bf16-mixed, parameter bytes (meta device)")
    shape = _llama_config(vocab=32000, hidden=2048, layers=16, inter=5632)
    old = parameter_bytes(shape, torch.float32)
    new = parameter_bytes(shape, torch.bfloat16)
    print("   shape: hidden 2048, 16 layers, MLP 5632, vocab 32000")
    for label, (frozen, trainable, count) in (("before (fp32 base)", old), ("now (bf16 base)", new)):
        print(
            f"   {label:20s} frozen {frozen / MIB:8.1f} MiB   trainable {trainable / MIB:6.1f} MiB "
            f"({count:,} params, {trainable // max(1, count)} B each)"
        )
    print(f"   ratio now/before: {(new[0] + new[1]) / (old[0] + old[1]):.3f}")

    print(f"\n2. Loss forward+backward, vocab {args.vocab}, {args.tokens} tokens, fp32 (CPU)")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_llama_config(args.vocab, 64, 1, 128))
    rows = 2
    ids = torch.randint(0, args.vocab, (rows, args.tokens // rows))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    logits_mib = args.tokens * args.vocab * 4 / MIB
    print(
        f"   one fp32 copy of the logits: {logits_mib:.1f} MiB; chunk: {lean_loss.chunk_tokens(args.vocab)} tokens"
    )
    results = {}
    for name, fn in (
        ("plain (model's own loss)", lean_loss.plain_loss_sum),
        ("chunked (trainer/train_step/loss.py)", lean_loss.loss_sum),
    ):
        model.zero_grad(set_to_none=True)
        fn(model, batch).backward()  # warm-up: gradients exist, as in every later micro-batch
        model.zero_grad(set_to_none=False)
        start = time.perf_counter()
        results[name] = peak_bytes(lambda fn=fn: fn(model, batch).backward())
        took = time.perf_counter() - start
        print(
            f"   {name:28s} peak {results[name] / MIB:8.1f} MiB  ({results[name] / MIB / logits_mib:.2f} x one fp32 copy; {took:.1f} s)"
        )
    plain, chunked = results.values()
    print(f"   ratio chunked/plain: {chunked / plain:.3f}")


if __name__ == "__main__":
    main()

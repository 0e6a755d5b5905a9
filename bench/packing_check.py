"""data.packing check: packed examples match the examples alone on every attention implementation the
device has, and how much padding packing removes.

    python bench/packing_check.py            # CPU: sdpa and eager; CUDA: also flash_attention_2 (bf16)

Part 1 builds a small random Llama from a config (no downloads), packs 64 examples of random lengths
(trainer/data/packing.py, 512-token packs) and compares, per attention implementation, each example's last
hidden states inside its pack with the example run alone (max abs difference), runs the trainer's start
check (trainer/train_step/packing_check.py), and compares the packed loss sum with the sum over the examples alone.
flash_attention_2 runs in bf16 with the flattened (varlen) micro-batches the trainer gives it.
Part 2 counts the padding of micro-batches with and without packing for lognormal example lengths
(median 180 tokens, max_seq_len 2048, micro-batch 8): the share of computed tokens that are real.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def isolation(device: str) -> list[tuple[str, float, float, str]]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.data.dataset import Example, collate
    from trainer.data.packing import IGNORE, pack, uses_flat_batches
    from trainer.train_step.loss import hidden_states, loss_sum
    from trainer.train_step.packing_check import verify

    rng = random.Random(0)
    examples = []
    for _ in range(64):
        ids = [rng.randrange(3, 500) for _ in range(rng.randint(8, 200))]
        examples.append(Example(ids, [IGNORE, *ids[1:]]))
    packs = pack(examples, 512)
    attns = ["sdpa", "eager"]
    if device == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        attns.append("flash_attention_2")
    rows = []
    for attn in attns:
        dtype = torch.bfloat16 if attn == "flash_attention_2" else torch.float32
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
        )  # fmt: skip
        config._attn_implementation = attn
        model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
        model.config.use_cache = False
        flat = uses_flat_batches(attn)
        verify(model, flat)
        worst, packed_loss, alone_loss = 0.0, 0.0, 0.0
        with torch.no_grad():
            for i in range(0, len(packs), 4):
                group = packs[i : i + 4]
                batch = collate(group, 0, device, flat=flat)
                hidden = hidden_states(model, batch)
                packed_loss += float(loss_sum(model, batch))
                offset = 0
                for row, p in enumerate(group):
                    start = 0
                    for n in p.lengths:
                        one = collate(
                            [Example(p.input_ids[start : start + n], p.labels[start : start + n])], 0, device
                        )
                        alone = hidden_states(model, one)[0]
                        inside = (
                            hidden[0, offset + start : offset + start + n]
                            if flat
                            else hidden[row, start : start + n]
                        )
                        worst = max(worst, float((inside.float() - alone.float()).abs().max()))
                        alone_loss += float(loss_sum(model, one))
                        start += n
                    offset += len(p.input_ids)
        rows.append((attn, worst, abs(packed_loss - alone_loss) / alone_loss, str(dtype).split(".")[-1]))
    return rows


def padding() -> tuple[float, float, int, int]:
    from trainer.data.packing import plan_packs

    rng = random.Random(1)
    lengths = [min(2048, max(8, int(rng.lognormvariate(5.2, 0.9)))) for _ in range(20000)]
    real = sum(lengths)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    unpacked = sum(8 * max(lengths[j] for j in order[i : i + 8]) for i in range(0, len(order), 8))
    packs = plan_packs(lengths, 2048)
    fill = [sum(lengths[j] for j in p) for p in packs]
    packed = sum(8 * max(fill[i : i + 8]) for i in range(0, len(fill), 8))
    return real / unpacked, real / packed, len(lengths), len(packs)


def main() -> int:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device: {device}; torch {torch.__version__}")
    print(f"{'attention':<18} {'dtype':<9} {'max |packed - alone|':>21} {'loss rel. diff':>15}")
    for attn, worst, loss_diff, dtype in isolation(device):
        print(f"{attn:<18} {dtype:<9} {worst:>21.2e} {loss_diff:>15.2e}")
    unpacked, packed, n, packs = padding()
    print(
        f"\n{n} examples (lognormal, median ~180 tokens) -> {packs} packs of 2048; real tokens / computed "
        f"tokens at micro-batch 8: unpacked {unpacked:.1%}, packed {packed:.1%} ({packed / unpacked:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

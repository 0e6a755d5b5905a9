"""CPU AdamW throughput: the time model's price of the optimizer step under CPU offload.

torch.optim.AdamW (the trainer's optimizer; foreach, the default on CPU tensors) steps N fp32 parameters
on T threads; the figure is bytes of optimizer traffic per second per thread, counting 28 bytes per
parameter (read the parameter, gradient and both moments, write the parameter and both moments).

Usage: python bench/cpu_adamw.py [--params 20000000] [--threads 1 2] [--steps 5]
"""

from __future__ import annotations

import argparse
import time

import torch

BYTES_PER_PARAM = 28


def measure(params: int, threads: int, steps: int) -> float:
    """Bytes per second per thread of AdamW steps over `params` fp32 parameters in 8 tensors."""
    torch.set_num_threads(threads)
    tensors = [torch.nn.Parameter(torch.randn(params // 8)) for _ in range(8)]
    for p in tensors:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(tensors, lr=1e-4, weight_decay=0.01)
    opt.step()  # the states are allocated
    start = time.perf_counter()
    for _ in range(steps):
        opt.step()
    seconds = (time.perf_counter() - start) / steps
    return BYTES_PER_PARAM * params / seconds / threads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=20_000_000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    for threads in args.threads:
        rate = measure(args.params, threads, args.steps)
        print(
            f"threads {threads}: {rate / 1e9:.2f} GB/s per thread ({rate / BYTES_PER_PARAM / 1e6:.0f} M params/s)"
        )


if __name__ == "__main__":
    main()

"""The loss's path (`train.loss`) and the optional fused kernels (`train.kernels`): which path a
micro-batch takes, what each kernel needs, why it cannot run here, and the loss it gives.

`loss_path`: under `auto`, plain (the head in one piece, nothing recomputed) when the micro-batch's logits
fit in one chunk, chunked (trainer/train_step/loss.py) when they would not. Shared with the time model
(orchestrator/sizing/throughput.py), which counts the chunked path's recomputed head.

`liger_fused_ce`: Liger's fused linear cross-entropy (liger-kernel, Triton, CUDA only). It computes the LM
head and the cross-entropy block by block and writes the head's gradient in the forward, so no more than a
block of logits ever exists (like trainer/train_step/loss.py's chunks) and nothing is recomputed in backward. Its
reductions are Triton's: not bitwise equal to the portable paths, and a resume must keep the kernel (the
field is fingerprinted). It applies the head's plain weight: a head that carries LoRA adapters (lm_head in
lora.target_modules) is refused, as is a model scaling its logits (Cohere's logit_scale).

This module imports no torch at module level: trainer/config.py asks it why a job cannot run.
"""

from __future__ import annotations

import importlib.util
from typing import Any

#: logit elements per chunk of the chunked loss: 2**26 is 256 MiB in fp32 (523 tokens for a 128k vocabulary)
CHUNK_ELEMENTS = 1 << 26
#: kernel -> the module it imports (its pip package in `PACKAGES`)
MODULES = {"liger_fused_ce": "liger_kernel"}
PACKAGES = {"liger_fused_ce": "liger-kernel"}


def loss_path(requested: str, tokens: int, vocab: int, elements: int = CHUNK_ELEMENTS) -> str:
    """`plain` or `chunked` for a micro-batch of `tokens` positions: `auto` picks plain when its logits fit
    in one chunk (`elements` logits), where chunking would only add the recomputation."""
    if requested != "auto":
        return requested
    return "plain" if tokens * max(1, vocab) <= elements else "chunked"


def kernel_problem(
    kernel: str, device: str, target_modules: Any = None, installed: Any = importlib.util.find_spec
) -> str | None:
    """Why `kernel` cannot run with `device` ("cpu", "cuda" or "auto"), or None."""
    if device == "cpu":
        return f"{kernel} runs on CUDA GPUs only (Triton); with local.device: cpu leave train.kernels empty"
    if isinstance(target_modules, (list, tuple)) and "lm_head" in target_modules:
        return f"{kernel} applies the output layer's own weight; take lm_head out of lora.target_modules"
    if installed(MODULES[kernel]) is None:
        return f"{kernel} needs the {PACKAGES[kernel]} package (pip install {PACKAGES[kernel]}); or leave train.kernels empty"
    return None


def fused_loss(kernels: list[str], device_type: str) -> Any:
    """The fused loss `trainer.train_step.loss.loss_sum` calls (head, config, hidden, labels) -> sum, or None.
    Raises RuntimeError in one line when a kernel asked for cannot run here."""
    if "liger_fused_ce" not in kernels:
        return None
    problem = kernel_problem("liger_fused_ce", device_type)
    if problem:
        raise RuntimeError(f"train.kernels: {problem}")
    from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

    def liger(head: Any, config: Any, hidden: Any, labels: Any) -> Any:
        import torch

        if not isinstance(head, torch.nn.Linear) or hasattr(head, "lora_A"):  # FSDP2 subclasses Linear
            raise RuntimeError("train.kernels: liger_fused_ce needs a plain nn.Linear output layer")
        scale = getattr(config, "logit_scale", None)
        if isinstance(scale, (int, float)) and scale != 1:
            raise RuntimeError("train.kernels: liger_fused_ce does not apply the model's logit_scale")
        softcap = getattr(config, "final_logit_softcapping", None)
        loss = LigerFusedLinearCrossEntropyLoss(ignore_index=-100, reduction="sum", softcap=softcap or None)
        return loss(head.weight, hidden, labels, head.bias).float()

    return liger

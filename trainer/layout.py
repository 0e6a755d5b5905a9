"""How a job is laid out on N GPUs x M nodes: one rule set for the planner and the trainer (no torch).

The user's numbers mean the same thing on every layout:

- `train.micro_batch_size` is **per GPU**: the most examples one rank runs forward and backward at once
  (what its memory must hold);
- the **effective batch** is `micro_batch_size x grad_accum` **examples (samples) per optimizer step**, and
  it stays that at every GPU count: the trainer splits it over the ranks and accumulates the rest.

On `ranks` GPUs each rank takes `effective / ranks` examples per step, in micro-batches of the largest
divisor of that share not above `micro_batch_size`, accumulated `accum` times. The step's examples are
the same ones, in the same order, on every layout (see `step_micro_batches`), and the data position is
counted in the user's micro-batches (`micro_batch_size` examples each), so a run preempted on 8 GPUs
resumes on 2 or 1 with the same effective batch at the same place in the data.

A layout is refused (with its reason) when the effective batch cannot be split evenly over the ranks, or
when the optimizer cannot run sharded (the bitsandbytes 8-bit optimizers and adafactor run on one GPU). QLoRA shards:
FSDP2 over 4-bit weights stored in the compute dtype (trainer/model/quant.py). `ftorch plan` lists only layouts `layout_for` accepts, and the trainer calls `check` at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the planner's offload choice for `train.offload: auto` (the cloud task sets it: orchestrator/backends/
#: skypilot_render.py; trainer/distributed.py reads it); absent: none
OFFLOAD_ENV = "FTORCH_OFFLOAD"


class LayoutError(ValueError):
    """The job cannot run on this many ranks; the message says why and what would."""


@dataclass(frozen=True)
class Layout:
    nodes: int
    gpus_per_node: int
    micro_batch: int  # examples per rank per forward/backward
    accum: int  # micro-batches per rank per optimizer step
    effective_batch: int  # examples per optimizer step (micro_batch_size x grad_accum of the job)
    unit: int  # the job's micro_batch_size: the data position's unit
    sharding: str  # "none" (one process) | "fsdp" (FSDP2 full shard over all ranks)
    ok: bool = True
    reason: str = ""

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def global_micro_batch(self) -> int:
        """Examples all ranks take together in one accumulation round."""
        return self.micro_batch * self.ranks

    def describe(self) -> str:
        """One short line: '8 ranks (2x4), 2/rank x 1 accum = 16/step, fsdp'."""
        if not self.ok:
            return f"not runnable: {self.reason}"
        where = f"{self.ranks} rank" + ("s" if self.ranks > 1 else "")
        if self.nodes > 1:
            where += f" ({self.nodes}x{self.gpus_per_node})"
        return (
            f"{where}, {self.micro_batch}/rank x {self.accum} accum = {self.effective_batch}/step, "
            f"{self.sharding}"
        )

    def short(self) -> str:
        """For a table column: '2/GPU x4' (+ ' fsdp' when sharded)."""
        return f"{self.micro_batch}/GPU x{self.accum}" + (f" {self.sharding}" if self.ranks > 1 else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "ranks": self.ranks,
            "micro_batch_per_rank": self.micro_batch,
            "grad_accum": self.accum,
            "effective_batch": self.effective_batch,
            "sharding": self.sharding,
            "ok": self.ok,
            "reason": self.reason,
        }

    def step_micro_batches(self, dataset: Any, first_unit: int) -> list[list[Any]]:
        """The `accum` global micro-batches of the optimizer step that starts at data position
        `first_unit` (counted in the job's micro-batches): the step's examples in order, cut into
        `global_micro_batch` pieces. Every rank then keeps its contiguous `micro_batch` slice."""
        size = self.global_micro_batch
        out: list[list[Any]] = []
        for k in range(self.accum):
            lo, hi = k * size, (k + 1) * size
            first, last = lo // self.unit, (hi - 1) // self.unit
            examples = [e for u in range(first, last + 1) for e in dataset.micro_batch(first_unit + u)]
            start = lo - first * self.unit
            out.append(examples[start : start + size])
        return out


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def layout_for(spec: Any, gpus_per_node: int = 1, nodes: int = 1, max_micro: int | None = None) -> Layout:
    """The layout of `spec` (a JobSpec) on `gpus_per_node` x `nodes` GPUs; `ok` False says why not.
    `max_micro` caps the examples per rank below `micro_batch_size` (an out-of-memory adaptation,
    trainer/train_step/oom.py): the accumulation grows, the effective batch, the data unit and the step's examples
    stay."""
    mbs, accum = spec.train.micro_batch_size, spec.train.grad_accum
    effective = mbs * accum
    ranks = gpus_per_node * nodes
    sharding = "fsdp" if ranks > 1 else "none"

    def refuse(reason: str) -> Layout:
        return Layout(nodes, gpus_per_node, mbs, accum, effective, mbs, sharding, False, reason)

    if ranks < 1:
        return refuse("needs at least one GPU")
    # bitsandbytes' 8-bit states are not sharded by FSDP; torch's Adafactor updates its factored state in
    # place, which DTensor shards refuse
    if ranks > 1 and spec.train.optimizer in ("adamw_8bit", "paged_adamw_8bit", "adafactor"):
        return refuse(
            f"train.optimizer '{spec.train.optimizer}' runs on 1 GPU (its states are not sharded by FSDP); "
            "use adamw to shard"
        )
    # CPU offload is FSDP2's (one rank: a world of one), so the same optimizers are refused with it
    if getattr(spec.train, "offload", "none") == "params" and spec.train.optimizer in (
        "adamw_8bit",
        "paged_adamw_8bit",
        "adafactor",
    ):
        return refuse(
            f"train.offload '{spec.train.offload}' steps the optimizer on FSDP's sharded parameters; "
            f"train.optimizer '{spec.train.optimizer}' cannot (use adamw or sgd)"
        )
    # ---- optimizer step in backward (trainer/optim/in_backward.py) ----
    if getattr(spec.train, "optimizer_in_backward", False):
        if ranks > 1:
            return refuse(
                "train.optimizer_in_backward runs on 1 GPU (one process; its per-parameter steps are not "
                "sharded by FSDP); set it to false to shard"
            )
        if accum > 1:
            return refuse(
                f"train.grad_accum must be 1 with train.optimizer_in_backward (got {accum}); "
                "raise train.micro_batch_size instead"
            )
    # ---- end optimizer step in backward ----
    if effective % ranks:
        fits = [n for n in (1, 2, 4, 8, 16, 32, 64) if effective % n == 0 and n <= effective]
        return refuse(
            f"the effective batch ({mbs} x {accum} = {effective} examples per step) does not split "
            f"evenly over {ranks} ranks; it does over {', '.join(map(str, fits))}"
        )
    share = effective // ranks
    micro = _largest_divisor_at_most(share, min(mbs, max_micro or mbs))
    return Layout(nodes, gpus_per_node, micro, share // micro, effective, mbs, sharding)


def total_steps(
    sequences: int, micro_batch_size: int, grad_accum: int, epochs: float, max_steps: int | None = None
) -> int:
    """Optimizer steps of a job whose epoch holds `sequences` training sequences (examples, or packs with
    data.packing): whole micro-batches per epoch x epochs, then whole steps. The trainer's count, and the
    planner's (orchestrator/sizing/throughput.py) on its estimate of the sequences."""
    if max_steps:
        return max_steps
    return max(1, int(epochs * (sequences // micro_batch_size) // grad_accum))


def check(spec: Any, ranks: int, gpus_per_node: int | None = None, max_micro: int | None = None) -> Layout:
    """The trainer's check at start: the layout for `ranks` processes, or LayoutError with the reason."""
    per_node = gpus_per_node if gpus_per_node and ranks % gpus_per_node == 0 else ranks
    layout = layout_for(spec, per_node, ranks // per_node, max_micro)
    if not layout.ok:
        raise LayoutError(f"train: cannot run on {ranks} rank(s): {layout.reason}")
    return layout


def halved(layout: Layout) -> Layout | None:
    """The same job with about half the examples per rank (the largest divisor of the rank's share at
    most half the micro-batch) and the accumulation grown to keep the effective batch; None at 1."""
    if layout.micro_batch <= 1:
        return None
    share = layout.micro_batch * layout.accum
    micro = _largest_divisor_at_most(share, layout.micro_batch // 2)
    return Layout(
        layout.nodes, layout.gpus_per_node, micro, share // micro, layout.effective_batch, layout.unit,
        layout.sharding,
    )  # fmt: skip

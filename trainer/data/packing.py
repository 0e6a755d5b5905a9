"""`data.packing`: tokenised examples packed into sequences of `data.max_seq_len` tokens, kept apart.

Which examples share a sequence is decided once, from the example lengths alone (best-fit decreasing:
longest first, each into the fullest pack it still fits, ties by file order), so the packs are a pure
function of the data and max_seq_len; the epoch order of the packs is the data's usual (seed, epoch)
permutation (trainer/data/dataset.py). Nothing about packing is stored: resuming recomputes the same packs and
the step number says where the data stands, so exact resume is untouched. The planner counts the same
packs on its estimated lengths (`packed_count`): one formula for steps per epoch everywhere.

Inside a pack, each example keeps to itself:
- position ids restart at 0 for each example;
- attention stays within an example: transformers (masking_utils) derives a block-diagonal causal mask
  from restarting position ids when no 2D attention mask is given (sdpa, eager); flash_attention_2 takes
  the same position ids in one flattened row per micro-batch (its varlen path, `flat=True`);
- the first token of an example is never a target of the previous example's last token (its label is
  masked), so a pack holds exactly the label tokens of its examples.

A model whose attention ignores those position ids (e.g. ALiBi models such as Bloom) would let examples
see each other; trainer/train_step/packing_check.py checks this on the loaded model before training (exit 2).

This module imports no torch at module level: the planner (orchestrator/sizing/throughput.py) imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

IGNORE = -100  # the label that carries no loss (trainer/data/dataset.py's IGNORE)


# ---- which examples go together (torch-free; shared with the planner) -----------------------------------
def plan_packs(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Example indices per pack: best-fit decreasing into packs of `capacity` tokens (each length must be
    at most `capacity`; the trainer truncates first). Deterministic; O(n log capacity).

    A segment tree over the free space 1..capacity holds, at leaf s, s when some open pack has exactly s
    tokens free (and always at leaf capacity: a fresh pack), so the smallest free space that still takes
    an example is found by one descent."""
    size = 1
    while size < capacity:
        size *= 2
    tree = [0] * (2 * size)

    def set_leaf(space: int, value: int) -> None:
        i = size + space - 1
        tree[i] = value
        i //= 2
        while i:
            left, right = tree[2 * i], tree[2 * i + 1]
            best = left if left > right else right
            if tree[i] == best:  # nothing above changes
                break
            tree[i] = best
            i //= 2

    def best_fit(length: int) -> int:
        i = 1
        while i < size:
            i = 2 * i if tree[2 * i] >= length else 2 * i + 1
        return i - size + 1

    set_leaf(capacity, capacity)
    open_by_space: dict[int, list[int]] = {}
    packs: list[list[int]] = []
    by_length = list(lengths)
    for index in sorted(
        range(len(by_length)), key=by_length.__getitem__, reverse=True
    ):  # stable: ties in order
        length = by_length[index]
        if not 0 < length <= capacity:
            raise ValueError(f"example {index} has {length} tokens; packs hold 1 to {capacity}")
        space = best_fit(length)
        if space == capacity:  # no open pack takes it
            pack = len(packs)
            packs.append([])
        else:
            waiting = open_by_space[space]
            pack = waiting.pop()
            if not waiting:
                del open_by_space[space]
                set_leaf(space, 0)
        packs[pack].append(index)
        left = space - length
        if left:
            open_by_space.setdefault(left, []).append(pack)
            set_leaf(left, left)
    return [sorted(members) for members in packs]


def packed_count(lengths: Sequence[int], capacity: int) -> int:
    """How many packs `lengths` make: the sequences an epoch of a packed job has."""
    return len(plan_packs([min(capacity, max(1, n)) for n in lengths], capacity))


# ---- packed examples --------------------------------------------------------------------------------
@dataclass
class Packed:
    """Several examples in one sequence (`lengths`: theirs, in order). It is an Example to the sampler
    and the loss; `collate` gives it its position ids."""

    input_ids: list[int]
    labels: list[int]
    lengths: tuple[int, ...]


def pack(examples: Sequence[Any], capacity: int) -> list[Packed]:
    """The examples (input_ids, labels) as packs of at most `capacity` tokens (order: `plan_packs`)."""
    packs = []
    for members in plan_packs([len(e.input_ids) for e in examples], capacity):
        ids: list[int] = []
        labels: list[int] = []
        for j in members:
            ids += examples[j].input_ids
            labels += [IGNORE, *examples[j].labels[1:]]  # the boundary: not predicted across examples
        packs.append(Packed(ids, labels, tuple(len(examples[j].input_ids) for j in members)))
    return packs


def example_count(sequences: Sequence[Any]) -> int:
    """Examples in a training set that may be packed (a pack counts its examples)."""
    return sum(len(s.lengths) if isinstance(s, Packed) else 1 for s in sequences)


def positions(lengths: Sequence[int]) -> list[int]:
    return [p for n in lengths for p in range(n)]


def uses_flat_batches(attn_implementation: str) -> bool:
    """flash_attention_2 reads packed sequences from position ids in a single row (varlen)."""
    return attn_implementation.startswith("flash_attention")


# ---- data.packing: auto (torch-free; the trainer and the planner call the same rule) ------------------
#: why `auto` stays off with SDPA and eager (docs/data.md)
NEEDS_A_MASK = (
    "packing with {attn} needs a block-diagonal mask, which costs memory and takes SDPA off its flash "
    "kernel: not faster"
)


def resolve_packing(
    requested: bool | str, attn_implementation: str, isolated: str | None = None
) -> tuple[bool, str]:
    """data.packing as this attempt runs it, and why: true and false as given; `auto` on only where
    packing is exact and faster, with flash_attention_2 (its varlen kernel reads the packed position ids;
    no mask) and a model that keeps packed examples apart. `attn_implementation` is the resolved one
    (trainer/model/attention.py); `isolated` is the packing check's refusal (trainer/train_step/
    packing_check.py), None when the model passed or was not checked (the planner)."""
    if requested != "auto":
        return bool(requested), f"data.packing: {'true' if requested else 'false'}"
    if not uses_flat_batches(attn_implementation):
        return False, "data.packing: auto is off: " + NEEDS_A_MASK.format(attn=attn_implementation)
    if isolated is not None:
        return False, f"data.packing: auto is off: the packing check failed ({isolated})"
    return True, f"data.packing: auto is on ({attn_implementation} reads packed sequences exactly)"


def mask_bytes(micro_batch: int, seq_len: int, attn_implementation: str, compute_bytes: int) -> int:
    """What packing adds to a step's memory: the block-diagonal mask transformers builds from the position
    ids, one boolean per query-key pair and row (micro_batch x seq_len^2), and for sdpa the kernel's copy
    as an additive bias in the compute dtype. Eager attention builds a mask of that size with or without
    packing (the estimate counts it already); flash attention reads the position ids and needs none."""
    if uses_flat_batches(attn_implementation):
        return 0
    per_pair = 1 + (compute_bytes if attn_implementation == "sdpa" else 0)
    return micro_batch * seq_len * seq_len * per_pair


def collate(
    examples: Sequence[Packed], pad_id: int, device: Any = "cpu", flat: bool = False
) -> dict[str, Any]:
    """A packed micro-batch: input ids, labels and position ids, and no 2D attention mask (it would hide
    the packing from transformers). Rows are right-padded to the longest pack, the padding being a
    sequence of its own; with `flat`, all packs are one row without padding."""
    import torch

    if flat:
        ids = [t for e in examples for t in e.input_ids]
        labels = [t for e in examples for t in e.labels]
        pos = [p for e in examples for p in positions(e.lengths)]
        rows = [(ids, labels, pos)]
    else:
        width = max(len(e.input_ids) for e in examples)
        rows = []
        for e in examples:
            pad = width - len(e.input_ids)
            rows.append(
                (
                    e.input_ids + [pad_id] * pad,
                    e.labels + [IGNORE] * pad,
                    positions(e.lengths) + list(range(pad)),
                )
            )
    batch = {
        "input_ids": torch.tensor([r[0] for r in rows], dtype=torch.long),
        "labels": torch.tensor([r[1] for r in rows], dtype=torch.long),
        "position_ids": torch.tensor([r[2] for r in rows], dtype=torch.long),
    }
    return {key: value.to(device) for key, value in batch.items()}

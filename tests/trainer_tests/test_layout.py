"""The layout rules (trainer/layout.py): one effective batch on every GPU count, the same examples per
optimizer step on every layout, refusals with reasons, and the planner offering only accepted layouts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.jobfile.spec import SpecError, validate_job
from orchestrator.sizing.catalog import Catalog, parse_offers
from orchestrator.sizing.planner import interruption_rate, make_plan
from trainer.layout import LayoutError, check, layout_for


def spec(**train: Any) -> Any:
    over = {k: v for k, v in train.items() if k in ("method", "resources", "local")}
    base = {"micro_batch_size": 2, "grad_accum": 8, "precision": "bf16-mixed", "optimizer": "adamw"}
    base.update({k: v for k, v in train.items() if k not in over})
    job = {
        "model": "llama-3.1-8b",
        "method": over.get("method", "lora"),
        "data": {"path": "s3://b/d.jsonl", "max_seq_len": 2048, "tokens": 20_000_000},
        "checkpoint": {"uri": "s3://b/ck"},
        "train": base,
        "resources": over.get("resources", {"backend": "skypilot"}),
    }
    return validate_job(job, check_support=False)


@pytest.mark.parametrize("ranks", [1, 2, 4, 8, 16])
def test_the_effective_batch_is_kept_on_every_gpu_count(ranks: int) -> None:
    layout = layout_for(spec(), ranks)
    assert layout.ok and layout.effective_batch == 16
    assert layout.micro_batch <= 2  # micro_batch_size is per GPU: never more on one rank
    assert layout.micro_batch * layout.accum * layout.ranks == 16
    assert layout.sharding == ("none" if ranks == 1 else "fsdp")


def test_layouts_across_nodes_and_uneven_shares() -> None:
    two_nodes = layout_for(spec(grad_accum=16), 8, nodes=2)
    assert (two_nodes.ranks, two_nodes.micro_batch, two_nodes.accum) == (16, 2, 1)
    assert "16 ranks (2x8)" in two_nodes.describe()
    odd = layout_for(spec(micro_batch_size=4, grad_accum=3), 2)  # 6 per rank, at most 4 at once: 3 x 2
    assert (odd.micro_batch, odd.accum) == (3, 2)
    refused = layout_for(spec(micro_batch_size=2, grad_accum=2), 8)
    assert (
        not refused.ok
        and "2 x 2 = 4 examples per step" in refused.reason
        and "over 8 ranks" in refused.reason
    )
    with pytest.raises(LayoutError, match="cannot run on 8 rank"):
        check(spec(micro_batch_size=2, grad_accum=2), 8)


def test_qlora_shards_and_8bit_optimizers_run_on_one_gpu_only() -> None:
    qlora = spec(method="qlora", precision="bf16")
    assert layout_for(qlora, 1).ok and layout_for(qlora, 4).ok  # FSDP over the 4-bit base
    paged = spec(method="qlora", precision="bf16", optimizer="paged_adamw_8bit")
    assert layout_for(paged, 1).ok
    assert "'paged_adamw_8bit' runs on 1 GPU" in layout_for(paged, 2).reason
    assert "runs on 1 GPU" in layout_for(spec(optimizer="adamw_8bit"), 4).reason


@dataclass
class Units:
    """A stand-in dataset: micro-batch i of the job (micro_batch_size examples) is [i*mbs, ...)."""

    mbs: int

    def micro_batch(self, index: int) -> list[int]:
        return list(range(index * self.mbs, (index + 1) * self.mbs))


@pytest.mark.parametrize(("mbs", "accum"), [(2, 8), (4, 3), (1, 16), (3, 4)])
def test_every_layout_sees_the_same_examples_per_step(mbs: int, accum: int) -> None:
    job = spec(micro_batch_size=mbs, grad_accum=accum)
    data = Units(mbs)
    for step in range(3):
        first = step * accum  # the data position after `step` steps, in the job's micro-batches
        expected = list(range(first * mbs, (first + accum) * mbs))
        for ranks in (1, 2, 3, 4, 8, 16):
            layout = layout_for(job, ranks)
            if not layout.ok:
                continue
            rounds = layout.step_micro_batches(data, first)
            assert len(rounds) == layout.accum
            assert all(len(r) == layout.global_micro_batch for r in rounds)
            assert [e for r in rounds for e in r] == expected, (ranks, layout)


def test_the_job_file_check_uses_the_same_rules() -> None:
    with pytest.raises(SpecError) as caught:
        validate_job(
            {
                "model": "x",
                "data": {"path": "s3://b/d.jsonl"},
                "checkpoint": {"uri": "s3://b/ck"},
                "method": "qlora",
                "train": {"precision": "bf16", "optimizer": "adamw_8bit"},
                "local": {"nproc": 2},
            }
        )
    assert caught.value.field == "local.nproc" and "'adamw_8bit' runs on 1 GPU" in str(caught.value)


OFFERS = (
    "cloud,instance_type,accelerator,count,gpu_memory_gib,ondemand_usd,spot_usd,regions,interconnect\n"
    "aws,a100.one,A100-80GB,1,80,3.30,1.60,us-east-1,n/a\n"
    "aws,h100.x8,H100,8,80,90.0,24.0,us-east-1,NVLink\n"
)


def test_the_planner_offers_only_layouts_the_trainer_accepts() -> None:
    offers = Catalog(tuple(parse_offers(OFFERS)), "test")
    small = {"micro_batch_size": 1, "grad_accum": 16, "gradient_checkpointing": True}
    qlora = make_plan(
        spec(method="qlora", precision="bf16", optimizer="paged_adamw_8bit", **small), catalog=offers
    )
    assert [c.instance_type for c in qlora.candidates] == ["a100.one"]
    assert {r.instance_type: r.reason for r in qlora.rejected}["h100.x8"].startswith(
        "layout: train.optimizer 'paged_adamw_8bit' runs on 1"
    )
    full = spec(method="full", grad_accum=16, resources={"backend": "skypilot", "nodes": 2, "gpus": 8})
    plan = make_plan(full, catalog=offers)
    assert plan.chosen is not None and plan.chosen.nodes == 2 and plan.chosen.ranks == 16
    assert plan.chosen.hourly_usd == pytest.approx(2 * 24.0)  # both nodes are paid for
    h100 = next(o for o in offers.offers if o.instance_type == "h100.x8")
    # both nodes can be interrupted, but together more often than apart (orchestrator/spot/hazards.py)
    one = interruption_rate(h100)
    assert plan.chosen.interruption_rate_per_hour == pytest.approx(interruption_rate(h100, 2))
    assert one < plan.chosen.interruption_rate_per_hour < 2 * one
    for cand in plan.candidates:
        check(full, cand.ranks, cand.count)  # the trainer's own check accepts every candidate
    layout = plan.to_json()["chosen"]["layout"]
    assert layout == {
        "nodes": 2,
        "gpus_per_node": 8,
        "ranks": 16,
        "micro_batch_per_rank": 2,
        "grad_accum": 1,
        "effective_batch": 32,
        "sharding": "fsdp",
        "ok": True,
        "reason": "",
    }

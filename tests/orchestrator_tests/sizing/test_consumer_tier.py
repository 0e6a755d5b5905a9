"""The consumer tier: RTX GeForce/workstation cards from SkyPilot's RunPod and Vast catalogs, PCIe only,
with datasheet figures in the time model, chosen when they are the cheapest adequate offer."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, ftorch
from support.planner_jobs import HEADER, job

from orchestrator.sizing import catalog as cat
from orchestrator.sizing.catalog import Catalog, parse_offers
from orchestrator.sizing.planner import make_plan
from orchestrator.sizing.sky_names import check_sky_name
from orchestrator.sizing.throughput import CONSUMER, accelerator

NAMED = {"RTX3090", "RTX4090", "RTX5090", "RTXA4000", "RTXA4500", "RTXA5000", "RTXA6000"}
ADA = {"RTX2000-Ada", "RTX4000-Ada", "RTX6000-Ada"}


def _build_script() -> Any:
    spec = importlib.util.spec_from_file_location("build_catalog", REPO / "scripts" / "build_catalog.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lora(model: str, **resources: Any) -> Any:
    train = {
        "precision": "bf16",
        "optimizer": "adamw",
        "gradient_checkpointing": True,
        "micro_batch_size": 1,
        "grad_accum": 8,
    }
    return job(model=model, method="lora", train=train, resources={"backend": "skypilot", **resources})


def test_the_bundled_catalog_carries_the_tier_pcie_and_on_demand_only():
    offers = [o for o in cat.bundled_catalog().offers if o.tier == "consumer"]
    by_card = {o.accelerator for o in offers}
    assert by_card >= NAMED | ADA
    assert {o.cloud for o in offers} >= {"runpod", "vast", "lambda"}  # Lambda's A6000 is a workstation card
    new = [o for o in offers if o.cloud in ("runpod", "vast")]
    assert all(o.interconnect == "PCIe" and not o.nvlink for o in new)
    assert all(o.spot_usd is None and o.ondemand_usd for o in new)  # no marketplace spot quote
    assert all(o.vcpus is None and o.memory_gib is None for o in new if o.cloud == "vast")  # placeholders
    rtx4090 = [o for o in new if o.accelerator == "RTX4090"]
    assert {o.cloud for o in rtx4090} == {"runpod", "vast"} and all(
        23.9 <= o.gpu_memory_gib <= 24 for o in rtx4090
    )
    assert all(
        o.tier == "datacenter" for o in cat.bundled_catalog().offers if o.accelerator in ("L40S", "A100")
    )


def test_every_consumer_card_has_sourced_figures_and_a_skypilot_name():
    build = _build_script()
    assert {a.name for a in CONSUMER} == build.CONSUMER_CARDS
    assert {n.lower() for n in build.CONSUMER_CARDS} <= cat.CONSUMER_TIER
    for card in build.CONSUMER_CARDS:
        acc = accelerator(card)
        assert acc is not None and acc.bf16 and acc.source and "GB/s" in acc.source, card
        assert check_sky_name(card) == card  # SkyPilot's RunPod/Vast catalogs use these names
    # datasheet figures are dense: GeForce at FP32 accumulate (half of FP16 accumulate), sparse ones halved
    assert (accelerator("RTX4090").tflops_16bit, accelerator("RTX4090").hbm_gbps) == (165.2, 1008)
    assert (accelerator("RTX3090").tflops_16bit, accelerator("RTXA6000").tflops_16bit) == (71, 154.8)
    assert abs(accelerator("RTXA6000").tflops_16bit - accelerator("A6000").tflops_16bit) < 1  # Lambda's name
    assert accelerator("RTX6000").bf16 is False  # Turing Quadro (Lambda): fp16 only


def test_a_sharded_job_needs_nvlink_unless_allow_pcie():
    offers = HEADER + "runpod,2x_RTX4090_SECURE,RTX4090,2,24,1.48,,EU-RO-1,PCIe\n"
    given = Catalog(tuple(parse_offers(offers)), "test catalog")
    spec = lora("llama-3.1-8b", spot=False, gpus=2)
    plan = make_plan(spec, catalog=given)
    assert plan.chosen is None
    (rejection,) = plan.rejected
    assert rejection.reason.startswith("interconnect: sharding over 2 GPUs needs NVLink, this is PCIe")
    assert "resources.allow_pcie: true" in rejection.reason
    allowed = make_plan(lora("llama-3.1-8b", spot=False, gpus=2, allow_pcie=True), catalog=given)
    assert allowed.chosen is not None and allowed.chosen.instance_type == "2x_RTX4090_SECURE"
    assert allowed.chosen.interconnect == "PCIe" and allowed.chosen.ranks == 2


def test_a_consumer_card_wins_only_when_it_is_the_cheapest_adequate_offer():
    offers = HEADER + (
        "runpod,1x_RTX4090_SECURE,RTX4090,1,24,0.74,,EU-RO-1,PCIe\n"
        "aws,g6e.xlarge,L40S,1,44.7,1.86,{spot},us-east-1,n/a\n"
    )
    spec = lora("llama-3.2-3b", spot=True, fallback="on-demand")
    cheap_dc = make_plan(spec, catalog=Catalog(tuple(parse_offers(offers.format(spot="0.10"))), "t"))
    assert cheap_dc.chosen.accelerator == "L40S" and not any(n.startswith("tier:") for n in cheap_dc.notes)
    dear_dc = make_plan(spec, catalog=Catalog(tuple(parse_offers(offers.format(spot="3.00"))), "t"))
    assert dear_dc.chosen.accelerator == "RTX4090" and not dear_dc.chosen.spot
    (note,) = [n for n in dear_dc.notes if n.startswith("tier:")]
    assert "consumer card RTX4090" in note and "PCIe, no NVLink" in note and "no spot quote" in note
    assert "cheapest datacenter offer, aws g6e.xlarge (L40S)" in note
    dear = Catalog(tuple(parse_offers(offers.format(spot="3.00"))), "t")
    spot_only = make_plan(lora("llama-3.2-3b", spot=True, fallback="none"), catalog=dear)
    assert spot_only.chosen.accelerator == "L40S"
    (rejected,) = [r for r in spot_only.rejected if r.accelerator == "RTX4090"]
    assert rejected.reason.startswith("price: no spot price")


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(lora("llama-3.2-1b", spot=False), id="1b-lora"),
        pytest.param(lora("llama-3.2-3b", spot=False), id="3b-lora"),
        pytest.param(
            job(model="llama-3.1-8b", resources={"backend": "skypilot", "spot": False}), id="8b-qlora"
        ),
    ],
)
def test_on_the_bundled_catalog_small_lora_and_8b_qlora_on_demand_pick_a_consumer_card(spec: Any):
    """On demand (where consumer cards are sold: they have no spot quotes) a consumer card is the
    cheapest adequate offer for small jobs. With spot allowed, a datacenter card's spot price in the
    region a launch tries first is lower still (L4 spot in eu-south-2, $0.12/h) and wins:
    the plan prices the region it lands in (test_plan_costs.py)."""
    plan = make_plan(spec)
    chosen = plan.chosen
    assert chosen is not None and chosen.accelerator.lower() in cat.CONSUMER_TIER, chosen
    assert chosen.count == 1 and chosen.expected_cost_usd == plan.candidates[0].expected_cost_usd
    datacenter = [c for c in plan.candidates if c.accelerator.lower() not in cat.CONSUMER_TIER]
    assert datacenter and datacenter[0].expected_cost_usd > chosen.expected_cost_usd
    assert any(n.startswith(f"tier: consumer card {chosen.accelerator}") for n in plan.notes)
    with_spot = make_plan(spec.model_copy(update={"resources": spec.resources.model_copy(
        update={"spot": True, "fallback": "on-demand"})}))  # fmt: skip
    assert with_spot.chosen is not None and with_spot.chosen.spot
    assert with_spot.chosen.expected_cost_usd < chosen.expected_cost_usd


def test_ftorch_plan_shows_why_a_consumer_card_was_chosen(tmp_path: Path):
    job_file = tmp_path / "small.yaml"
    job_file.write_text(
        "model: llama-3.2-1b\nmethod: lora\n"
        "data: {path: 's3://b/d.jsonl', max_seq_len: 2048, tokens: 20000000}\n"
        "checkpoint: {uri: 's3://b/ck'}\n"
        "train: {precision: bf16, optimizer: adamw, gradient_checkpointing: true, micro_batch_size: 1, "
        "grad_accum: 8}\n"
        "resources: {backend: skypilot, spot: false, clouds: [runpod, aws, gcp]}\n"
    )
    out = ftorch("plan", str(job_file), "--offline", "--no-trace")
    assert out.returncode == 0, out.stderr
    assert "tier: consumer card RTX" in out.stdout and "cheapest adequate offer" in out.stdout
    data = json.loads(ftorch("plan", str(job_file), "--offline", "--no-trace", "--json").stdout)
    assert data["chosen"]["cloud"] == "runpod" and data["chosen"]["accelerator"].lower() in cat.CONSUMER_TIER

"""The planner tests' fixed catalog and job builder, shared by the planner, history, consumer-tier and
checkpoint-interval tests."""

from __future__ import annotations

from typing import Any

from orchestrator.jobfile.spec import validate_job
from orchestrator.sizing.catalog import Catalog, parse_offers

HEADER = "cloud,instance_type,accelerator,count,gpu_memory_gib,ondemand_usd,spot_usd,regions,interconnect\n"
OFFERS = HEADER + (
    "aws,l4.small,L4,1,22.35,0.80,0.30,us-east-1,n/a\n"
    "aws,l40s.one,L40S,1,44.7,1.90,0.90,us-east-1,n/a\n"
    "gcp,a100.one,A100-80GB,1,80,3.30,1.60,us-central1,n/a\n"
    "aws,a10g.x4,A10G,4,22.35,5.70,2.00,us-east-1,PCIe\n"
    "gcp,h100.x8,H100,8,80,90.0,24.0,us-central1,NVLink\n"
    "lambda,h100.x8.od,H100,8,80,31.9,,us-tx-1,NVLink\n"
)


def catalog(text: str = OFFERS) -> Catalog:
    return Catalog(tuple(parse_offers(text)), "test catalog")


def job(**over: Any) -> Any:
    data: dict[str, Any] = {
        "model": "llama-2-7b",
        "method": "qlora",
        "data": {"path": "s3://b/d.jsonl", "max_seq_len": 2048, "tokens": 20_000_000},
        "checkpoint": {"uri": "s3://b/ck", "every": "auto"},
        "train": {
            "precision": "bf16",
            "optimizer": "paged_adamw_8bit",
            "gradient_checkpointing": True,
            "micro_batch_size": 1,
            "grad_accum": 8,
        },
        "resources": {"backend": "skypilot", "spot": True, "fallback": "none"},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    return validate_job(data, check_support=False)


def lora_job(**over: Any) -> Any:
    """The default job as LoRA with AdamW: it may shard over several GPUs (QLoRA runs on one)."""
    train = {
        "precision": "bf16",
        "optimizer": "adamw",
        "gradient_checkpointing": True,
        "micro_batch_size": 1,
        "grad_accum": 8,
    }
    return job(method="lora", train=train, **over)

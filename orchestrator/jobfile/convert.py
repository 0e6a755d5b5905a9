"""An axolotl config as a ftorch job: every key ftorch has a field for is mapped (names from
`orchestrator/jobfile/aliases.py`, values translated where they differ), every other key is listed with why.

Pure data in, data out: `ftorch convert` (orchestrator/cli/convert.py) reads and writes the files.
docs/convert.md documents an example that tests/orchestrator_tests/jobfile/test_convert.py converts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.jobfile.aliases import ALIASES

#: axolotl optimizer -> ftorch train.optimizer
OPTIMIZERS = {
    "adamw_torch": "adamw",
    "adamw_torch_fused": "adamw",
    "adamw_hf": "adamw",
    "adamw_bnb_8bit": "adamw_8bit",
    "adamw_8bit": "adamw_8bit",
    "paged_adamw_8bit": "paged_adamw_8bit",
    "sgd": "sgd",
    "adafactor": "adafactor",
}
#: axolotl datasets[].type -> ftorch data.format
FORMATS = {"alpaca": "instruction", "completion": "text", "chat_template": "chat"}
SCHEDULES = ("cosine", "linear", "constant")
#: keys mapped one to one (same value, ftorch's field from the alias table)
DIRECT = (
    "base_model",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "sequence_len",
    "sample_packing",
    "train_on_inputs",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "num_epochs",
    "max_steps",
    "learning_rate",
    "warmup_steps",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "seed",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "save_total_limit",
    "output_dir",
)
#: axolotl keys ftorch has no field for, and why (keys not here are listed as "no ftorch field")
WHY_NOT = {
    "load_in_8bit": "ftorch has no 8-bit base weights; use adapter: qlora (4-bit) or lora",
    "deepspeed": "ftorch chooses the layout (FSDP2) from the plan; see resources.gpus, local.nproc",
    "fsdp": "ftorch chooses the layout (FSDP2) from the plan; see resources.gpus, local.nproc",
    "fsdp_config": "ftorch chooses the layout (FSDP2) from the plan",
    "resume_from_checkpoint": "`ftorch resume JOB` continues from the newest checkpoint",
    "dataset_prepared_path": "ftorch caches the tokenised data in the run store itself",
    "wandb_entity": "W&B reads WANDB_ENTITY from the environment",
    "wandb_name": "the W&B run is named after the job id",
    "wandb_log_model": "the exported adapter is in output.uri",
    "hub_model_id": "ftorch exports to output.uri (a folder or bucket)",
    "saves_per_epoch": "checkpoint.every: auto picks the interval from the checkpoint cost",
    "evals_per_epoch": "give train.eval_every in steps",
}
#: axolotl keys that only restate a default ftorch has anyway (listed as such, not as lost)
SAME_AS_DEFAULT = {"strict", "model_type", "tokenizer_type", "base_model_config", "trust_remote_code"}


@dataclass
class Conversion:
    job: dict[str, Any] = field(default_factory=dict)
    #: 'key: why' for every axolotl key (or part of one) ftorch does not take
    unmapped: list[str] = field(default_factory=list)

    def put(self, path: str, value: Any) -> None:
        node = self.job
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value


def convert_axolotl(cfg: dict[str, Any]) -> Conversion:
    """The ftorch job for an axolotl config (a mapping), and what could not be mapped."""
    out = Conversion()
    for key in DIRECT:
        if cfg.get(key) is not None:
            out.put(ALIASES[key][0], cfg[key])
    _method(cfg, out)
    _data(cfg, out)
    _training(cfg, out)
    _tracking(cfg, out)
    handled = set(DIRECT) | HANDLED
    for key, value in cfg.items():
        if key in handled or value is None or value is False:  # a flag that is off asks for nothing
            continue
        if key in SAME_AS_DEFAULT:
            continue
        out.unmapped.append(f"{key}: {WHY_NOT.get(key, 'no ftorch field')}")
    if "checkpoint" not in out.job:
        out.put("checkpoint.uri", "runs")
        out.unmapped.append("output_dir: not given; checkpoints go to ./runs (checkpoint.uri)")
    out.job = _ordered(out.job, _name(cfg, out.job))
    return out


#: keys the helpers below read (with their values translated)
HANDLED = {
    "adapter",
    "load_in_4bit",
    "lora_target_modules",
    "lora_target_linear",
    "datasets",
    "test_datasets",
    "val_set_size",
    "bf16",
    "fp16",
    "optimizer",
    "lr_scheduler",
    "gradient_checkpointing",
    "flash_attention",
    "sdp_attention",
    "wandb_project",
    "wandb_mode",
}


def _method(cfg: dict[str, Any], out: Conversion) -> None:
    adapter = str(cfg.get("adapter") or "").lower()
    if adapter in ("lora", "qlora"):
        out.put("method", adapter)
    elif adapter:
        out.unmapped.append(f"adapter: {adapter!r} is not lora or qlora")
    else:
        out.put("method", "full")
    if cfg.get("load_in_4bit") and adapter != "qlora":
        out.unmapped.append("load_in_4bit: 4-bit base weights are ftorch's method: qlora (adapter: qlora)")
    if cfg.get("lora_target_linear"):
        out.put("lora.target_modules", "all-linear")
    elif cfg.get("lora_target_modules"):
        out.put("lora.target_modules", list(cfg["lora_target_modules"]))


def _data(cfg: dict[str, Any], out: Conversion) -> None:
    datasets = cfg.get("datasets") or []
    if datasets:
        first = datasets[0] if isinstance(datasets[0], dict) else {"path": datasets[0]}
        if first.get("path"):
            out.put("data.path", first["path"])
        kind = str(first.get("type", "alpaca"))
        if kind in FORMATS:
            out.put("data.format", FORMATS[kind])
        else:
            out.unmapped.append(
                f"datasets[0].type: {kind!r}; ftorch reads text, instruction (alpaca) and chat "
                "({messages: [{role, content}]}) data"
            )
        for key in ("split", "name"):
            if first.get(key):
                out.put("data.split" if key == "split" else "data.subset", first[key])
        for extra in datasets[1:]:
            where = extra.get("path") if isinstance(extra, dict) else extra
            out.unmapped.append(f"datasets: {where}: ftorch trains on one data set (data.path)")
    else:
        out.unmapped.append("datasets: not given; set data.path")
    tests = cfg.get("test_datasets") or []
    if tests:
        first = tests[0] if isinstance(tests[0], dict) else {"path": tests[0]}
        out.put("data.eval_path", first.get("path"))
        if first.get("split"):
            out.put("data.eval_split", first["split"])
    size = cfg.get("val_set_size")
    if size and not tests:
        if 0 < float(size) < 1:
            out.put("data.eval_fraction", float(size))
        else:
            out.put("data.eval_examples", int(size))


def _training(cfg: dict[str, Any], out: Conversion) -> None:
    if "bf16" in cfg or "fp16" in cfg:
        bf16, fp16 = cfg.get("bf16"), cfg.get("fp16")
        if bf16 in (True, "auto", "true"):
            out.put("train.precision", "bf16-mixed")
        elif fp16 in (True, "auto", "true"):
            out.put("train.precision", "fp16-mixed")
        else:
            out.put("train.precision", "fp32")
    optimizer = cfg.get("optimizer")
    if optimizer is not None:
        if optimizer in OPTIMIZERS:
            out.put("train.optimizer", OPTIMIZERS[optimizer])
        else:
            valid = ", ".join(sorted(OPTIMIZERS))
            out.unmapped.append(f"optimizer: {optimizer!r}; ftorch maps {valid}")
    schedule = cfg.get("lr_scheduler")
    if schedule is not None:
        if schedule in SCHEDULES:
            out.put("train.schedule", schedule)
        else:
            out.unmapped.append(f"lr_scheduler: {schedule!r}; ftorch has {', '.join(SCHEDULES)}")
    checkpointing = cfg.get("gradient_checkpointing")
    if isinstance(checkpointing, bool):
        out.put("train.gradient_checkpointing", checkpointing)
    elif checkpointing is not None:
        out.put("train.gradient_checkpointing", True)
        out.unmapped.append(f"gradient_checkpointing: {checkpointing!r}; ftorch uses transformers' own")
    if cfg.get("flash_attention"):
        out.put("train.attn_implementation", "flash_attention_2")
    elif cfg.get("sdp_attention"):
        out.put("train.attn_implementation", "sdpa")


def _tracking(cfg: dict[str, Any], out: Conversion) -> None:
    if cfg.get("wandb_project"):
        out.put("train.report_to", ["wandb"])
        out.unmapped.append(
            f"wandb_project: export WANDB_PROJECT={cfg['wandb_project']} (read from the environment)"
        )
    if cfg.get("wandb_mode"):
        out.unmapped.append(f"wandb_mode: export WANDB_MODE={cfg['wandb_mode']}")


def _name(cfg: dict[str, Any], job: dict[str, Any]) -> str:
    base = str(cfg.get("output_dir") or cfg.get("base_model") or "job").rstrip("/").split("/")[-1]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", base.lower()).strip("-.")
    return (name or "job")[:63]


#: the order of a written job, as `ftorch init` writes one
ORDER = ("name", "model", "method", "lora", "data", "train", "checkpoint")


def _ordered(job: dict[str, Any], name: str) -> dict[str, Any]:
    ordered = {"name": name}
    ordered.update({k: job[k] for k in ORDER if k in job})
    ordered.update({k: v for k, v in job.items() if k not in ordered})
    return ordered

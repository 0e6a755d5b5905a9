"""The names other fine-tuning tools give ftorch's fields, and "did you mean" for near misses.

One table, read by the job-file errors (`orchestrator/jobfile/spec.py`: an unknown key that is another tool's
name is refused naming the ftorch field) and by `ftorch convert` (`orchestrator/jobfile/convert.py`, which maps
an axolotl file's values). No pydantic here: the table is plain data.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

#: a name axolotl, Hugging Face's Trainer (TrainingArguments), TRL or PEFT use -> (ftorch's field, who)
ALIASES: dict[str, tuple[str, str]] = {
    # the model
    "base_model": ("model", "axolotl"),
    "model_name_or_path": ("model", "HF"),
    "model_name": ("model", "TRL"),
    "adapter": ("method", "axolotl"),
    "load_in_4bit": ("method", "axolotl"),
    # LoRA
    "lora_r": ("lora.r", "axolotl"),
    "lora_alpha": ("lora.alpha", "axolotl/PEFT"),
    "lora_dropout": ("lora.dropout", "axolotl/PEFT"),
    "lora_target_modules": ("lora.target_modules", "axolotl"),
    "lora_target_linear": ("lora.target_modules", "axolotl"),
    "rank": ("lora.r", "PEFT"),
    # data
    "datasets": ("data.path", "axolotl"),
    "dataset": ("data.path", "TRL"),
    "dataset_name": ("data.path", "HF"),
    "sequence_len": ("data.max_seq_len", "axolotl"),
    "max_seq_length": ("data.max_seq_len", "TRL"),
    "max_length": ("data.max_seq_len", "TRL"),
    "sample_packing": ("data.packing", "axolotl"),
    "val_set_size": ("data.eval_fraction", "axolotl"),
    # training
    "learning_rate": ("train.lr", "axolotl/HF/TRL"),
    "micro_batch_size": ("train.micro_batch_size", "axolotl"),
    "per_device_train_batch_size": ("train.micro_batch_size", "HF"),
    "batch_size": ("train.micro_batch_size", ""),
    "gradient_accumulation_steps": ("train.grad_accum", "axolotl/HF"),
    "num_epochs": ("train.epochs", "axolotl"),
    "num_train_epochs": ("train.epochs", "HF"),
    "epochs": ("train.epochs", ""),
    "lr": ("train.lr", ""),
    "max_steps": ("train.max_steps", "axolotl/HF"),
    "lr_scheduler": ("train.schedule", "axolotl"),
    "lr_scheduler_type": ("train.schedule", "HF"),
    "warmup_steps": ("train.warmup_steps", "axolotl/HF"),
    "warmup_ratio": ("train.warmup_ratio", "axolotl/HF"),
    "weight_decay": ("train.weight_decay", "axolotl/HF"),
    "max_grad_norm": ("train.max_grad_norm", "axolotl/HF"),
    "seed": ("train.seed", "axolotl/HF"),
    "optim": ("train.optimizer", "HF"),
    "optimizer": ("train.optimizer", "axolotl"),
    "gradient_checkpointing": ("train.gradient_checkpointing", "axolotl/HF"),
    "bf16": ("train.precision", "axolotl/HF"),
    "fp16": ("train.precision", "axolotl/HF"),
    "flash_attention": ("train.attn_implementation", "axolotl"),
    "logging_steps": ("train.log_every", "axolotl/HF"),
    "eval_steps": ("train.eval_every", "axolotl/HF"),
    "report_to": ("train.report_to", "HF"),
    "train_on_inputs": ("data.train_on_inputs", "axolotl"),
    # checkpoints and output
    "output_dir": ("checkpoint.uri", "axolotl/HF"),
    "save_steps": ("checkpoint.every", "axolotl/HF"),
    "save_total_limit": ("checkpoint.keep", "axolotl/HF"),
    "hub_model_id": ("output.uri", "axolotl/HF"),
}

#: how the value reads in ftorch, where it is not the same value under a new name
VALUE_NOTES: dict[str, str] = {
    "load_in_4bit": "method: qlora",
    "lora_target_linear": "target_modules: all-linear",
    "bf16": "precision: bf16-mixed",
    "fp16": "precision: fp16-mixed",
    "flash_attention": "attn_implementation: flash_attention_2",
    "hub_model_id": "ftorch exports to a folder or bucket",
}


def alias_hint(key: str, here: str) -> str | None:
    """'learning_rate is axolotl/HF/TRL's name: ftorch's field is train.lr' for a key at `here`
    ('' at the top level, 'train' inside train), or None when the key is not another tool's name."""
    entry = ALIASES.get(key) or ALIASES.get(key.lower())
    if entry is None:
        return None
    target, who = entry
    if not who or target == f"{here}.{key}".lstrip("."):  # ftorch's own name, in the wrong section
        return None
    named = f"{who}'s name"
    how = f" ({VALUE_NOTES[key]})" if key in VALUE_NOTES else ""
    return f"{key} is {named}: ftorch's field is {target}{how}"


def near_miss(key: str, here: str, sections: Mapping[str, Iterable[str]]) -> str | None:
    """'did you mean train.micro_batch_size?' for a key that is a field of another section, or close to
    one of this section's fields (difflib). `sections`: '' (top level) and each section -> its fields."""
    homes = [s for s, fields in sections.items() if s and s != here and key in fields]
    if homes:
        return "did you mean " + " or ".join(f"{s}.{key}" for s in homes) + "?"
    close = difflib.get_close_matches(key, list(sections.get(here, ())), n=2, cutoff=0.75)
    if close:
        return "did you mean " + " or ".join(f"{here}.{c}".lstrip(".") for c in close) + "?"
    spelled = difflib.get_close_matches(key, [a for a, (_t, who) in ALIASES.items() if who], n=1, cutoff=0.85)
    if spelled:  # a misspelt name of another tool
        return f"did you mean {ALIASES[spelled[0]][0]} ({spelled[0]} in {ALIASES[spelled[0]][1]})?"
    everywhere = {f"{s}.{f}".lstrip("."): f for s, fields in sections.items() for f in fields}
    close = difflib.get_close_matches(key, list(everywhere.values()), n=1, cutoff=0.8)
    if close:
        path = next(p for p, f in everywhere.items() if f == close[0])
        return f"did you mean {path}?"
    return None

"""`ftorch generate JOB --prompt TEXT` and `ftorch chat JOB`: try a checkpoint of a job, on this machine.

The model is the job's base with the checkpoint's trained weights (LoRA merged in, as `export --merge`
builds it: trainer/outputs/export.py), and a prompt is framed as the training data framed it: the instruction
template, the tokenizer's chat template (with the conversation so far), or plain text. Decoding is greedy
unless a temperature is given, so the same prompt gives the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.config import JobSpec
from trainer.data.dataset import INSTRUCTION_PROMPT
from trainer.model.load import load_tokenizer
from trainer.outputs.export import _weights, build, pick_checkpoint
from trainer.runstore.store import RunStore


@dataclass
class Session:
    model: Any
    tokenizer: Any
    spec: JobSpec
    step: int
    #: the conversation so far (chat data only; instruction and text prompts stand alone)
    history: list[dict[str, str]] = field(default_factory=list)

    def frame(self, text: str) -> str:
        fmt = self.spec.data.format
        if fmt == "instruction":
            return INSTRUCTION_PROMPT.format(instruction=text)
        if fmt == "chat":
            messages = [*self.history, {"role": "user", "content": text}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text

    def reply(self, text: str, max_new_tokens: int = 64, temperature: float = 0.0) -> str:
        """The model's answer to `text` (a chat remembers both)."""
        tokenizer = self.tokenizer
        prompt = self.frame(text)
        special = self.spec.data.format != "chat"  # a chat template writes its own special tokens
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=special)["input_ids"]
        options: dict[str, Any] = {"max_new_tokens": max_new_tokens, "pad_token_id": tokenizer.pad_token_id}
        options.update(
            {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        )
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **options)
        answer = tokenizer.decode(out[0][ids.shape[1] :], skip_special_tokens=True)
        if self.spec.data.format == "chat":
            self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        return answer


def open_session(
    run_uri: str,
    step: int | None = None,
    storage_options: dict[str, Any] | None = None,
    job: dict[str, Any] | None = None,
) -> Session:
    """The job's model at a complete checkpoint (default: the newest), ready to answer. `job`: the job as
    the caller has it (the CLI: the registry's), in place of the store's spec.json, which is data anyone
    who can write the bucket could have pointed at another model."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    store = RunStore(run_uri, storage_options)
    spec = JobSpec.model_validate(job if job is not None else store.read_spec()["job"])
    info = pick_checkpoint(store, step)
    model = build(spec, _weights(store, info), merge=True).eval()  # a full fine-tune: its weights
    torch.manual_seed(spec.train.seed)
    return Session(model, load_tokenizer(spec), spec, info.step)

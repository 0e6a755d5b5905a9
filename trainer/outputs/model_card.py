"""The output folder's record of the training: `training_summary.json` and a filled model card (README.md).

The trainer writes both when the run ends (what it knows: the job, data, steps, losses, held-out check,
attempts); the orchestrator adds what only it knows (cost, preemptions) with `add_run_facts`. Rendering is
a pure function of the summary, so the card can be rewritten without torch. No torch here.
"""

from __future__ import annotations

import time
from typing import Any

from trainer.config import REPO_ID, JobSpec
from trainer.runstore import finite_json

SUMMARY = "training_summary.json"
WITH_INPUT = "\n(when the example has an input:)\n"
CARD = "README.md"


def loss_ends(losses: list[float]) -> tuple[float | None, float | None]:
    """The training loss at the start and at the end of a run: the means of its first and last
    max(1, min(10, n // 4)) logged losses. The one definition: the card, training_summary.json and the
    `--follow` summary all say these figures."""
    if not losses:
        return None, None
    n = max(1, min(10, len(losses) // 4))  # a tenth-ish of a short run, 10 steps at most
    return sum(losses[:n]) / n, sum(losses[-n:]) / n


def build_summary(
    spec: JobSpec,
    resolved: dict[str, Any],
    *,
    steps: int,
    tokens_seen: int,
    examples: int,
    data_tokens: int,
    metrics: list[dict[str, Any]],
    eval_before: dict[str, Any] | None,
    eval_after: dict[str, Any] | None,
    attempt: int,
    interruptions: int,
    prompt_format: str,
    output_uri: str,
    held_out_examples: int | None = None,
) -> dict[str, Any]:
    first_loss, final_loss = loss_ends(
        [float(r["loss"]) for r in metrics if isinstance(r.get("loss"), (int, float))]
    )
    train = spec.train
    return {
        "job_id": resolved.get("run_id"),
        "base_model": spec.model,
        "method": spec.method,
        "lora": spec.lora.model_dump(mode="json") if spec.method != "full" else None,
        "quantization": spec.quantization.model_dump(mode="json") if spec.method == "qlora" else None,
        "data": {
            "path": spec.data.path,
            "format": spec.data.format,
            "max_seq_len": spec.data.max_seq_len,
            "training_examples": examples,
            "training_tokens": data_tokens,
            "split": spec.data.split,
            "train_on_inputs": spec.data.train_on_inputs,
            "held_out_examples": spec.data.eval_examples if held_out_examples is None else held_out_examples,
            "held_out_source": _held_out_source(spec),
        },
        "hyperparameters": {
            "micro_batch_size": train.micro_batch_size,
            "grad_accum": train.grad_accum,
            "epochs": None if train.max_steps else train.epochs,
            "max_steps": train.max_steps,
            "lr": train.lr,
            "schedule": train.schedule,
            "warmup_steps": train.warmup_steps,
            "warmup_ratio": None if train.warmup_steps is not None else train.warmup_ratio,
            "weight_decay": train.weight_decay,
            "max_grad_norm": train.max_grad_norm,
            "optimizer": train.optimizer,
            "precision": train.precision,
            "seed": train.seed,
        },
        "steps": steps,
        "tokens_seen": tokens_seen,
        "first_loss": first_loss,
        "final_loss": final_loss,
        "eval_before": eval_before,
        "eval_after": eval_after,
        #: [step, held-out loss] every train.eval_every steps (and at the end)
        "eval_curve": [[r["step"], r["eval_loss"]] for r in metrics if isinstance(r.get("eval_loss"), float)],
        "attempts": attempt,
        "interruptions": interruptions,  # attempts that ended before the run was done
        "preemptions": None,  # filled in by the orchestrator (add_run_facts)
        "cost_usd": None,
        "prompt_format": prompt_format,
        "output_uri": output_uri,
        "finished_at": time.time(),
    }


def _held_out_source(spec: JobSpec) -> str | None:
    data = spec.data
    if data.eval_source() is not None:
        path, split = data.eval_source()  # type: ignore[misc]
        return f"{path} (split {split})"
    if data.eval_fraction is not None:
        return f"{data.eval_fraction:g} of the data, chosen at random"
    return f"the last {data.eval_examples} examples of the data" if data.eval_examples else None


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def _count(value: Any) -> str:
    return "-" if not isinstance(value, int) else f"{value:,}"


def card_metadata(s: dict[str, Any]) -> str:
    """The card's YAML front matter, as the Hub reads it (huggingface_hub's ModelCardData)."""
    from huggingface_hub import ModelCardData

    adapter = s["method"] in ("lora", "qlora") and not (s.get("export") or {}).get("merge")
    base = s["base_model"]
    data = ModelCardData(
        base_model=base if REPO_ID.match(base) else None,  # a local folder is no Hub id: the body names it
        library_name="peft" if adapter else "transformers",
        pipeline_tag="text-generation",
        tags=["ftorch", s["method"], *(["merged"] if (s.get("export") or {}).get("merge") else [])],
    )
    return data.to_yaml()


def render_card(s: dict[str, Any]) -> str:
    """A model card (Hugging Face README front matter + sections) from a training summary; it parses as
    huggingface_hub's ModelCard."""
    export = s.get("export") or {}
    adapter = s["method"] in ("lora", "qlora") and not export.get("merge")
    lines = _card_heading(s, export)
    lines += _training_table(s)
    lines += ["## Prompt format", "", "Prompts at inference must look like the training prompts:", ""]
    lines += ["```", s["prompt_format"].rstrip("\n"), "```", "", "## Use it", "", "```python"]
    lines += _usage_code(s, adapter)
    lines += [
        f"`training_summary.json` beside this file holds these figures. Job `{s.get('job_id')}`: "
        f"`ftorch status {s.get('job_id')}` shows its attempts.",
        "",
    ]
    return "\n".join(lines)


def _card_heading(s: dict[str, Any], export: dict[str, Any]) -> list[str]:
    """The front matter, the title and the sentence that says what the folder holds."""
    lines = ["---", card_metadata(s).rstrip("\n"), "---", "", f"# {s.get('job_id') or 'ftorch run'}", ""]
    what = {"lora": "A LoRA adapter", "qlora": "A QLoRA adapter (4-bit base)", "full": "A full fine-tune"}
    said = what[s["method"]] if not export.get("merge") else f"{what[s['method']]}, merged into its base,"
    lines += [f"{said} of `{s['base_model']}`, trained with ftorch.", ""]
    if export:
        lines += [f"Exported from the checkpoint at step {export['step']:,}.", ""]
    return lines


def _training_table(s: dict[str, Any]) -> list[str]:
    """The "## Training" section: data, steps, losses, attempts and cost, then how it was trained."""
    d = s["data"]
    lines = [
        "## Training",
        "",
        "| | |",
        "|---|---|",
        f"| data | `{d['path']}` ({d['format']}, {_count(d.get('training_examples'))} examples, "
        f"{_count(d.get('training_tokens'))} tokens, max_seq_len {d['max_seq_len']}) |",
        f"| steps | {_count(s['steps'])} optimizer steps, {_count(s.get('tokens_seen'))} tokens seen |",
        f"| training loss | {_fmt(s['first_loss'], '.4f')} (first steps) -> {_fmt(s['final_loss'], '.4f')} "
        "(last steps) |",
    ]
    lines += _held_out_rows(s)
    cost = "-" if s.get("cost_usd") is None else f"${s['cost_usd']:.2f}"
    lines += [
        f"| attempts | {s['attempts']} ({s['interruptions']} interrupted) |",
        f"| preemptions | {_fmt(s.get('preemptions'))} |",
        f"| cost | {cost} |",
    ]
    lines += [f"| {label} | {value} |" for label, value in _ledger_rows(s.get("ledger"))]
    return lines + _method_rows(s)


def _held_out_rows(s: dict[str, Any]) -> list[str]:
    """The held-out loss before -> after (when both were measured) and its curve during training."""
    rows = []
    before, after = s.get("eval_before"), s.get("eval_after")
    if before and after:
        rows.append(
            f"| held-out loss | {before['loss']:.4f} -> {after['loss']:.4f} on {int(after['examples'])} "
            f"examples (exact match {before['exact_match']:.0%} -> {after['exact_match']:.0%}) |"
        )
    curve = s.get("eval_curve") or []
    if len(curve) > 1:
        cells = [f"{loss:.4f} (step {step})" for step, loss in curve]
        shown = cells if len(cells) <= 6 else [*cells[:3], "...", *cells[-3:]]
        rows.append(f"| held-out loss during training | {', '.join(shown)} |")
    return rows


def _method_rows(s: dict[str, Any]) -> list[str]:
    """The LoRA and quantization settings (when the method has them) and the hyperparameters; ends the
    table with its blank line."""
    rows = []
    if s.get("lora"):
        lo = s["lora"]
        rows.append(
            f"| LoRA | r {lo['r']}, alpha {lo['alpha']}, dropout {lo['dropout']}, {lo['target_modules']} |"
        )
    if s.get("quantization"):
        q = s["quantization"]
        rows.append(f"| quantization | {q['bits']}-bit {q['quant_type']}, compute {q['compute_dtype']} |")
    hp = ", ".join(f"{k} {v}" for k, v in s["hyperparameters"].items() if v is not None)
    return rows + [f"| hyperparameters | {hp} |", ""]


def _usage_code(s: dict[str, Any], adapter: bool) -> list[str]:
    """The "## Use it" snippet's body: load the adapter on its base, or the full model, and generate; closes
    the code block."""
    lines = ["from transformers import AutoModelForCausalLM, AutoTokenizer"]
    if adapter:
        lines += [
            "from peft import PeftModel",
            "",
            f'base = AutoModelForCausalLM.from_pretrained("{s["base_model"]}")',
            'model = PeftModel.from_pretrained(base, "path/to/this/folder")',
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        ]
    else:
        lines += [
            "",
            'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")',
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        ]
    example = _example_prompt(s)
    return lines + [
        f"prompt = {example}",
        'inputs = tokenizer(prompt, return_tensors="pt")',
        "out = model.generate(**inputs, max_new_tokens=64)",
        'print(tokenizer.decode(out[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```",
        "",
    ]


def _ledger_rows(ledger: dict[str, Any] | None) -> list[tuple[str, str]]:
    from trainer.recording.ledger import ledger_lines

    return [(f"cost: {label}", value) for label, value in ledger_lines(ledger)] if ledger else []


def _example_prompt(s: dict[str, Any]) -> str:
    fmt = s["data"]["format"]
    if fmt == "instruction":
        template = s["prompt_format"].split(WITH_INPUT)[0]
        return repr(template.replace("{instruction}", "Your instruction here"))
    if fmt == "chat":
        return (
            'tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False, '
            "add_generation_prompt=True)"
        )
    return '"The beginning of a text"'


def prompt_format(fmt: str) -> str:
    """How training prompts looked, for the card (trainer side: reads trainer.data.dataset's templates)."""
    from trainer.data.dataset import INSTRUCTION_PROMPT, INSTRUCTION_PROMPT_WITH_INPUT

    if fmt == "instruction":
        return f"{INSTRUCTION_PROMPT}{WITH_INPUT}{INSTRUCTION_PROMPT_WITH_INPUT}"
    if fmt == "chat":
        return "the tokenizer's chat template (saved in this folder), with add_generation_prompt=True"
    return "plain text, no template"


def record(store: Any, output: Any, spec: JobSpec, resolved: dict[str, Any], **facts: Any) -> dict[str, Any]:
    """Build and write the summary and card at the end of a run (trainer side)."""
    epoch = getattr(store, "epoch", None)
    records = store.epoch_records() if epoch is not None else {}
    interruptions = sum(1 for e, r in records.items() if e < epoch and (r or {}).get("ended") != "finished")
    summary = build_summary(
        spec,
        resolved,
        metrics=store.read_metrics(),
        interruptions=interruptions,
        prompt_format=prompt_format(spec.data.format),
        **facts,
    )
    summary["ledger"] = _trainer_ledger(store, records, facts.get("tokens_seen"))
    write(output, summary)
    return summary


def _trainer_ledger(store: Any, records: dict[int, dict[str, Any]], tokens: int | None) -> dict[str, Any]:
    """The cost ledger as the trainer knows it (trainer/recording/ledger.py): its price and spend where it was
    given them; no on-demand price (the orchestrator completes it, `add_run_facts`)."""
    from trainer.recording.ledger import compute_ledger
    from trainer.recording.trackers import run_facts

    facts = run_facts(store)
    return compute_ledger(
        records, spent_usd=facts.get("cost_usd"), hourly_usd=facts.get("hourly_usd"), ondemand_hourly_usd=None,
        tokens=tokens,
    )  # fmt: skip


def write(output: Any, summary: dict[str, Any]) -> None:
    """Both files into `output` (a RunStore on the output folder)."""
    output.write_bytes(SUMMARY, (finite_json.dumps(summary, indent=2, sort_keys=True) + "\n").encode())
    output.write_bytes(CARD, render_card(summary).encode())


def add_run_facts(
    output: Any, *, cost_usd: float | None, preemptions: int | None, ledger: dict[str, Any] | None = None
) -> bool:
    """The orchestrator's figures into an existing summary and card; False when there is no summary."""
    from trainer.outputs import summary_check

    summary = summary_check.usable(
        output.read_json_or_none(SUMMARY), f"{getattr(output, 'root_uri', 'output')}/{SUMMARY}"
    )
    if summary is None:
        return False
    summary.update(cost_usd=cost_usd, preemptions=preemptions)
    if ledger is not None:
        summary["ledger"] = ledger
    write(output, summary)
    return True


def export_summary(store: Any, output: Any | None, spec: JobSpec, step: int, merge: bool) -> dict[str, Any]:
    """The training summary an export of the checkpoint at `step` carries (with its card): the run's own
    (`output`'s) when it ended at that step, else one rebuilt from the metrics up to that step (what the
    trainer counted about the data is taken from the run's summary when there is one)."""
    from trainer.outputs import summary_check

    resolved = store.read_spec()
    final = output.read_json_or_none(SUMMARY) if output is not None else None  # any JSON: checked here
    final = summary_check.usable(final, f"{getattr(output, 'root_uri', 'output')}/{SUMMARY}")
    if final is not None and final.get("steps") == step:
        summary = dict(final)
        summary.update(base_model=spec.model, method=spec.method)  # the registered job's, never the store's
    else:
        metrics = [r for r in store.read_metrics() if r["step"] <= step]
        records = store.epoch_records()
        attempt = max((int(r.get("attempt") or 0) for r in metrics), default=0) or None
        progress = store.read_progress() or {}
        tokens = [r["tokens"] for r in metrics if isinstance(r.get("tokens"), int)]
        data = (final or {}).get("data") or {}
        summary = build_summary(
            spec,
            resolved,
            steps=step,
            tokens_seen=tokens[-1] if tokens else None,  # type: ignore[arg-type]
            examples=data.get("training_examples"),  # type: ignore[arg-type]
            data_tokens=data.get("training_tokens"),  # type: ignore[arg-type]
            metrics=metrics,
            eval_before=progress.get("eval_before"),
            eval_after=None,
            attempt=attempt or len(records),
            interruptions=sum(
                1
                for e, r in records.items()
                if attempt and e < attempt and (r or {}).get("ended") != "finished"
            ),
            prompt_format=prompt_format(spec.data.format),
            output_uri=resolved.get("output_uri") or "",
            held_out_examples=data.get("held_out_examples"),
        )
    summary["export"] = {"step": step, "merge": merge}
    return summary

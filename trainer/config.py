"""The job file schema, shared by the orchestrator and the trainer.

This module imports no torch: the CLI validates job files and reads run stores without loading it.
Every concept of the job file exists here; fields that a backend or the trainer cannot act on yet are
validated here and refused by `unsupported_features` with a clear message. Over 400 lines on purpose:
the whole schema stays in one module, so the reference (docs/job-file.md) and every reader share it.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainer.layout import layout_for

Method = Literal["full", "lora", "qlora"]
DataFormat = Literal["text", "instruction", "chat"]
Precision = Literal["fp32", "bf16", "bf16-mixed", "fp16-mixed"]
Optimizer = Literal["adamw", "adamw_8bit", "paged_adamw_8bit", "sgd", "adafactor"]
Schedule = Literal["cosine", "linear", "constant"]
Attention = Literal["auto", "sdpa", "eager", "flash_attention_2"]  # auto: trainer/model/attention.py
Backend = Literal["local", "skypilot"]
Fallback = Literal["none", "on-demand"]
Policy = Literal["spot-only", "spot-fallback", "deadline", "on-demand"]
Cloud = Literal["aws", "gcp", "azure", "lambda", "runpod", "vast", "kubernetes"]
Device = Literal["auto", "cpu", "cuda"]

#: the most optimizer steps any step count may say (a billion: 1e26 is a typo, not a run)
MAX_STEPS = 1_000_000_000


def expand_home(value: str | None) -> str | None:
    """A local path's leading `~` as the home folder, the same way wherever the job is read (C3)."""
    return os.path.expanduser(value) if isinstance(value, str) and value.startswith("~") else value


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """'90s', '10m', '1.5h', '2d' -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration like 30s, 10m, 1.5h or 2d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def parse_deadline(text: str) -> float | datetime:
    """resources.deadline: a duration ('12h' -> seconds from launch) or an ISO time with a zone."""
    try:
        return parse_duration(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError("must be a duration like 12h or an ISO time with a zone") from None
    if when.tzinfo is None:
        raise ValueError("a clock time needs a time zone, e.g. 2026-12-01T07:00+01:00")
    return when


def deadline_seconds(text: str, now: datetime | None = None) -> float:
    """resources.deadline as seconds from `now` (launch): '12h' -> 43200; an ISO time with a zone -> its
    distance from now. Raises ValueError if it is malformed, has no zone, or is not in the future."""
    try:
        value = parse_deadline(text)
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    if isinstance(value, datetime):
        value = (value - (now or datetime.now(timezone.utc))).total_seconds()
    if value <= 0:
        raise ValueError(f"{text!r} is not in the future")
    return value


def read_every(every: Any) -> tuple[int | None, float | None]:
    """`checkpoint.every` read: (N, None) every N steps, (None, seconds) every duration, (None, None) auto.

    The one reader, for the trainer, the planner and the budget guard (which has the raw job dict)."""
    if isinstance(every, int) and not isinstance(every, bool):
        return every, None
    if isinstance(every, str) and every != "auto":
        return None, parse_duration(every)
    return None, None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _shorthand(key: str, data: Any) -> Any:
    """A section given as one string is its main field: `checkpoint: ./runs` is `checkpoint: {uri: ./runs}`."""
    return {key: data} if isinstance(data, str) else data


class LoraSpec(_Strict):
    r: int = Field(16, ge=1, le=4096)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: Literal["all-linear"] | list[Annotated[str, Field(min_length=1)]] = "all-linear"

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("must be 'all-linear' or a non-empty list of module names")
        return value


class QuantSpec(_Strict):
    """QLoRA's frozen-base quantisation (bitsandbytes)."""

    bits: Literal[4] = 4
    quant_type: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True
    #: follows train.precision (fp16 under fp16-mixed, bf16 otherwise); a different value is refused
    compute_dtype: Literal["bf16", "fp16"] = "bf16"


class DataSpec(_Strict):
    #: a JSONL, JSON or parquet file, a folder of them, a `save_to_disk` folder, an fsspec URL of one of
    #: these (s3://, gs://), or a Hugging Face Hub data set id (docs/data.md)
    path: str = Field(min_length=1)
    #: the split to train on, for hub data sets and saved DatasetDicts (hub ids also take slices such as
    #: 'train[:90%]'); files and folders of files are one split, 'train'
    split: str = Field("train", min_length=1)
    #: a hub data set's configuration (subset) name
    subset: str | None = Field(None, min_length=1)
    format: DataFormat = "text"
    max_seq_len: int = Field(512, ge=8, le=1_048_576)
    #: tokens in the data set, for the planner when the data is not local (counted when it is)
    tokens: int | None = Field(None, ge=1)
    #: the held-out set (one of eval_examples, eval_fraction, eval_path/eval_split): measured before and
    #: after training, and every train.eval_every steps. eval_examples: the last N examples of data.path
    eval_examples: int = Field(0, ge=0)
    #: pack examples into sequences of max_seq_len tokens, each example attending only to itself; auto:
    #: on where it is exact and faster (flash_attention_2 and a model that passes the packing check),
    #: resolved per attempt by the trainer (trainer/data/packing.py `resolve_packing`)
    packing: Literal["auto"] | bool = "auto"
    #: hold back this share of data.path's examples (a fixed random choice: the same for the same data)
    eval_fraction: float | None = Field(None, gt=0.0, lt=1.0)
    #: a separate held-out set: any source data.path takes, in the same format
    eval_path: str | None = Field(None, min_length=1)
    #: the split of eval_path (default 'train'); alone, another split of data.path (e.g. 'test')
    eval_split: str | None = Field(None, min_length=1)
    #: learn the prompt tokens too (instruction and chat formats); by default only responses are learned
    train_on_inputs: bool = False
    #: chat format: a Jinja chat template replacing the tokenizer's, inline (holding '{{' or '{%') or
    #: the path of a file holding one (relative to the job file; its text is stored with the job)
    chat_template: str | None = Field(None, min_length=1)
    #: processes that tokenise (datasets.map); default min(8, CPUs); small data sets use fewer
    num_proc: int | None = Field(None, ge=1, le=256)

    _path_shorthand = model_validator(mode="before")(classmethod(lambda cls, data: _shorthand("path", data)))

    @field_validator("packing", mode="before")
    @classmethod
    def _packing(cls, value: Any) -> Any:
        """auto, true or false (YAML's booleans; --set's strings): one line naming the valid values."""
        if isinstance(value, bool) or value == "auto":
            return value
        text = str(value).strip().lower() if isinstance(value, (str, int)) else None
        if text in ("true", "yes", "on", "1"):  # pydantic's lax booleans, as before auto
            return True
        if text in ("false", "no", "off", "0"):
            return False
        raise ValueError("must be auto, true or false")

    @model_validator(mode="after")
    def _one_held_out_set(self) -> DataSpec:
        given = [
            name
            for name, on in (
                ("data.eval_examples", self.eval_examples > 0),
                ("data.eval_fraction", self.eval_fraction is not None),
                ("data.eval_path", self.eval_path is not None or self.eval_split is not None),
            )
            if on
        ]
        if len(given) > 1:
            raise ValueError(f"{given[1]}: give one held-out set, not both {given[0]} and {given[1]}")
        if self.eval_source() == (self.path, self.split):
            raise ValueError(
                f"data.eval_split: the held-out set would be the training data itself ({self.path}, split "
                f"{self.split}); give another split, or data.eval_fraction"
            )
        if self.chat_template is not None and self.format != "chat":
            raise ValueError("data.chat_template: applies to data.format: chat")
        return self

    def has_held_out(self) -> bool:
        return bool(self.eval_examples) or self.eval_fraction is not None or self.eval_source() is not None

    def eval_source(self) -> tuple[str, str] | None:
        """(path, split) of a separate held-out set, or None."""
        if self.eval_path is None and self.eval_split is None:
            return None
        return (self.eval_path or self.path, self.eval_split or ("train" if self.eval_path else self.split))


# ---- training health (trainer/health/rules.py, docs/health.md) ----
class HealthSpec(_Strict):
    """train.health: non-finite steps skipped, rollback to the newest healthy checkpoint, an UNHEALTHY end."""

    #: the checks are on unless turned off here
    enabled: bool = True
    #: non-finite loss or gradient-norm steps skipped in a row before a rollback (Megatron-LM: 0, fatal)
    max_skips_in_a_row: int = Field(3, ge=0, le=1000)
    #: rollbacks to the newest healthy checkpoint before the run ends UNHEALTHY (NVIDIA's resiliency
    #: extension: 3 restarts without progress)
    max_rollbacks: int = Field(2, ge=0, le=100)
    #: a loss above this many times the largest seen is a spike: rollback (Megatron-LM's 10x)
    spike_factor: float = Field(10.0, gt=1.0)
    #: the first steps are not judged for spikes (NVIDIA's resiliency extension: the first 5 iterations
    #: are not monitored); their losses still count towards the largest seen
    warmup_steps: int = Field(5, ge=0)
    #: a sustained rise warns: rise_patience steps in a row above rise_factor x the mean of the last
    #: rise_window steps (LLM Foundry's KillLossSpike: 2x the 100-step mean, patience 4)
    rise_factor: float = Field(2.0, gt=1.0)
    rise_window: int = Field(100, ge=2, le=100_000)
    rise_patience: int = Field(5, ge=1)
    #: seconds without a step (or an eval or checkpoint phase) before the trainer counts as stalled;
    #: null: max(300 s, 5x the p95 step after warm-up), eval and checkpoint max(that, 5x their last)
    stall_timeout_s: float | None = Field(None, gt=0)
    #: seconds the set-up before the first step (tokenising, model load, checkpoint read, the evaluation
    #: before training) may take before the trainer counts as stalled; null: 3600 s (NVIDIA's resiliency
    #: extension: an initial heartbeat within 60 minutes)
    setup_timeout_s: float | None = Field(None, gt=0)


# ---- end training health ----


class TrainSpec(_Strict):
    micro_batch_size: int = Field(1, ge=1, le=65536)
    grad_accum: int = Field(1, ge=1, le=65536)
    epochs: float = Field(1.0, gt=0, le=10_000)
    #: stop after this many optimizer steps (overrides epochs)
    max_steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    lr: float = Field(2e-4, gt=0, le=10.0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int | None = Field(None, ge=0, le=MAX_STEPS)
    warmup_ratio: float = Field(0.03, ge=0.0, le=1.0)
    schedule: Schedule = "cosine"
    max_grad_norm: float | None = Field(1.0, gt=0)
    seed: int = Field(1234, ge=0, le=2**32 - 1)
    precision: Precision = "bf16-mixed"
    gradient_checkpointing: bool = False
    optimizer: Optimizer = "adamw"
    #: auto: flash_attention_2 where flash-attn is installed and the device is CUDA, else sdpa (resolved
    #: per attempt, on the trainer's machine: trainer/model/attention.py); or one of them outright
    attn_implementation: Attention = "auto"
    #: log (and report progress) every N optimizer steps; 0 = automatic
    log_every: int = Field(0, ge=0, le=MAX_STEPS)
    #: experiment trackers, one run per job across attempts: TensorBoard in <run store>/tensorboard,
    #: W&B (run id = job id; WANDB_API_KEY, WANDB_PROJECT from the environment) (trainer/recording/trackers.py)
    report_to: list[Literal["tensorboard", "wandb"]] = Field(default_factory=list)
    #: measure the held-out loss every N optimizer steps (needs a held-out set, data.eval_*)
    eval_every: int | None = Field(None, ge=1, le=MAX_STEPS)
    #: CPU offload under FSDP2 (docs/distributed.md, "CPU offload"). params: FSDP2's CPUOffloadPolicy,
    #: the sharded parameters, their gradients and the optimizer state live in host RAM and the optimizer
    #: steps on the CPU; the GPU holds a layer in flight and the activations (any GPU count: one GPU runs
    #: as an FSDP world of one). none: never. auto: none, unless the planner finds an offer that fits
    #: the job only with offload and is the cheapest: it says so and the cloud task runs with params.
    #: The math is the same either way: a run resumes with or without it
    offload: Literal["auto", "none", "params"] = "auto"
    #: the health checks (trainer/health/rules.py, docs/health.md)
    health: HealthSpec = Field(default_factory=HealthSpec)

    # ---- optimizer step in backward (trainer/optim/in_backward.py) ----
    #: step each parameter's optimizer in its gradient hook, so the whole gradient is never held (one GPU,
    #: train.grad_accum 1, no fp16-mixed; train.max_grad_norm is not applied: its default is ignored and
    #: an explicit value refused)
    optimizer_in_backward: bool = False

    @model_validator(mode="after")
    def _optimizer_in_backward(self) -> TrainSpec:
        if not self.optimizer_in_backward:
            return self
        if self.grad_accum > 1:
            raise ValueError(
                "train.grad_accum: must be 1 with train.optimizer_in_backward (each parameter steps as its"
                " gradient arrives; nothing accumulates); raise train.micro_batch_size instead"
            )
        if self.precision == "fp16-mixed":
            raise ValueError(
                "train.precision: fp16-mixed's loss scaler needs the whole gradient before any step; use"
                " bf16-mixed, bf16 or fp32 with train.optimizer_in_backward"
            )
        if "max_grad_norm" in self.model_fields_set and self.max_grad_norm is not None:
            raise ValueError(
                "train.max_grad_norm: clipping needs the whole gradient's norm, which"
                " train.optimizer_in_backward never holds; set it to null"
            )
        return self

    # ---- end optimizer step in backward ----

    # ---- speed paths (trainer/train_step/loss.py, trainer/kernels.py, trainer/optim/build.py) ----
    #: the loss's LM head: plain (in one piece), chunked (chunk by chunk, recomputed in backward: for logits
    #: that would not fit), auto (plain when a micro-batch's logits fit in one chunk, else chunked)
    loss: Literal["auto", "chunked", "plain"] = "auto"
    #: fused kernels, each refused where it cannot run: liger_fused_ce, Liger's fused linear
    #: cross-entropy (CUDA, pip install liger-kernel; not with lm_head in lora.target_modules)
    kernels: list[Literal["liger_fused_ce"]] = Field(default_factory=list)
    # ---- end speed paths ----


class CheckpointSpec(_Strict):
    uri: str = Field(min_length=1)
    #: 'auto', a step count (e.g. 50), or a duration (e.g. '10m')
    every: Literal["auto"] | Annotated[int, Field(ge=1, le=MAX_STEPS)] | str = "auto"
    keep: int = Field(3, ge=1, le=1000)
    #: fsspec storage options (e.g. {endpoint_url: ...}); never put secrets here, use the environment
    storage_options: dict[str, Any] = Field(default_factory=dict)
    #: the bucket's region (e.g. us-east-1): the planner prices checkpoint and data transfer from it
    region: str | None = Field(None, min_length=1, pattern=r"^[a-z0-9-]+$")

    _uri_shorthand = model_validator(mode="before")(classmethod(lambda cls, data: _shorthand("uri", data)))

    @field_validator("uri")
    @classmethod
    def _home(cls, value: str) -> str:
        return expand_home(value) or value

    @field_validator("every")
    @classmethod
    def _every(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "auto":
            parse_duration(value)
        return value

    @field_validator("storage_options")
    @classmethod
    def _no_secrets(cls, value: dict[str, Any]) -> dict[str, Any]:
        secret = {"key", "secret", "token", "password", "aws_secret_access_key", "aws_access_key_id"}
        bad = sorted(k for k in value if k.lower() in secret)
        if bad:
            raise ValueError(f"holds credentials ({', '.join(bad)}); set them in the environment instead")
        return value

    def every_steps(self) -> int | None:
        return read_every(self.every)[0]

    def every_seconds(self) -> float | None:
        return read_every(self.every)[1]


#: what the Hub accepts as a model repo id: namespace/name
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def check_repo_id(repo_id: str) -> str:
    """`repo_id` if the Hub would take it as a model repo id, else a ValueError saying what to give."""
    if not REPO_ID.match(repo_id) or ".." in repo_id or repo_id.endswith((".git", ".")):
        raise ValueError(f"{repo_id!r} is not a Hub repo id; give namespace/name, e.g. my-org/my-adapter")
    return repo_id


class OutputSpec(_Strict):
    #: where the final adapter / model goes; default <run_uri>/output
    uri: str | None = None
    #: a Hugging Face Hub repo (namespace/name) every `ftorch export` of this job is pushed to
    hub_model_id: str | None = None

    @field_validator("hub_model_id")
    @classmethod
    def _repo_id(cls, value: str | None) -> str | None:
        return None if value is None else check_repo_id(value)

    _uri_shorthand = model_validator(mode="before")(classmethod(lambda cls, data: _shorthand("uri", data)))

    @field_validator("uri")
    @classmethod
    def _home(cls, value: str | None) -> str | None:
        return expand_home(value)


class ResourcesSpec(_Strict):
    backend: Backend = "local"
    spot: bool = True
    fallback: Fallback = "none"
    policy: Policy | None = None
    max_hourly_usd: float | None = Field(None, gt=0)
    budget_usd: float | None = Field(None, gt=0)
    clouds: list[Cloud] | None = None
    regions: list[str] | None = None
    accelerators: list[str] | None = None
    #: GPUs per node; None lets the planner decide
    gpus: int | None = Field(None, ge=1, le=64)
    nodes: int = Field(1, ge=1, le=512)
    #: allow sharded plans over PCIe (NVLink is required otherwise)
    allow_pcie: bool = False
    #: a duration from launch ('12h') or an ISO clock time with a zone ('2026-12-01T07:00+01:00')
    deadline: str | None = None
    disk_gb: int | None = Field(None, ge=10)
    #: a VM image, or a container pinned by digest as 'docker:<image>@sha256:<digest>' (SkyPilot's image_id;
    #: it replaces the environment lock: docs/environment.md)
    image_id: str | None = None
    #: environment variable names passed to the cloud job as SkyPilot secrets, read from your environment
    #: at launch, never stored or printed; None = HF_TOKEN and the store's credentials, those that are set
    secrets: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] | None = None
    #: SkyPilot's recovery strategy after a preemption
    recovery: Literal["EAGER_NEXT_REGION", "FAILOVER"] = "EAGER_NEXT_REGION"
    #: SkyPilot backend: relaunches after trainer crashes (preemptions do not count)
    max_restarts_on_errors: int = Field(2, ge=0, le=100)

    @model_validator(mode="before")
    @classmethod
    def _accelerator_counts(cls, data: Any) -> Any:
        """SkyPilot's `NAME:COUNT` (`accelerators: [H100:8]`): the name, and the count as resources.gpus."""
        if not isinstance(data, dict) or not isinstance(data.get("accelerators"), list):
            return data
        names, counts = [], set()
        for item in data["accelerators"]:
            name, sep, count = item.partition(":") if isinstance(item, str) else (item, "", "")
            if sep:
                if not count.strip().isdigit() or int(count) < 1:
                    raise ValueError(f"resources.accelerators: {item!r} is not NAME or NAME:COUNT (H100:8)")
                counts.add(int(count))
            names.append(name.strip() if isinstance(name, str) else name)
        if not counts:
            return data
        gpus = data.get("gpus")
        if len(counts) > 1 or (gpus is not None and gpus not in counts):
            given = sorted(counts | ({gpus} if isinstance(gpus, int) else set()))
            raise ValueError(
                f"resources.accelerators: the GPU counts disagree ({', '.join(map(str, given))}); give one"
                " count, as NAME:COUNT or as resources.gpus"
            )
        return {**data, "accelerators": names, "gpus": counts.pop()}

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, value: str | None) -> str | None:
        if value is not None:
            parse_deadline(value)
        return value


class ChaosSpec(_Strict):
    """Simulated spot preemptions for the local backend."""

    #: preempt once the trainer reports each of these steps (each step fires once per run)
    preempt_at_steps: list[Annotated[int, Field(ge=1, le=MAX_STEPS)]] = Field(default_factory=list)
    #: with notice (SIGTERM, then SIGKILL after grace_s) or without (SIGKILL); one value or one per step
    notice: bool | list[bool] = True
    #: random preemptions: expected number per minute of training
    rate_per_min: float = Field(0.0, ge=0.0, le=60.0)
    seed: int = 0
    grace_s: float = Field(30.0, ge=0.0, le=3600.0)
    #: spot availability traces to replay (the `ftorch simulate` format; several files = several zones):
    #: the supervisor then follows resources.policy on this simulated capacity
    trace: list[Annotated[str, Field(min_length=1)]] | None = None
    #: trace seconds per wall second while replaying (600: a 195 s trace tick lasts 0.33 s)
    speedup: float = Field(600.0, gt=0.0, le=1e6)
    #: the trace tick the run starts at
    start_tick: int = Field(0, ge=0)
    #: restart overhead the policy assumes, in trace seconds
    restart_overhead_s: float = Field(300.0, ge=0.0)

    @model_validator(mode="after")
    def _notice_matches(self) -> ChaosSpec:
        if isinstance(self.notice, list) and len(self.notice) != len(self.preempt_at_steps):
            raise ValueError(
                f"notice has {len(self.notice)} values for {len(self.preempt_at_steps)} preempt_at_steps;"
                " give one value or one per step"
            )
        return self

    def notice_for(self, index: int) -> bool:
        return self.notice[index] if isinstance(self.notice, list) else self.notice


class LocalSpec(_Strict):
    device: Device = "auto"
    #: trainer processes (>1 runs FSDP under torchrun)
    nproc: int = Field(1, ge=1, le=64)
    chaos: ChaosSpec | None = None
    #: restarts after trainer crashes (preemptions do not count)
    max_restarts_on_errors: int = Field(2, ge=0, le=100)
    #: seconds before a new attempt after a preemption or crash
    restart_backoff_s: float = Field(1.0, ge=0.0, le=3600.0)
    #: a price for the local machine, so cost and budget can be exercised locally
    hourly_usd: float = Field(0.0, ge=0.0)
    #: CPU threads for the trainer: auto = the cores free at its start, at least 1 (trainer/threads.py);
    #: 0 = torch's default (every core, even busy ones); or a count
    threads: Annotated[int, Field(ge=0, le=1024)] | Literal["auto"] = "auto"


class NotifySpec(_Strict):
    webhook: str | None = None
    command: str | None = None
    #: resumed: the trainer's "resumed after N preemptions" (trainer/recording/notify.py)
    #: replanned: a resume moved a job that did not fit to a GPU with more memory (orchestrator/sizing/replan.py)
    #: unhealthy: the health checks ended the run (trainer/health/rules.py)
    on: list[
        Literal[
            "succeeded", "failed", "budget", "preempted", "cancelled", "resumed", "replanned", "unhealthy"
        ]
    ] = Field(default_factory=lambda: ["succeeded", "failed", "budget", "unhealthy"])

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        """YAML 1.1 (PyYAML) reads a bare `on:` key as the boolean true: take it as `on`."""
        if isinstance(data, dict) and True in data:  # an explicit "on" (a --set override) wins
            data = {"on": data[True], **{k: v for k, v in data.items() if k is not True}}
        return data

    @field_validator("webhook")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from urllib.parse import urlsplit

        bad = any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value)
        try:
            parts = urlsplit(value)
            scheme, host = parts.scheme, parts.hostname
        except ValueError:  # e.g. a bracketed host that is no IPv6 address
            scheme, host = "", None
        if bad or scheme not in ("http", "https") or not host:
            raise ValueError(
                "must be an http:// or https:// URL with a host, without spaces or control characters"
            )
        return value


class JobSpec(_Strict):
    name: str = Field("job", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    model: str = Field(min_length=1)
    method: Method = "lora"
    lora: LoraSpec = Field(default_factory=LoraSpec)
    quantization: QuantSpec = Field(default_factory=QuantSpec)
    data: DataSpec
    train: TrainSpec = Field(default_factory=TrainSpec)
    checkpoint: CheckpointSpec
    output: OutputSpec = Field(default_factory=OutputSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    local: LocalSpec = Field(default_factory=LocalSpec)
    notify: NotifySpec | None = None

    @model_validator(mode="after")
    def _cross_checks(self) -> JobSpec:
        if self.train.eval_every is not None and not self.data.has_held_out():
            raise ValueError(
                "train.eval_every: needs a held-out set: data.eval_path, data.eval_split,"
                " data.eval_fraction or data.eval_examples"
            )
        if self.method == "qlora" and self.train.precision == "fp32":
            raise ValueError("train.precision: qlora computes in 16-bit; use bf16, bf16-mixed or fp16-mixed")
        if self.method == "qlora":
            quant = self.quantization
            wanted = "fp16" if self.train.precision == "fp16-mixed" else "bf16"
            if "compute_dtype" not in quant.model_fields_set:
                quant.compute_dtype = wanted
            elif quant.compute_dtype != wanted:
                raise ValueError(
                    f"quantization.compute_dtype: {quant.compute_dtype} does not match train.precision "
                    f"{self.train.precision}; use {wanted} (or leave it out: it follows the precision)"
                )
        return self


def flash_attention_problem(spec: JobSpec) -> str | None:
    """Why flash_attention_2 cannot run this job, or None. It needs a CUDA GPU and the flash-attn package
    where the trainer runs: checked here for the local backend; SkyPilot jobs install it."""
    if spec.resources.backend != "local":
        return None
    if spec.local.device == "cpu":
        return "'flash_attention_2' runs on CUDA GPUs only; with local.device: cpu use sdpa or eager"
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        return "'flash_attention_2' needs the flash-attn package (pip install flash-attn --no-build-isolation); or use sdpa"
    return None


def kernel_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """train.kernels that cannot run this job: checked where the trainer runs (local); the LoRA head rule
    everywhere. SkyPilot jobs install the kernels' packages (orchestrator/backends/skypilot_render.py)."""
    from trainer.kernels import kernel_problem

    device = spec.local.device if spec.resources.backend == "local" else "cuda"
    targets = spec.lora.target_modules if spec.method in ("lora", "qlora") else None
    found = []
    for kernel in spec.train.kernels:
        if spec.resources.backend == "local":
            problem = kernel_problem(kernel, device, targets)
        else:
            problem = kernel_problem(kernel, device, targets, installed=lambda _name: True)
        if problem:
            found.append(("train.kernels", problem))
    return found


def unsupported_features(spec: JobSpec) -> list[tuple[str, str]]:
    """(field, message) for settings that are valid but that this build cannot act on yet."""
    problems: list[tuple[str, str]] = []
    if spec.resources.backend == "local":
        layout = layout_for(spec, spec.local.nproc)
        field = "local.nproc"
    else:  # on a cloud the planner drops the offers the job cannot run on; a fixed count is checked here
        layout = layout_for(spec, spec.resources.gpus or 1, spec.resources.nodes)
        field = "resources.gpus" if spec.resources.gpus else "resources.nodes"
    if not layout.ok:
        problems.append((field, f"{layout.ranks} rank(s): {layout.reason}"))
    if spec.resources.backend == "local" and spec.resources.nodes > 1:
        problems.append(
            (
                "resources.nodes",
                f"{spec.resources.nodes} nodes: the local backend runs on this one machine; use 1 (and"
                " local.nproc for more processes here), or resources.backend: skypilot",
            )
        )
    if spec.train.attn_implementation == "flash_attention_2":
        problem = flash_attention_problem(spec)
        if problem:
            problems.append(("train.attn_implementation", problem))
    problems += kernel_problems(spec)
    replaying = (
        spec.resources.backend == "local" and spec.local.chaos is not None and bool(spec.local.chaos.trace)
    ) or spec.resources.backend == "skypilot"  # the cloud controller (orchestrator/spot/controller.py)
    if (spec.resources.deadline is not None or spec.resources.policy is not None) and not replaying:
        field = "resources.deadline" if spec.resources.deadline is not None else "resources.policy"
        problems.append(
            (
                field,
                "policies act on skypilot jobs, on local runs with simulated spot capacity"
                " (local.chaos.trace) and in `ftorch simulate`",
            )
        )
    return problems

"""Multi-process training (FSDP2 under torchrun): the process group, sharding, and rank agreement.

The training loop calls a `Parallel` at a few points. The single-process one (`Parallel`) does
nothing; `Sharded` runs FSDP2 (`fully_shard` per decoder layer, then the root):

- `setup` decides: sharded when torchrun started several ranks (WORLD_SIZE > 1), when the job asks for
  `local.nproc > 1` or for CPU offload (`train.offload`, FSDP2's CPUOffloadPolicy), or when the run's newest checkpoint is sharded (DCP) -- a run saved by 2 ranks and
  resumed by 1 stays on the sharded path, as a world of one.
- data: the layout (trainer/layout.py) cuts each optimizer step's examples into global micro-batches of
  (micro-batch per rank x ranks); every rank takes the same global micro-batch and keeps its contiguous
  slice, and the loss is normalised by the label tokens of the whole optimizer step, every global
  micro-batch of it (trainer/train_step/step.py), so the effective batch, the data order and the gradient are those
  of every other layout of the job.
- the stop flag and the checkpoint decision are all-reduced, so all ranks stop and save at the same step.
- every rank has its own torch RNG stream (seeded from (seed, rank)), saved with the checkpoint.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from trainer.config import JobSpec
from trainer.data.dataset import Example
from trainer.layout import OFFLOAD_ENV

PR_SET_PDEATHSIG = 1


class Parallel:
    """One process, no process group: every hook is the identity (the single-process trainer)."""

    rank = 0
    world = 1
    sharded = False
    _tokens = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module, spec: JobSpec) -> torch.nn.Module:
        return model

    def load(self, spec: JobSpec, device: torch.device) -> torch.nn.Module:
        """The job's model on `device`, ready to train (wrapped for this parallelism)."""
        from trainer.model.load import load_model

        return self.wrap(load_model(spec, device), spec)

    def local(self, examples: list[Example]) -> list[Example]:
        self._tokens = sum(len(e.input_ids) for e in examples)
        return examples

    def tokens(self, batch: dict[str, torch.Tensor]) -> int:
        """Input tokens of the last `local` micro-batch, padding excluded (packed batches have no mask)."""
        return self._tokens

    def any(self, value: bool) -> bool:
        return value

    def mean(self, value: float) -> float:
        return value

    def barrier(self) -> None:
        pass

    def share(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (e.g. the one listing of the run's checkpoints)."""
        return value

    def follow_stall_timeout(self, watchdog: Any, given: float | None) -> None:
        """The process group's timeout follows the stall watchdog's (`Sharded`); one process has none."""

    def reporter(self, reporter: Any) -> Any:
        return reporter

    def write_output(self, write: Callable[..., None], model: torch.nn.Module, *args: Any) -> None:
        write(model, *args)


class Sharded(Parallel):
    """FSDP2 over a 1-D device mesh of all ranks (gloo on CPU, nccl on CUDA)."""

    sharded = True

    def __init__(self, device: torch.device, offload: bool = False, timeout_s: float | None = None) -> None:
        import datetime

        import torch.distributed as dist

        # a hung collective raises after this instead of hanging for 10-30 minutes (trainer/stops/watchdog.py);
        # tightened after warm-up (`follow_stall_timeout`)
        timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
        #: the group's timeout now, and the one it started with (put back for `finish`: no stall rule there)
        self.timeout_s = self.initial_timeout_s = timeout_s
        self._phases: dict[str, float] = {}

        backend = "nccl" if device.type == "cuda" else "gloo"
        if offload and device.type == "cuda":
            # CPU offload: gradient clipping all-reduces norms of DTensors that live on the CPU, which
            # nccl cannot (pytorch/pytorch#148532; torchtune's fix, meta-pytorch/torchtune#2108)
            backend = "cuda:nccl,cpu:gloo"
        if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            dist.init_process_group(backend, timeout=timeout)
        else:  # a world of one without torchrun (e.g. resuming a sharded run on one process)
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        self._attach(device)
        #: checkpoint I/O (DCP, also in a background thread) gets its own gloo group
        self.io_group = dist.new_group(backend="gloo")

    @classmethod
    def on_group(cls, device: torch.device) -> Sharded:
        """FSDP over an already initialised process group, for sharding only (trainer/memtrace/loadtrace.py
        runs the trainer's sharding on torch's fake process group)."""
        par = cls.__new__(cls)
        par._attach(device)
        return par

    def _attach(self, device: torch.device) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        self.dist = dist
        self.device = device
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.mesh = init_device_mesh(device.type, (self.world,))
        self._tokens = 0
        #: the run store epoch rank 0 claimed (fencing); the other ranks write their shards under it
        self.epoch = 0

    def share_epoch(self, store: Any) -> None:
        box = [int(getattr(store, "epoch", 0) or 0)]
        self.dist.broadcast_object_list(box, src=0)
        self.epoch = int(box[0])

    # ---- model ---------------------------------------------------------------------------------
    def wrap(self, model: torch.nn.Module, spec: JobSpec) -> torch.nn.Module:
        self.shard_model(model, spec)
        seed_rank(spec.train.seed, self.rank, 0)
        return model

    def shard_model(self, model: torch.nn.Module, spec: JobSpec) -> None:
        """fully_shard per decoder layer, then the root, with the job's mixed precision and offload."""
        from torch.distributed.fsdp import fully_shard

        from trainer.runstore.progress import log

        policy = mixed_precision(spec)
        offload = offload_policy(spec, self.device)
        if spec.train.offload == "params" and self.is_main:
            log(
                f"CPU offload ({spec.train.offload}): sharded parameters, gradients and optimizer state in host RAM"
            )
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=self.mesh, mp_policy=policy, offload_policy=offload)
        fully_shard(model, mesh=self.mesh, mp_policy=policy, offload_policy=offload)

    def load(self, spec: JobSpec, device: torch.device) -> torch.nn.Module:
        """Every method loads sharded (trainer/model/sharded_load.py): no GPU holds the whole model. QLoRA's base
        is quantized once, on rank 0's CPU; with a bitsandbytes that cannot run there, it loads whole on
        each rank, quantized on the device as it arrives, then shards."""
        from trainer.model import sharded_load
        from trainer.model.quant import bitsandbytes_devices

        shard = lambda m: self.shard_model(m, spec)  # noqa: E731
        if spec.method != "qlora":
            model = sharded_load.load_sharded(spec, device, self.rank, shard)
        elif "cpu" in bitsandbytes_devices():
            model = sharded_load.load_sharded_quantized(spec, device, self.rank, shard)
        else:
            return super().load(spec, device)
        seed_rank(spec.train.seed, self.rank, 0)
        return model

    # ---- data ----------------------------------------------------------------------------------
    def local(self, examples: list[Example]) -> list[Example]:
        """This rank's contiguous slice of the global micro-batch (remembers the global counts)."""
        if len(examples) < self.world:  # trainer/layout.py never cuts them smaller
            raise ValueError(f"a global micro-batch of {len(examples)} examples for {self.world} ranks")
        self._tokens = sum(len(e.input_ids) for e in examples)
        part = np.array_split(np.arange(len(examples)), self.world)[self.rank]
        return [examples[int(i)] for i in part]

    def tokens(self, batch: dict[str, torch.Tensor]) -> int:
        return self._tokens

    # ---- agreement -----------------------------------------------------------------------------
    def any(self, value: bool) -> bool:
        flag = torch.tensor([1 if value else 0], dtype=torch.int32, device=self._comm_device)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MAX)
        return bool(flag.item())

    def mean(self, value: float) -> float:
        total = torch.tensor([value], dtype=torch.float64, device=self._comm_device)
        self.dist.all_reduce(total)
        return float(total.item()) / self.world

    def barrier(self) -> None:
        self.dist.barrier()

    def share(self, value: Any) -> Any:
        box = [value]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def follow_stall_timeout(self, watchdog: Any, given: float | None) -> None:
        """After warm-up the process group's timeout is the stall watchdog's (`collective_timeout`), so a
        hung collective raises (and the loop ends the attempt as stalled) instead of waiting the first
        step's bound: recomputed when warm-up ends, every 20 steps after and when an eval or checkpoint was
        timed (the loop calls this after each step). `watchdog` None (the last checkpoint, eval and output:
        no stall rule) puts back the timeout the group started with."""
        from trainer.stops.watchdog import WARMUP_STEPS

        if watchdog is None:
            seconds = getattr(self, "initial_timeout_s", None)
        else:
            n = len(watchdog.step_times)
            if n != WARMUP_STEPS + 1 and n % 20 and watchdog.phase_s == getattr(self, "_phases", None):
                return
            self._phases = dict(watchdog.phase_s)
            seconds = collective_timeout(given, watchdog)
        if seconds and seconds != getattr(self, "timeout_s", None):
            self._set_timeout(seconds)

    def _set_timeout(self, seconds: float) -> None:
        """The timeout of the collectives issued from now on, on the live default group (the FSDP mesh's):
        torch's `_set_pg_timeout` (gloo and nccl; checked with torch 2.13 on gloo). The checkpoint I/O
        group keeps its own. Without that API the group keeps the timeout it started with."""
        import datetime

        try:
            from torch.distributed.distributed_c10d import _set_pg_timeout
        except ImportError:
            return
        timeout = datetime.timedelta(seconds=seconds)
        _set_pg_timeout(timeout, None)
        group = self.mesh.get_group()
        if group is not self.dist.group.WORLD:
            _set_pg_timeout(timeout, group)
        self.timeout_s = seconds

    @property
    def _comm_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    # ---- progress and output -------------------------------------------------------------------
    def reporter(self, reporter: Any) -> Any:
        """Only rank 0 writes progress and metrics."""
        if not self.is_main:
            reporter.flush = lambda: None
        return reporter

    def write_output(self, write: Callable[..., None], model: torch.nn.Module, *args: Any) -> None:
        """Gather the full weights (a collective), then rank 0 writes them from an unsharded copy."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from trainer.model.load import load_model

        spec: JobSpec = args[1]
        full = get_model_state_dict(
            model,
            options=StateDictOptions(
                full_state_dict=True, cpu_offload=True, ignore_frozen_params=spec.method != "full"
            ),
        )
        if self.is_main:
            plain = load_model(spec, torch.device("cpu"))
            result = plain.load_state_dict(full, strict=spec.method == "full")
            missing = [k for k in getattr(result, "missing_keys", []) if _is_trainable_key(k)]
            if missing or getattr(result, "unexpected_keys", []):
                raise RuntimeError(f"gathered weights do not fit the model: {missing[:3]}")
            write(plain, *args)
        self.barrier()


def _is_trainable_key(key: str) -> bool:
    return "lora_" in key


def collective_timeout(stall_timeout_s: float | None, watchdog: Any = None) -> float:
    """The process group's timeout. Until warm-up ends (no `watchdog`, or it timed no step after its
    warm-up steps): the job's stall timeout, or the watchdog's first-step bound (3x its 300 s floor: rank 0
    may load a large model while the others wait in a collective). After: the watchdog's own timeout
    (trainer/stops/watchdog.py: the job's, or max(300 s, 5x the p95 step)), and no less than its timeout
    of a phase it has timed (eval, checkpoint: 5x their last duration), so a collective never gives up
    before the watchdog would."""
    from trainer.stops.watchdog import FLOOR_S, WARMUP_STEPS

    given = float(stall_timeout_s) if stall_timeout_s else None
    if watchdog is None or (given is None and len(watchdog.step_times) <= WARMUP_STEPS):
        return given or 3 * FLOOR_S
    return max(watchdog.timeout(phase) for phase in ("step", *watchdog.phase_s))


#: what a gloo collective that timed out raises (its transport's wait, then the pair it closed after that)
_GLOO_TIMED_OUT = ("Timed out waiting", "Application timeout caused pair closure")


def collective_timed_out(exc: BaseException) -> bool:
    """Whether `exc` is a collective that gave up at the process group's timeout (gloo's RuntimeError, or
    a DistBackendError that says so, e.g. nccl's blocking wait): the loop ends the attempt as stalled."""
    import torch.distributed as dist

    text = str(exc)
    if isinstance(exc, getattr(dist, "DistBackendError", ())):
        return "timed out" in text.lower() or "timeout" in text.lower()
    return isinstance(exc, RuntimeError) and any(mark in text for mark in _GLOO_TIMED_OUT)


def setup(spec: JobSpec, device: torch.device, store: Any, resume_sharded: bool = False) -> Parallel:
    """The `Parallel` for this process (see the module docstring for when it is sharded);
    `resume_sharded`: the run's newest checkpoint is sharded."""
    resolve_offload(spec)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    offload = spec.train.offload == "params"  # offload is FSDP2's: one rank runs as a world of one
    if world <= 1 and spec.local.nproc <= 1 and not resume_sharded and not offload:
        return Parallel()
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        _die_with_parent()  # torchrun's workers sit in their own sessions: go when the agent goes
    par = Sharded(device, offload, collective_timeout(spec.train.health.stall_timeout_s))
    par.share_epoch(store)
    if not par.is_main and not os.environ.get("FTORCH_LOG_ALL_RANKS"):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - one log: rank 0's (errors still reach stderr)
    return par


def resolve_offload(spec: JobSpec) -> None:
    """train.offload auto becomes what the planner chose for this machine (OFFLOAD_ENV), else none."""
    if spec.train.offload == "auto":
        chosen = os.environ.get(OFFLOAD_ENV, "none")
        spec.train.offload = chosen if chosen in ("none", "params") else "none"


def mixed_precision(spec: JobSpec) -> Any:
    """16-bit parameters and compute with fp32 gradient reduction for mixed and bf16 runs; fp32 otherwise."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if spec.train.precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if spec.train.precision == "fp16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    if spec.train.precision == "bf16":
        return MixedPrecisionPolicy(reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def offload_policy(spec: JobSpec, device: torch.device) -> Any:
    """FSDP2's offload policy for `train.offload`: params puts the sharded parameters, their gradients and
    (as the optimizer state follows its parameters) the optimizer state in host RAM, and the optimizer
    steps on the CPU; pinned host memory for fast copies on CUDA (on a CPU run it moves nothing, but
    the same code path runs). FSDP2 has no optimizer-only offload, so the schema offers none."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if spec.train.offload == "params":
        return CPUOffloadPolicy(pin_memory=device.type == "cuda")
    return OffloadPolicy()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks (the classes the model names in `_no_split_modules`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"no decoder layers found to shard in {type(base).__name__}")
    return layers


def seed_rank(seed: int, rank: int, step: int) -> None:
    """A torch/python/numpy RNG stream of its own for each rank (and for each reshard point)."""
    import random

    state = np.random.SeedSequence([seed, rank, step]).generate_state(2)
    torch.manual_seed(int(state[0]))
    random.seed(int(state[1]))
    np.random.seed(int(state[1]))


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass
    if os.getppid() == 1:
        os.kill(os.getpid(), signal.SIGKILL)

"""Which offer finishes a job for the least expected money, and why every other offer lost.
(Over 400 lines: adequacy, layouts, expected cost and the reasons for every rejection are one
decision read top to bottom; splitting it would scatter the formula below across modules.)

An offer is adequate when the memory estimate for its GPU count (FSDP over all its GPUs) fits each GPU
with HEADROOM to spare; sharding over several GPUs needs NVLink unless resources.allow_pcie. Expected
cost = hourly price x billed hours, where on spot the hours grow by the expected preemption overhead:

    hours_spot = hours x (1 + C/tau) / (1 - rate x (tau/2 + U + R))

with `rate` the interruption rate per hour of the job on the offer (orchestrator/spot/hazards.py: a
gamma-Poisson posterior over measured traces, the user's attempts and imports, correlated over nodes),
`tau` the checkpoint interval, `C` the time training blocks for a checkpoint, `U` its upload (work at
risk until it is committed) and `R` the restart overhead (new instance, model download, checkpoint
load); tau, C and U come from the trainer's checkpoint-cost model (trainer/stops/interval.py). Each interruption also starts a new billing segment that
is rounded to the cloud's granularity (BILLING). On-demand has no preemption overhead.

Capacity (the hazard table's availability): at each (re)launch no allowed zone has spot with chance q;
with `fallback: on-demand` that share of the work runs on demand, else the job waits (unbilled hours).
Data movement (orchestrator/spot/egress.py): checkpoint saves, restores and data pulls between the run
store's region and where the job runs, plus storage of the kept checkpoints, are added to each market's
cost; a save's dollars count in the checkpoint interval as seconds of the offer's time. Where the job
lands, for the hazard's shares and the data movement, is the launch's own region order
(orchestrator/spot/region_order.py region_costs: the price on the market it runs on plus data $/h, times
the re-bid loss), the order skypilot_render.regions_of gives the controller. Spot is never
chosen over on-demand on the same offer when on-demand is expected cheaper and the job allows it.
Among candidates within SINGLE_GPU_TIE of the cheapest, the one with the fewest GPUs wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.sizing.catalog import CONSUMER_TIER, Catalog, Offer, load_catalog
from orchestrator.sizing.history import History, key_of, load_history, peak_gib
from orchestrator.sizing.memory import MemoryEstimate, checkpoint_bytes, estimate, settings_from_spec
from orchestrator.sizing.shapes import ModelShape, resolve_shape
from orchestrator.sizing.throughput import (
    TimeEstimate,
    Workload,
    accelerator,
    estimate_time,
    scaled,
    workload,
)
from orchestrator.sizing.tracing import TraceConfirmation
from orchestrator.spot.egress import Movement, Store, store_of
from orchestrator.spot.egress import price as price_movement
from orchestrator.spot.hazards import Hazard, HazardTable, load_table
from orchestrator.spot.region_order import launch_order, lost_hours, region_costs
from orchestrator.spot.season import band, seasons
from trainer.layout import Layout, layout_for
from trainer.stops.interruptions import mtbf_from_rate
from trainer.stops.interval import (
    CHECKPOINT_GBPS,
    UPLOADS_PER_INTERVAL,
    CheckpointCost,
    auto_interval,
    fixed_interval_s,
)

HEADROOM = 0.10  # fraction of each GPU's memory kept free (fragmentation, spikes, estimate error)
HOST_HEADROOM = 0.10  # fraction of each machine's RAM kept free (the OS, page cache, estimate error)
TRACE_MARGIN = 0.15  # estimated fits this close to usable memory are confirmed by a trace
SINGLE_GPU_TIE = 0.10  # "about the same cost": fewer GPUs win within this fraction of the cheapest

#: a plan where spot is obtainable less than this share of the time says so; under SPOT_UNLIKELY it
#: says spot is unlikely to be had
SPOT_SHORT = 0.9
SPOT_UNLIKELY = 0.5
#: bytes of a data set per token it holds (UTF-8 text with JSON around it), for the pulls of data sets
#: whose size only `data.tokens` gives
DATA_BYTES_PER_TOKEN = 4.0


@dataclass(frozen=True)
class Billing:
    granularity_s: float
    minimum_s: float


#: billing rules per cloud (per second with a 1-minute minimum on AWS/GCP; per minute elsewhere)
BILLING = {
    "aws": Billing(1, 60),
    "gcp": Billing(1, 60),
    "azure": Billing(60, 60),
    "lambda": Billing(60, 60),
    "runpod": Billing(60, 60),
    "vast": Billing(1, 0),  # per second of rental
    "kubernetes": Billing(1, 0),
}
DEFAULT_BILLING = Billing(3600, 3600)  # unknown clouds: hourly with a one-hour minimum

PROVISION_S = 300.0  # new spot instance, image, ftorch install, until the trainer starts
DOWNLOAD_GBPS = 1.0  # model weights from the hub / object storage into the instance


@dataclass
class Candidate:
    cloud: str
    instance_type: str
    accelerator: str
    count: int
    gpu_memory_gib: float
    interconnect: str
    spot: bool
    hourly_usd: float
    spot_hourly_usd: float | None
    ondemand_hourly_usd: float | None
    est_hours: float  # compute hours without preemptions
    expected_hours: float  # wall hours billed: startup + compute + expected preemption overhead
    expected_cost_usd: float
    expected_cost_spot_usd: float | None
    expected_cost_ondemand_usd: float | None
    checkpoint_interval_s: float
    checkpoint_write_s: float  # the upload to the run store (in the background)
    startup_s: float  # first boot: provisioning and model download (billed, no training)
    restart_overhead_s: float
    interruption_rate_per_hour: float
    expected_interruptions: float
    peak_gib_per_gpu: float
    regions: list[str] = field(default_factory=list)
    tokens_per_s: float = 0.0
    checkpoint_blocking_s: float = 0.0  # what training stops for (the copy into host memory)
    #: how the memory fit was judged: "measured" (a run's peak, orchestrator/sizing/history.py), "traced" (one step
    #: traced, trainer/memtrace/steptrace.py) or "estimated"
    fit: str = "estimated"
    fit_job: str | None = None  # the job whose measured peak decided the fit
    time_scale: float = 1.0  # measured / predicted tokens/s of runs on this GPU (1.0: none measured)
    nodes: int = 1  # instances of `instance_type`; prices and `count` are per instance
    layout: Layout | None = None  # ranks, micro-batch per rank, accumulation, sharding (trainer/layout.py)
    #: train.offload the trainer runs with on this offer: "params" when the job fits it only with CPU
    #: offload (the planner's choice, said in the layout column and the notes) or the job asks for it
    offload: str = "none"
    host_gib: float = 0.0  # host RAM the job needs per machine (memory estimate's host_gib)
    host_memory_gib: float | None = None  # what the offer's machine has (None: unknown in the catalog)
    interruption_source: str = ""  # where the rate comes from (the hazard table's level and evidence)
    interruption_low_per_hour: float = 0.0  # 5% and 95% of the rate's posterior
    interruption_high_per_hour: float = 0.0
    spot_availability: float | None = None  # share of time some allowed zone has spot (None: not measured)
    spot_wait_s: float = 0.0  # expected wait for spot capacity at each (re)launch
    #: "measured", or why the capacity was borrowed from measured regions (orchestrator/spot/hazards.py)
    spot_capacity_source: str = ""
    fallback_share: float = 0.0  # share of the work expected on demand for want of spot capacity
    #: 5% and 95% of the expected cost over the seasons the job may meet (the rate and spot capacity as
    #: far apart as the traces' weeks were: orchestrator/spot/season.py), for the chosen candidate (None
    #: for the others); on demand both are the cost
    expected_cost_low_usd: float | None = None
    expected_cost_high_usd: float | None = None
    egress_usd: float | None = None  # data movement (None: not priced; see the notes)
    storage_usd: float | None = None  # the kept checkpoints over the run
    #: data movement per wall hour had the job run in each allowed region (the launch and re-bid order
    #: weighs it: orchestrator/spot/region_order.py region_costs); empty when egress is not priced
    data_usd_per_hour: dict[str, float] = field(default_factory=dict)
    #: the hazard model's spot interruption rate (the job's nodes) had the job run in each allowed region:
    #: the launch and re-bid order weighs the hours an interruption there costs (region_costs)
    region_rates_per_hour: dict[str, float] = field(default_factory=dict)
    #: where the job is expected to run on its market, in the launch order (region_order.launch_order):
    #: share of the time per region (regions it is not expected to reach left out); egress is priced over it
    region_share: dict[str, float] = field(default_factory=dict)
    #: a save's transfer dollars as seconds of the hourly price (the trainer's interval adds it to C)
    save_cost_s: float = 0.0
    #: why the interval is not the model's choice (stretched to what the uploads allow) or the market
    #: is not the one asked for (on-demand expected cheaper); empty when neither
    adjustments: list[str] = field(default_factory=list)
    #: what priced it (costing, market, on-demand and spot prices): the season band is costed from it
    _priced: Any = field(default=None, repr=False, compare=False)

    @property
    def layout_text(self) -> str:
        """The layout column: '2/GPU x1 fsdp', with ' +offload' when the trainer offloads (CPU offload)."""
        text = self.layout.short() if self.layout else ""
        return text + (" +offload" if self.offload != "none" else "")

    @property
    def ranks(self) -> int:
        return self.count * self.nodes

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        for key, value in out.items():
            if isinstance(value, float):
                out[key] = round(value, 4)
        out["layout"] = self.layout.to_json() if self.layout else None
        return out


@dataclass
class Rejection:
    cloud: str
    instance_type: str
    accelerator: str
    count: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Plan:
    chosen: Candidate | None
    candidates: list[Candidate]
    rejected: list[Rejection]
    catalog_source: str
    model: str
    method: str
    estimates: dict[int, MemoryEstimate] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def why_none(self) -> str:
        """One line for an impossible job."""
        single = self.estimates.get(1)
        need = f"needs {single.peak_gib_per_gpu:.1f} GiB on one GPU" if single else "needs more memory"
        sharded = [e for n, e in sorted(self.estimates.items()) if n > 1]
        if sharded:
            need += f" ({sharded[-1].peak_gib_per_gpu:.1f} GiB per GPU sharded over {sharded[-1].n_gpus})"
        counts: dict[str, int] = {}
        for r in self.rejected:
            kind = r.reason.split(":")[0]
            counts[kind] = counts.get(kind, 0) + 1
        top = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])[:3])
        return (
            f"no offer can run this job: {self.model} {self.method} {need}; "
            f"{len(self.rejected)} offers rejected ({top}); see `ftorch plan --json` for each reason"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "method": self.method,
            "catalog_source": self.catalog_source,
            "chosen": self.chosen.to_json() if self.chosen else None,
            "candidates": [c.to_json() for c in self.candidates],
            "rejected": [r.to_json() for r in self.rejected],
            "estimates": {str(n): e.to_json() for n, e in sorted(self.estimates.items())},
            "workload": self.workload,
            "notes": self.notes,
        }


# ---- cost pieces -------------------------------------------------------------------------------------
def ordered_regions(
    offer: Offer, regions: tuple[str, ...], spot: bool = True, nodes: int = 1, **weighed: Any
) -> tuple[str, ...]:
    """`regions` in the order a launch tries them (orchestrator/spot/region_order.py): cheapest first on
    the market, by price alone unless `weighed` gives region_costs the job's data movement and re-bid
    loss (data_usd_per_hour, rates_per_hour, lost_h)."""
    return tuple(
        launch_order(regions, region_costs(regions, offer.region_prices, spot, nodes=nodes, **weighed))
    )


def hazard_of(
    offer: Offer, nodes: int = 1, regions: tuple[str, ...] | None = None, table: HazardTable | None = None
) -> Hazard:
    """The hazard (orchestrator/spot/hazards.py) of a job on `nodes` instances of `offer` in `regions`,
    tried in that order (the plan's launch order); without `regions`, the offer's, cheapest spot first."""
    table = table or load_table()
    where = regions if regions is not None else ordered_regions(offer, offer.regions)
    return table.for_offer(offer.cloud, offer.instance_type, offer.accelerator, offer.count, where, nodes)


def interruption_rate(offer: Offer, nodes: int = 1, table: HazardTable | None = None) -> float:
    """Expected interruptions per hour of a job on `nodes` instances of `offer` (any one ends the attempt;
    the nodes' interruptions are correlated: orchestrator/spot/hazards.py)."""
    return hazard_of(offer, nodes, table=table).rate_per_hour


def billed_hours(hours: float, segments: float, rule: Billing) -> float:
    """Hours billed for `hours` of use split over `segments` instances (each rounded and with a minimum)."""
    rounding = segments * (rule.granularity_s / 2.0 if rule.granularity_s > 1 else 0.0) / 3600.0
    return max(hours + rounding, segments * rule.minimum_s / 3600.0)


def checkpoint_interval(spec: Any, step_s: float, cost: CheckpointCost, rate: float) -> float:
    """Seconds between checkpoints (`interval_and_why` without the why)."""
    return interval_and_why(spec, step_s, cost, rate)[0]


def interval_and_why(
    spec: Any, step_s: float, cost: CheckpointCost, rate: float, save_usd_s: float = 0.0
) -> tuple[float, str | None]:
    """(seconds between checkpoints, why they are not what was asked, or None): `checkpoint.every` steps
    or seconds, or for auto the trainer's interval (trainer.stops.interval.auto_interval) at this
    offer's interruption rate (the rate the task passes to the trainer), where a save also costs
    `save_usd_s` seconds of the offer's price in transfer. Never shorter than the uploads allow: at most
    one upload is in flight, so the trainer skips a save due during one."""
    steps, seconds = spec.checkpoint.every_steps(), spec.checkpoint.every_seconds()
    fixed = fixed_interval_s(steps, seconds, step_s)
    floor = UPLOADS_PER_INTERVAL * cost.upload_s
    if fixed is not None:
        if fixed < cost.upload_s:
            return floor, (
                f"checkpoint.every {fixed:.0f}s is shorter than one upload ({cost.upload_s:.0f}s): the trainer "
                f"skips saves due during an upload, so saves come every {floor:.0f}s"
            )
        return max(1.0, fixed), None
    priced = CheckpointCost(cost.blocking_s + save_usd_s, cost.upload_s)
    chosen = auto_interval(priced, mtbf_from_rate(rate))
    if chosen.seconds > chosen.ceiling_s:
        return chosen.seconds, (
            f"checkpoint interval stretched to {chosen.seconds:.0f}s (over the {chosen.ceiling_s:.0f}s cap): "
            f"{UPLOADS_PER_INTERVAL:g} uploads of {cost.upload_s:.0f}s each must fit in it"
        )
    return chosen.seconds, None


def spot_hours(
    hours: float, rate: float, interval_s: float, blocking_s: float, restart_s: float, upload_s: float = 0.0
) -> float | None:
    """Expected wall hours on spot; None when interruptions come faster than progress."""
    lost_per_interruption_h = (CheckpointCost(blocking_s, upload_s).lost_s(interval_s) + restart_s) / 3600.0
    denominator = 1.0 - rate * lost_per_interruption_h
    if denominator <= 0.2:
        return None
    return hours * (1.0 + blocking_s / interval_s) / denominator


# ---- the planner -------------------------------------------------------------------------------------
def _reject(offer: Offer, reason: str) -> Rejection:
    return Rejection(offer.cloud, offer.instance_type, offer.accelerator, offer.count, reason)


class _Rejected(Exception):
    """An offer lost; the message is its reason as `ftorch plan --json` shows it ("kind: why")."""


@dataclass
class _Job:
    """What every offer is judged against: the spec's wishes and the memory estimate per GPU count."""

    spec: Any
    shape: ModelShape
    work: Workload
    use_spot: bool
    fallback: bool
    needs_bf16: bool
    wanted_acc: set[str]
    estimates: dict[int, MemoryEstimate] = field(default_factory=dict)
    confirm: TraceConfirmation | None = None
    history: History = field(default_factory=History)
    learned: dict[str, str] = field(default_factory=dict)  # what the history decided -> the note saying so
    #: the estimates with CPU offload the planner tried for offers that fit only with it
    offload_estimates: dict[int, MemoryEstimate] = field(default_factory=dict)
    unfit: Any = None  # orchestrator/sizing/replan.py Unfit: what a run of this job that did not fit measured
    hazards: HazardTable | None = None  # interruption rates and capacity (orchestrator/spot/hazards.py)
    store: Store = field(default_factory=lambda: Store(None, None, "disk"))

    def memory_for(self, n: int, offload: str | None = None) -> MemoryEstimate:
        if offload is not None and offload != self.spec.train.offload:
            if n not in self.offload_estimates:
                self.offload_estimates[n] = estimate(self.shape, settings_from_spec(self.spec, n, offload))
            return self.offload_estimates[n]
        if n not in self.estimates:
            self.estimates[n] = estimate(self.shape, settings_from_spec(self.spec, n))
        return self.estimates[n]


def _job(spec: Any, shape: ModelShape) -> _Job:
    from orchestrator.sizing.sky_names import ftorch_name

    res = spec.resources
    return _Job(
        spec=spec,
        shape=shape,
        work=workload(spec),
        use_spot=res.spot and res.policy != "on-demand",
        fallback=res.fallback == "on-demand" and res.policy != "spot-only",
        needs_bf16=spec.train.precision in ("bf16", "bf16-mixed")
        or (spec.method == "qlora" and spec.quantization.compute_dtype == "bf16"),
        wanted_acc={ftorch_name(a).lower() for a in res.accelerators or []},
    )


def make_plan(
    spec: Any,
    *,
    catalog: Catalog | list[Offer] | None = None,
    offline: bool = True,
    shape: ModelShape | None = None,
    online_shapes: bool = False,
    trace: bool = False,
    history: History | None = None,
    unfit: Any = None,
    hazards: HazardTable | None = None,
) -> Plan:
    """Rank every offer of the catalog for `spec` by expected cost; explain every rejection. With `trace`,
        offers whose estimated fit is close (within TRACE_MARGIN of usable memory) are judged by a trace of
        one training step instead (`ftorch estimate --trace`). `unfit` (orchestrator/sizing/replan.py): the job ran out
    of memory on a GPU; that GPU and every one with no more memory are refused."""
    if isinstance(catalog, list | tuple):
        catalog = Catalog(tuple(catalog), "given offers")
    catalog = catalog or load_catalog(offline=offline)
    job = _job(spec, shape or resolve_shape(spec.model, online=online_shapes))
    job.history = history if history is not None else load_history()
    job.hazards = hazards if hazards is not None else load_table()
    job.store = store_of(spec)
    job.unfit = unfit.with_catalog(catalog.offers) if unfit is not None else None  # a re-plan
    job.memory_for(1)
    if trace:
        sizes = [(o.count * spec.resources.nodes, o.gpu_memory_gib) for o in catalog.offers]
        job.confirm = TraceConfirmation(spec, job.shape, sizes, job.memory_for, HEADROOM, TRACE_MARGIN)
    candidates: list[Candidate] = []
    rejected: list[Rejection] = []
    for offer in catalog.offers:
        try:
            candidates.append(_judge(job, offer))
        except _Rejected as lost:
            rejected.append(_reject(offer, str(lost)))
    candidates.sort(key=lambda c: (c.expected_cost_usd, c.ranks, c.expected_hours))
    chosen = _choose(candidates)
    if chosen is not None:  # the chosen one only: GRID x GRID re-costings each
        chosen.expected_cost_low_usd, chosen.expected_cost_high_usd = _season_band(job, *chosen._priced)
    notes = _notes(job, catalog)
    if chosen is not None and chosen.offload == "params" and job.spec.train.offload == "auto":
        notes.append(offload_note(chosen))
    if chosen is not None and (tier := tier_note(chosen, candidates)):
        notes.append(tier)
    if chosen is not None:
        notes += cost_notes(job, chosen, catalog)
    return Plan(
        chosen=chosen,
        candidates=candidates,
        rejected=rejected,
        catalog_source=catalog.source,
        model=job.shape.name,
        method=spec.method,
        estimates=job.estimates,
        workload={**job.work.to_json(), "steps": job.work.steps(spec.train.micro_batch_size)},
        notes=notes,
    )


def offload_note(chosen: Candidate) -> str:
    """Why the chosen offer runs with CPU offload (the planner turned it on: never silently)."""
    host = f"{chosen.host_memory_gib:g} GiB" if chosen.host_memory_gib is not None else "unknown"
    return (
        f"offload: {chosen.count}x {chosen.accelerator} ({chosen.gpu_memory_gib:g} GiB) fits this job only with "
        f"CPU offload, so the trainer runs with train.offload: params (parameters, gradients and optimizer "
        f"state in host RAM: {chosen.host_gib:.1f} GiB needed per machine, {host} there; the optimizer steps "
        f"on the CPU, priced in the hours)"
    )


def cost_notes(job: _Job, chosen: Candidate, catalog: Catalog) -> list[str]:
    """What the chosen candidate's cost rests on and what it had to give: the interruption rate and its
    source, capacity where it is pinned, data movement, a stretched interval or a changed market, and
    more nodes predicted slower than one."""
    out = []
    if chosen.spot:
        out.append(
            f"interruptions: {chosen.interruption_rate_per_hour:.3f}/h for {chosen.nodes} node(s) "
            f"(90%: {chosen.interruption_low_per_hour:.3f}-{chosen.interruption_high_per_hour:.3f}), "
            f"{chosen.expected_interruptions:.1f} expected over {chosen.expected_hours:.1f} h; "
            f"{chosen.interruption_source}"
        )
        low, high = chosen.expected_cost_low_usd, chosen.expected_cost_high_usd
        if low is not None and high is not None and high > low:
            out.append(
                f"cost: ${chosen.expected_cost_usd:,.2f} expected, ${low:,.2f}-${high:,.2f} (90%) over seasons whose interruption rate and spot "
                "capacity move as far as the traces' weeks did; a season unlike any of them can cost more"
            )
        avail = chosen.spot_availability
        if avail is not None and avail < SPOT_SHORT:
            where = ", ".join(chosen.regions[:4])
            then = (
                f"{chosen.fallback_share:.0%} of the work expected on demand"
                if chosen.fallback_share
                else f"each launch waits {chosen.spot_wait_s / 60:.0f} min on average"
            )
            unlikely = " (spot is unlikely to be had there)" if avail < SPOT_UNLIKELY else ""
            out.append(
                f"capacity: spot is obtainable only {avail:.0%} of the time in {where}{unlikely}; {then}"
            )
        if chosen.spot_capacity_source not in ("", "measured"):
            said = chosen.spot_capacity_source.removeprefix("capacity ")
            out.append(f"capacity: {said} (priced as such; not this offer's own measurement)")
    if chosen.egress_usd is None and job.store.how == "unknown":
        out.append(
            f"egress: not priced: the run store's region is unknown offline ({job.spec.checkpoint.uri}); "
            "set checkpoint.region to the bucket's region to price checkpoint and data transfer"
        )
    elif chosen.egress_usd:
        out.append(
            f"egress: ${chosen.egress_usd:.2f} moving checkpoints and data between {_where(chosen)} and "
            f"the run store ({job.store.cloud} {job.store.region}), storage ${chosen.storage_usd or 0:.2f}"
        )
    out += chosen.adjustments
    one = _one_node(job, catalog, chosen) if chosen.nodes > 1 else None
    if one is not None and one.est_hours < chosen.est_hours:
        out.append(
            f"nodes: {chosen.nodes} nodes are predicted slower than 1 ({chosen.est_hours:.1f} h vs "
            f"{one.est_hours:.1f} h of training on one {chosen.instance_type}: FSDP across nodes runs "
            "over the network); resources.nodes: 1 would be faster"
        )
    return out


def _where(chosen: Candidate) -> str:
    """The region the candidate's data movement was priced for (its largest share), with the others'
    shares when it is expected to run in more than one."""
    shares = sorted(chosen.region_share.items(), key=lambda rs: -rs[1])
    if not shares:
        return chosen.regions[0] if chosen.regions else "where it runs"
    (top, share), rest = shares[0], [f"{r} {s:.0%}" for r, s in shares[1:] if s >= 0.005]
    return f"{top} ({share:.0%} of the time; {', '.join(rest)})" if rest else top


def _one_node(job: _Job, catalog: Catalog, chosen: Candidate) -> Candidate | None:
    """The chosen offer judged for the same job on one node (None when it cannot run there)."""
    offer = next(
        (o for o in catalog.offers if (o.cloud, o.instance_type) == (chosen.cloud, chosen.instance_type)),
        None,
    )
    if offer is None:
        return None
    single = job.spec.model_copy(deep=True)
    single.resources.nodes = 1
    trial = _job(single, job.shape)
    trial.history, trial.hazards, trial.store = job.history, job.hazards, job.store
    try:
        return _judge(trial, offer)
    except _Rejected:
        return None


def tier_note(chosen: Candidate, candidates: list[Candidate]) -> str | None:
    """Why a consumer card was chosen (the cheapest adequate offer) and what it gives up; None otherwise."""
    if chosen.accelerator.lower() not in CONSUMER_TIER:
        return None
    price = (
        "spot"
        if chosen.spot
        else "on-demand" + (" (no spot quote)" if chosen.spot_hourly_usd is None else "")
    )
    datacenter = [c for c in candidates if c.accelerator.lower() not in CONSUMER_TIER]
    versus = (
        f"the cheapest datacenter offer, {datacenter[0].cloud} {datacenter[0].instance_type} "
        f"({datacenter[0].accelerator}), expects ${datacenter[0].expected_cost_usd:.2f}"
        if datacenter
        else "no datacenter offer is adequate"
    )
    market = (
        "; vast offers are individual hosts' listings: price and capacity change by the hour"
        if chosen.cloud == "vast"
        else ""
    )
    return (
        f"tier: consumer card {chosen.accelerator} ({chosen.gpu_memory_gib:g} GiB GDDR, PCIe, no NVLink) "
        f"on {chosen.cloud} {price} is the cheapest adequate offer at ${chosen.expected_cost_usd:.2f}; "
        f"{versus}{market}"
    )


def _choose(candidates: list[Candidate]) -> Candidate | None:
    """The fewest GPUs among the candidates within SINGLE_GPU_TIE of the cheapest (`candidates` sorted)."""
    if not candidates:
        return None
    cheapest = candidates[0].expected_cost_usd
    close = [c for c in candidates if c.expected_cost_usd <= cheapest * (1 + SINGLE_GPU_TIE)]
    return min(close, key=lambda c: (c.ranks, c.expected_cost_usd))


def _notes(job: _Job, catalog: Catalog) -> list[str]:
    notes = [f"catalog: {catalog.source}", f"memory headroom {HEADROOM:.0%} per GPU"]
    if job.shape.approximate:
        notes.append(f"{job.shape.name}: architecture not modelled exactly; sized as llama-like")
    if job.confirm:
        notes.append(job.confirm.note())
    notes += sorted(job.learned.values())
    return notes


def _judge(job: _Job, offer: Offer) -> Candidate:
    """The offer as a candidate, or _Rejected with the first reason it lost (checks in a fixed order:
    the user's wishes, the hardware, the layout, memory, price, then the expected cost)."""
    od, spot, regions = _check_wishes(job, offer)
    acc = _check_hardware(job, offer)
    if job.unfit is not None and (measured := job.unfit.refuses(offer)):  # a re-plan: it ran out of memory
        raise _Rejected(measured)
    nodes = job.spec.resources.nodes
    layout = layout_for(job.spec, offer.count, nodes)
    if not layout.ok:  # the trainer would refuse it: never offered
        raise _Rejected(f"layout: {layout.reason}")
    mem, need, fit, fit_job = _check_fit(job, offer, layout)
    od = od * nodes if od is not None else None  # prices of the whole job (all its nodes)
    spot = spot * nodes if spot is not None else None
    is_spot, price = _check_price(job, offer, od, spot)
    scale = _time_scale(job, offer)
    cand = _candidate(job, offer, layout, mem, acc, is_spot, price, od, spot, regions, scale)
    if cand is None:
        raise _Rejected("preemption: interrupted too often to make progress")
    if fit in ("traced", "measured"):
        cand.peak_gib_per_gpu, cand.fit, cand.fit_job = need, fit, fit_job
    cand.offload, cand.host_gib, cand.host_memory_gib = mem.offload, mem.host_gib, offer.memory_gib
    budget = job.spec.resources.budget_usd
    if budget is not None and cand.expected_cost_usd > budget:
        raise _Rejected(
            f"budget: expected ${cand.expected_cost_usd:.2f} is over resources.budget_usd ${budget:.2f}"
        )
    return cand


def _check_wishes(job: _Job, offer: Offer) -> tuple[float | None, float | None, tuple[str, ...]]:
    """resources.clouds, accelerators, regions and gpus; the offer's (on-demand, spot) prices per
    instance in the wanted regions, and those regions."""
    res = job.spec.resources
    if res.clouds and offer.cloud not in res.clouds:
        raise _Rejected(f"cloud: {offer.cloud} is not in resources.clouds")
    if job.wanted_acc and offer.accelerator.lower() not in job.wanted_acc:
        raise _Rejected(f"accelerator: {offer.accelerator} is not in resources.accelerators")
    od, spot, regions = offer.prices_in(res.regions)
    if res.regions and not regions:
        raise _Rejected("region: not offered in resources.regions")
    if res.gpus and offer.count != res.gpus:
        raise _Rejected(f"gpus: has {offer.count} GPUs, resources.gpus asks for {res.gpus}")
    return od, spot, regions


def _check_hardware(job: _Job, offer: Offer) -> Any:
    """Performance figures, bf16, flash attention and NVLink; the accelerator's figures."""
    acc = accelerator(offer.accelerator, offer.instance_type)
    if acc is None:
        raise _Rejected(f"accelerator: no performance figures for {offer.accelerator}")
    if job.needs_bf16 and not acc.bf16:
        raise _Rejected(
            f"precision: {offer.accelerator} has no bf16; use train.precision: fp16-mixed to run on it"
        )
    if job.spec.train.attn_implementation == "flash_attention_2" and not acc.bf16:
        raise _Rejected(f"attention: flash_attention_2 needs Ampere or newer, not {offer.accelerator}")
    if offer.count > 1 and not offer.nvlink and not job.spec.resources.allow_pcie:
        raise _Rejected(
            f"interconnect: sharding over {offer.count} GPUs needs NVLink, this "
            f"is {offer.interconnect} (allow with resources.allow_pcie: true)"
        )
    return acc


def _measured_peak(job: _Job, offer: Offer, layout: Layout) -> tuple[float, str, str] | None:
    """(peak GiB, "measured", job id) from a plausible run with this job's key (orchestrator/sizing/history.py)."""
    acc = accelerator(offer.accelerator, offer.instance_type)
    gpu = acc.name if acc else offer.accelerator
    spec = job.spec.model_dump(mode="json")
    key = key_of(spec, layout.micro_batch, job.spec.train.gradient_checkpointing, layout.ranks, gpu)
    row = job.history.peak_for(key)
    if row is None:
        return None
    job.learned[f"memory {row['job_id']}"] = (
        f"memory: measured {peak_gib(row):.1f} GiB per GPU by job {row['job_id']} (attempt {row['attempt']}, "
        f"{row['ranks']}x {row['gpu']}) is used over the estimate for {layout.ranks}-rank layouts"
    )
    return peak_gib(row), "measured", str(row["job_id"])


def _time_scale(job: _Job, offer: Offer) -> float:
    """Measured / predicted tokens/s of runs on the offer's GPU (1.0 when none): the time model's scale."""
    acc = accelerator(offer.accelerator, offer.instance_type)
    found = job.history.time_scale(acc.name, job.spec.method) if acc else None
    if acc is None or found is None:
        return 1.0
    ratio, rows = found
    jobs = ", ".join(sorted({str(r["job_id"]) for r in rows}))
    job.learned[f"time {acc.name}"] = (
        f"time: {acc.name} runs at x{ratio:.2f} the time model's tokens/s, measured by {len(rows)} "
        f"run(s) ({jobs}); its hours are scaled by that"
    )
    return ratio


def _check_memory(
    job: _Job, offer: Offer, layout: Layout, mem: MemoryEstimate
) -> tuple[float, str, str | None]:
    """Peak GiB per GPU, how it was judged ("estimated", "traced" or "measured") and the job that measured
    it, when it fits with HEADROOM. A measurement of the same key overrides the trace and the estimate."""
    ranks = layout.ranks
    need, fit = (
        job.confirm.peak(ranks, offer.gpu_memory_gib) if job.confirm else (mem.peak_gib_per_gpu, "estimated")
    )
    source = None
    if (measured := _measured_peak(job, offer, layout)) is not None:
        need, fit, source = measured
    usable = offer.gpu_memory_gib * (1 - HEADROOM)
    if need <= usable:
        return need, fit, source
    where = "on 1 GPU" if ranks == 1 else f"per GPU sharded over {ranks}"
    if fit == "estimated" and need <= mem.load_gib_per_gpu:
        where += " to load the model"
    how = fit if source is None else f"measured by job {source}"
    raise _Rejected(
        f"memory: needs {need:.1f} GiB {where} ({how}), has "
        f"{offer.gpu_memory_gib:g} GiB ({usable:.1f} usable with {HEADROOM:.0%} headroom)"
    )


def _check_fit(job: _Job, offer: Offer, layout: Layout) -> tuple[MemoryEstimate, float, str, str | None]:
    """The estimate the offer runs with, its peak GiB per GPU and how that was judged: the job as it is,
    or, when only the GPU memory is short and the job leaves train.offload at auto, with CPU offload
    (train.offload: params) if the GPU and the machine's RAM then hold it."""
    mem = job.memory_for(layout.ranks)
    try:
        need, fit, fit_job = _check_memory(job, offer, layout, mem)
    except _Rejected as short:
        if job.spec.train.offload != "auto" or not _offload_layout_ok(job, offer):
            raise
        offloaded = job.memory_for(layout.ranks, "params")
        usable = offer.gpu_memory_gib * (1 - HEADROOM)
        if offloaded.peak_gib_per_gpu > usable:
            raise _Rejected(f"{short}; with CPU offload still {offloaded.peak_gib_per_gpu:.1f} GiB") from None
        try:
            _check_host(offer, offloaded)
        except _Rejected as host:
            raise _Rejected(f"{short}; CPU offload would fit the GPU, but {host}") from None
        return offloaded, offloaded.peak_gib_per_gpu, "estimated", None
    _check_host(offer, mem)
    return mem, need, fit, fit_job


def _offload_layout_ok(job: _Job, offer: Offer) -> bool:
    """Whether the trainer accepts this job with train.offload: params on the offer (its optimizer must
    step on FSDP's sharded parameters)."""
    trial = job.spec.model_copy(deep=True)
    trial.train.offload = "params"
    return layout_for(trial, offer.count, job.spec.resources.nodes).ok


def _check_host(offer: Offer, mem: MemoryEstimate) -> None:
    """The machine's RAM holds the job's host side (the offloaded state, rank 0's loading copy, the trainer
    processes: the estimate's host_gib) with HOST_HEADROOM to spare. An offer whose RAM the catalog does
    not give is not checked, except for CPU offload, which it must hold: refused then."""
    parts = ", ".join(f"{k} {v:.1f}" for k, v in mem.host_breakdown_gib.items() if v)
    if offer.memory_gib is None:
        if mem.offload != "none":
            raise _Rejected(
                f"host RAM: CPU offload needs {mem.host_gib:.1f} GiB per machine ({parts}); the catalog "
                f"does not give {offer.instance_type}'s RAM (unknown), so it cannot be checked"
            )
        return
    usable = offer.memory_gib * (1 - HOST_HEADROOM)
    if mem.host_gib > usable:
        what = "with CPU offload " if mem.offload != "none" else ""
        raise _Rejected(
            f"host RAM: needs {mem.host_gib:.1f} GiB per machine {what}({parts}), has "
            f"{offer.memory_gib:g} GiB ({usable:.1f} usable with {HOST_HEADROOM:.0%} headroom)"
        )


def _check_price(job: _Job, offer: Offer, od: float | None, spot: float | None) -> tuple[bool, float]:
    """(on spot?, USD/hour of the whole job) under resources.spot/policy/fallback and max_hourly_usd."""
    if job.use_spot and spot is not None:
        is_spot, price = True, spot
    elif job.use_spot and job.fallback and od is not None or not job.use_spot and od is not None:
        is_spot, price = False, od
    else:
        what = "no spot price" if job.use_spot else "no on-demand price"
        hint = " (resources.fallback: on-demand allows on-demand)" if job.use_spot and od else ""
        raise _Rejected(f"price: {what} for {offer.instance_type}{hint}")
    limit = job.spec.resources.max_hourly_usd
    if limit is not None and price > limit:
        raise _Rejected(f"max price: ${price:.2f}/h is over resources.max_hourly_usd ${limit:.2f}")
    return is_spot, price


#: one market's expected (cost USD, wall hours, interruptions, checkpoint interval s, data movement)
_Paid = tuple[float, float, float, float, Any]


@dataclass
class _Costing:
    """What an offer's expected cost on either market depends on (`_candidate`), and the adjustments made
    on the way (an interval stretched for the uploads, the market changed)."""

    job: _Job
    offer: Offer
    time: TimeEstimate  # the time model's, scaled by measured runs
    ckpt: CheckpointCost
    startup_s: float  # provisioning and the model's download: billed once on any instance
    restart_s: float  # the startup and the checkpoint's load
    hazard: Hazard
    step_s: float  # one optimizer step
    save_gb: float  # one checkpoint
    pull_gb: float  # the data, pulled at each launch
    shares: dict[str, float]  # where spot launches land, by region (the hazard's, over `order`)
    order: tuple[str, ...] = ()  # the regions in the launch order the hazard and shares are for
    adjustments: list[str] = field(default_factory=list)

    @property
    def hours(self) -> float:
        """Compute hours without interruptions."""
        return self.time.hours

    @property
    def rate(self) -> float:
        """Spot interruptions per hour of the job (its nodes)."""
        return self.hazard.rate_per_hour

    def shares_on(self, spot: bool) -> dict[str, float]:
        """Where the job runs on a market, by region: spot lands by the hazard's shares (capacity and
        interruptions over the order), on demand in the order's first region."""
        return self.shares if spot or not self.order else {self.order[0]: 1.0}

    def hourly_on(self, spot: bool, default: float | None) -> float | None:
        """The job's price per hour on a market, where it is expected to run there (`shares_on`): the
        regions' prices over the landing shares, times the nodes; `default` (the offer's median over
        the allowed regions) where the catalog prices none of those regions, or without a price."""
        if default is None:
            return None
        column = 1 if spot else 0
        paid = [
            (share, price[column])
            for region, share in self.shares_on(spot).items()
            if (price := self.offer.region_prices.get(region)) and price[column]
        ]
        weight = sum(share for share, _ in paid)
        if weight <= 0:
            return default
        return sum(share * (hourly or 0.0) for share, hourly in paid) / weight * self.hazard.nodes

    def in_order(self, order: tuple[str, ...]) -> _Costing:
        """This costing with the hazard and landing shares of a launch trying the regions in `order`."""
        hazard = hazard_of(self.offer, self.hazard.nodes, order, self.job.hazards)
        return replace(self, hazard=hazard, shares=_shares(hazard, order), order=order, adjustments=[])

    def movement(self, wall: float, interval: float, interruptions: float, spot: bool = True) -> Movement:
        """The data movement and storage of a run of `wall` hours with a save every `interval` s, on spot
        or on demand (where it lands: `shares_on`)."""
        saves = self.hours * 3600.0 / interval + 1.0  # the periodic saves and the final one
        return price_movement(
            self.job.store, self.offer.cloud, self.shares_on(spot), save_gb=self.save_gb, saves=saves,
            pull_gb=self.pull_gb, launches=1.0 + interruptions, restores=interruptions,
            keep=self.job.spec.checkpoint.keep, hours=wall,
        )  # fmt: skip

    def cost_on(self, spot_price: bool, hourly: float | None) -> _Paid | None:
        """(cost, wall hours, interruptions, interval, data movement) on one market; None without a price
        there, or on spot when interruptions come faster than progress."""
        if hourly is None:
            return None
        per_save = self.movement(1.0, 1.0, 0.0, spot_price).per_save_usd
        interval, why = interval_and_why(self.job.spec, self.step_s, self.ckpt, self.rate if spot_price else 0.0,
                                         per_save * 3600.0 / hourly)  # fmt: skip
        if why and why not in self.adjustments:
            self.adjustments.append(why)
        startup_h = self.startup_s / 3600.0
        rule = BILLING.get(self.offer.cloud, DEFAULT_BILLING)
        if not spot_price or self.rate <= 0:
            wall = self.hours + startup_h
            moved = self.movement(wall, interval, 0.0, spot_price)
            extra = (moved.egress_usd or 0.0) + (moved.storage_usd or 0.0)
            return hourly * billed_hours(wall, 1, rule) + extra, wall, 0.0, interval, moved
        spot_wall = spot_hours(
            self.hours, self.rate, interval, self.ckpt.blocking_s, self.restart_s, self.ckpt.upload_s
        )
        if spot_wall is None:
            return None
        wall = spot_wall + startup_h
        interruptions = self.rate * wall
        moved = self.movement(wall, interval, interruptions)
        extra = (moved.egress_usd or 0.0) + (moved.storage_usd or 0.0)
        return (
            hourly * billed_hours(wall, 1 + interruptions, rule) + extra,
            wall,
            interruptions,
            interval,
            moved,
        )

    def data_usd_per_hour(self, regions: tuple[str, ...], paid: _Paid) -> dict[str, float]:
        """Data movement per wall hour of the `paid` run had it run all in each region (empty when the
        egress is not priced)."""
        _, wall, interruptions, interval, moved = paid
        per_region: dict[str, float] = {}
        for region in regions if moved.egress_usd is not None and wall > 0 else ():
            there = price_movement(
                self.job.store, self.offer.cloud, {region: 1.0}, save_gb=self.save_gb,
                saves=self.hours * 3600.0 / interval + 1.0, pull_gb=self.pull_gb, launches=1.0 + interruptions,
                restores=interruptions, keep=0, hours=wall,
            )  # fmt: skip
            if there.egress_usd is not None:
                per_region[region] = there.egress_usd / wall
        return per_region


def _shares(hazard: Hazard, order: tuple[str, ...]) -> dict[str, float]:
    """The hazard's landing shares by region; all on the first region of `order` when it has none."""
    return dict(hazard.region_share) or ({order[0]: 1.0} if order else {})


def _costing(
    job: _Job,
    offer: Offer,
    layout: Layout,
    mem: MemoryEstimate,
    acc: Any,
    order: tuple[str, ...],
    scale: float,
) -> _Costing:
    """The offer's training time (the time model's, times `scale`), checkpoint, startup and restart costs
    and interruption hazard over its regions tried in `order`."""
    spec, shape, work = job.spec, job.shape, job.work
    ranks = layout.ranks
    settings = settings_from_spec(spec, ranks, mem.offload)
    link = offer.interconnect if layout.nodes == 1 else "network"  # FSDP across nodes: not NVLink
    vcpus = offer.vcpus / offer.count if offer.vcpus else None
    t = scaled(
        estimate_time(shape, settings, mem.trainable_params, work, acc, ranks, link, vcpus_per_rank=vcpus),
        scale,
    )
    ckpt_bytes = checkpoint_bytes(shape, settings)
    ckpt = CheckpointCost.of_bytes(ckpt_bytes)
    model_bytes = shape.params * 2.0
    startup_s = PROVISION_S + model_bytes / (DOWNLOAD_GBPS * 1e9)  # billed once on any instance
    restart_s = startup_s + ckpt_bytes / (CHECKPOINT_GBPS * 1e9)
    hazard = hazard_of(offer, layout.nodes, order, job.hazards)
    return _Costing(
        job=job,
        offer=offer,
        time=t,
        ckpt=ckpt,
        startup_s=startup_s,
        restart_s=restart_s,
        hazard=hazard,
        step_s=layout.accum * t.step_s_per_microbatch,
        save_gb=ckpt_bytes / 1e9,
        pull_gb=(work.tokens_per_epoch or 0) * DATA_BYTES_PER_TOKEN / 1e9,
        shares=_shares(hazard, order),
        order=order,
    )


@dataclass(frozen=True)
class _Market:
    """The market an offer runs on, at what price per hour, its expected cost there (`paid`), and each
    market's expected cost (None: no price, or no progress)."""

    is_spot: bool
    price: float
    paid: _Paid
    on_spot: _Paid | None
    on_demand: _Paid | None
    fallback_share: float  # share of the work expected on demand for want of spot capacity
    spot_price: float | None  # each market's price per hour where the job lands on it (hourly_on)
    od_price: float | None


def _market(
    job: _Job, costs: _Costing, is_spot: bool, price: float, od: float | None, spot: float | None
) -> _Market | None:
    """Each market's expected cost (with spot's capacity), and the market the offer runs on: on demand
    instead of spot when the job may fall back and on demand is expected cheaper; None when the market
    it runs on makes no progress. Each market is priced where the job lands on it (the launch tries the
    cheapest regions first: the offer's median would price regions it does not run in)."""
    spot, od = costs.hourly_on(True, spot), costs.hourly_on(False, od)
    price = (spot if is_spot else od) or price
    on_spot = costs.cost_on(True, spot)
    on_demand = costs.cost_on(False, od)
    hazard = costs.hazard
    fallback_share = 0.0
    if on_spot is not None and (hazard.no_capacity > 0 or hazard.relaunch_no_capacity > 0):
        on_spot, fallback_share = _with_capacity(on_spot, on_demand, hazard, job.fallback)
    if (
        is_spot
        and on_spot is not None
        and on_demand is not None
        and job.fallback
        and on_demand[0] < on_spot[0]
    ):
        costs.adjustments.append(
            f"market: on-demand is expected cheaper than spot here (${on_demand[0]:.2f} vs ${on_spot[0]:.2f} "
            f"at {costs.rate:.2f} interruptions/h), so resources.fallback: on-demand runs it on demand"
        )
        is_spot, price = False, od
    paid = on_spot if is_spot else on_demand
    if paid is None:
        return None
    return _Market(is_spot, price, paid, on_spot, on_demand, fallback_share, spot, od)


def _candidate(
    job: _Job,
    offer: Offer,
    layout: Layout,
    mem: MemoryEstimate,
    acc: Any,
    is_spot: bool,
    price: float,
    od: float | None,
    spot: float | None,
    regions: tuple[str, ...],
    scale: float = 1.0,
) -> Candidate | None:
    """The offer as a candidate on the market it runs on, with its expected cost; None when interruptions
    come faster than progress there."""
    region_rates = _region_rates(job, offer, layout, regions)
    first = ordered_regions(offer, regions, is_spot, layout.nodes)  # by price: nothing is costed yet
    costs = _costing(job, offer, layout, mem, acc, first, scale)
    settled = _settled(job, costs, regions, region_rates, (is_spot, price, od, spot))
    if settled is None:
        return None
    costs, market = settled
    is_spot, price, hazard, rate = market.is_spot, market.price, costs.hazard, costs.rate
    cost, wall, interruptions, interval, moved = market.paid
    per_region = costs.data_usd_per_hour(regions, market.paid)
    return Candidate(
        cloud=offer.cloud,
        instance_type=offer.instance_type,
        accelerator=offer.accelerator,
        count=offer.count,
        gpu_memory_gib=offer.gpu_memory_gib,
        interconnect=offer.interconnect,
        spot=is_spot,
        hourly_usd=price,
        spot_hourly_usd=market.spot_price,
        ondemand_hourly_usd=market.od_price,
        est_hours=costs.hours,
        expected_hours=wall,
        expected_cost_usd=cost,
        expected_cost_spot_usd=market.on_spot[0] if market.on_spot else None,
        expected_cost_ondemand_usd=market.on_demand[0] if market.on_demand else None,
        checkpoint_interval_s=interval,
        checkpoint_write_s=costs.ckpt.upload_s,
        checkpoint_blocking_s=costs.ckpt.blocking_s,
        startup_s=costs.startup_s,
        restart_overhead_s=costs.restart_s,
        interruption_rate_per_hour=rate if is_spot else 0.0,  # the job's nodes, on the market it runs on
        expected_interruptions=interruptions,
        peak_gib_per_gpu=mem.peak_gib_per_gpu,
        regions=list(regions),
        tokens_per_s=costs.time.tokens_per_s,
        time_scale=scale,
        nodes=layout.nodes,
        layout=layout,
        interruption_source=hazard.source
        + ("" if is_spot else " (this plan runs it on demand: not interrupted)"),
        interruption_low_per_hour=hazard.low_per_hour,
        interruption_high_per_hour=hazard.high_per_hour,
        spot_availability=hazard.availability,
        spot_wait_s=hazard.wait_s,
        spot_capacity_source=hazard.capacity_source,
        fallback_share=market.fallback_share if is_spot else 0.0,
        egress_usd=moved.egress_usd,
        storage_usd=moved.storage_usd,
        adjustments=costs.adjustments,
        data_usd_per_hour=per_region,
        region_rates_per_hour=region_rates,
        region_share={r: round(v, 4) for r, v in costs.shares_on(is_spot).items() if round(v, 4) > 0},
        save_cost_s=moved.per_save_usd * 3600.0 / price if price else 0.0,
        _priced=(costs, market, od, spot),
    )


def _season_band(
    job: _Job, costs: _Costing, market: _Market, od: float | None, spot: float | None
) -> tuple[float, float]:
    """5% and 95% of the market's expected cost over the seasons the job may meet (season.seasons): spot
    costed again in each, capacity included; a season in which spot makes no progress costs on demand's
    (the fallback) or is left out without one. On demand: its cost, both."""
    cost = market.paid[0]
    if not market.is_spot:
        return cost, cost
    drawn = []
    for hazard in seasons(costs.hazard, job.hazards):
        there = _market(job, replace(costs, hazard=hazard, adjustments=[]), True, spot or 0.0, od, spot)
        if there is not None and there.on_spot is not None:
            drawn.append(there.on_spot[0])
        elif there is not None and there.on_demand is not None and job.fallback:
            drawn.append(there.on_demand[0])
    if not drawn:
        return cost, cost
    low, high = band(drawn)
    return min(low, cost), max(high, cost)


#: re-costings at most while the launch order a costing implies is not the one it was costed in (the order
#: weighs the market, interval and data movement the costing gives; it settles at once in practice)
ORDER_PASSES = 3


def _settled(
    job: _Job,
    costs: _Costing,
    regions: tuple[str, ...],
    rates: dict[str, float],
    prices: tuple[bool, float, float | None, float | None],
) -> tuple[_Costing, _Market] | None:
    """The costing in the launch order its own result implies, with its market: the market it runs on,
    its interval and its data movement per region give the order (`_launch_order`); re-costed in that
    order until it stays, at most ORDER_PASSES times. None when the market makes no progress."""
    is_spot, price, od, spot = prices
    market = _market(job, costs, is_spot, price, od, spot)
    for _ in range(ORDER_PASSES):
        if market is None:
            return None
        order = _launch_order(costs, market, regions, rates)
        if order == costs.order:
            break
        costs = costs.in_order(order)
        market = _market(job, costs, is_spot, price, od, spot)
    return (costs, market) if market is not None else None


def _launch_order(
    costs: _Costing, market: _Market, regions: tuple[str, ...], rates: dict[str, float]
) -> tuple[str, ...]:
    """The order a launch of this candidate tries `regions` in (region_order.region_costs, with what
    skypilot_render.regions_of reads off the candidate): its market's price there plus the data movement
    per hour, times the re-bid loss of the hazard model's rate there (`rates`, as the candidate has them)."""
    return ordered_regions(
        costs.offer, regions, market.is_spot, costs.hazard.nodes,
        data_usd_per_hour=costs.data_usd_per_hour(regions, market.paid), rates_per_hour=rates,
        lost_h=lost_hours(costs.restart_s, market.paid[3]),
    )  # fmt: skip


def _region_rates(job: _Job, offer: Offer, layout: Layout, regions: tuple[str, ...]) -> dict[str, float]:
    """The job's spot interruption rate per hour (its nodes) had it run in each of `regions`."""
    return {r: round(hazard_of(offer, layout.nodes, (r,), job.hazards).rate_per_hour, 5) for r in regions}


def _with_capacity(
    on_spot: tuple[float, float, float, float, Any],
    on_demand: tuple[float, float, float, float, Any] | None,
    hazard: Hazard,
    fallback: bool,
) -> tuple[tuple[float, float, float, float, Any], float]:
    """Spot's (cost, hours, ...) when at each (re)launch no allowed zone has spot with chance q.

    With a fallback the job goes on demand then, and stays (nothing interrupts it there): the spot
    phase ends at the first launch that finds no spot. The first launch finds none with chance q0 (the
    share of time without spot), a relaunch with q1 (measured right after interruptions: spot is lost
    together, so q1 > q0); with I interruptions expected over the whole job on spot, failed relaunches
    come as a Poisson process of q1 x I over the work, so spot does a share
    (1 - q0) x (1 - exp(-q1 I)) / (q1 I) of it and on-demand the rest (`fallback_share`). Without one,
    each launch waits `wait_s` (unbilled, in the hours)."""
    cost, wall, interruptions, interval, moved = on_spot
    q = hazard.no_capacity
    if fallback and on_demand is not None:
        qi = hazard.relaunch_no_capacity * interruptions
        on_spot_share = (1.0 - q) * ((1.0 - math.exp(-qi)) / qi if qi > 1e-12 else 1.0)
        f = 1.0 - on_spot_share
        od_cost, od_wall = on_demand[0], on_demand[1]
        blended = ((1 - f) * cost + f * od_cost, (1 - f) * wall + f * od_wall, (1 - f) * interruptions,
                   interval, moved)  # fmt: skip
        return blended, f
    return (cost, wall + (1.0 + interruptions) * hazard.wait_s / 3600.0, interruptions, interval, moved), 0.0

"""SkyPilot task YAML from a job spec and its plan. Pure functions: no sky, no torch, no network.

The templates (the task_templates package, shipped in the wheel) hold setup and run (install ftorch, claim an attempt number, run the
trainer, alone or under torchrun); rendering fills in what depends on the job:

- resources: the plan's adequate offers as `ordered` (the plan's ranking by expected cost is kept),
  spot offers first, then on-demand offers only when `resources.fallback: on-demand`;
- job_recovery: strategy, `recover_on_exit_codes: [75, 88]` (the trainer's "preempted, checkpoint
  written" and "out of memory, layout adapted"), `max_restarts_on_errors`; `max_hourly_cost`; `disk_size` for the model; `image_id`;
- envs: the run's id and store URL (the same across every recovery: ftorch's job id is the run id);
- the ftorch to install: exactly this one (orchestrator/backends/ship.py: the source tree as workdir, or the
  installed wheel in file_mounts), never a version from a package index;
- the environment: the run's lock (orchestrator/jobfile/envlock.py), written by the setup itself so the task
  shows every pin, installed with --no-deps and checked (trainer/envlock.py); none with an image_id;
- secrets: names only. Values are read from the user's environment at launch, inside the SDK call,
  and never written to the YAML, the registry, the run store or any output.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from orchestrator.backends import ship
from orchestrator.errors import SpecError
from orchestrator.sizing.sky_names import check_sky_name
from trainer import exitcodes
from trainer.config import JobSpec
from trainer.stops.watchdog import SETUP_ENV, setup_timeout

KINDS = ("single", "node", "multinode")
#: fsspec protocols a cloud instance can reach (a local path or memory:// is only on this machine)
REMOTE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oci", "hf")
MAX_PER_KIND = 10  # spot offers, then as many on-demand offers, at most
HUB_TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
STORE_CREDENTIALS = {
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    "az": ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_CONNECTION_STRING"),
}
#: W&B settings passed to the task when set here (WANDB_API_KEY goes as a secret)
WANDB_SETTINGS = ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_BASE_URL", "WANDB_MODE")
SKY_INFRA = {
    "aws": "aws",
    "gcp": "gcp",
    "azure": "azure",
    "lambda": "lambda",
    "runpod": "runpod",
    "vast": "vast",
}
SECRETS_NOTE = (
    "# secrets: names only; the values are read from your environment at launch and never printed\n"
)


def scheme(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else ""


def require_remote(spec: JobSpec) -> None:
    """A cloud instance reads and writes the run store, the data and the model: none can be local."""
    from trainer.data.source import looks_like_hub_id

    for field, value in (
        ("checkpoint.uri", spec.checkpoint.uri),
        ("output.uri", spec.output.uri),
        ("data.path", spec.data.path),
        ("data.eval_path", spec.data.eval_path),
    ):
        hub = field.startswith("data.") and value is not None and looks_like_hub_id(value)
        if value is not None and not hub and scheme(value) not in REMOTE_SCHEMES:
            raise SpecError(
                field,
                f"{value} is not reachable from a cloud instance; the skypilot backend needs a bucket "
                "URL such as s3://bucket/ftorch or gs://bucket/ftorch"
                + (" (or a Hugging Face Hub data set id)" if field.startswith("data.") else ""),
            )
    if spec.model.startswith("/") or "://" in spec.model and scheme(spec.model) not in REMOTE_SCHEMES:
        raise SpecError("model", f"{spec.model} is a local folder; give a hub id for the skypilot backend")


def secret_names(spec: JobSpec, environ: Mapping[str, str] | None = None) -> list[str]:
    """The secrets to pass: the job file's list, else the hub token and the store's keys that are set."""
    if spec.resources.secrets is not None:
        return list(dict.fromkeys(spec.resources.secrets))
    environ = os.environ if environ is None else environ
    store = "s3" if scheme(spec.checkpoint.uri) in ("s3", "s3a") else scheme(spec.checkpoint.uri)
    wanted = [*HUB_TOKENS, *STORE_CREDENTIALS.get(store, ())]
    if "wandb" in spec.train.report_to:
        wanted.append("WANDB_API_KEY")
    return [name for name in wanted if environ.get(name)]


def disk_gb(spec: JobSpec) -> int:
    """The job file's disk, else room for the model's 16-bit weights twice (download + cache) and 60 GB."""
    if spec.resources.disk_gb:
        return spec.resources.disk_gb
    try:
        from orchestrator.sizing.shapes import resolve_shape

        params = resolve_shape(spec.model).params
    except Exception:  # an unknown model: a generous default
        return 256
    need = 2.0 * params * 2 / 1e9 + 60
    return int(max(100, math.ceil(need / 50.0) * 50))


def job_recovery(spec: JobSpec) -> dict[str, Any]:
    return {
        "strategy": spec.resources.recovery,
        "max_restarts_on_errors": spec.resources.max_restarts_on_errors,
        # 75: preempted with a checkpoint; 88: out of memory, the layout adapted (trainer/train_step/oom.py): both resume
        # from the store. 89 (does not fit even at the smallest layout) is not retried: it ends FAILED;
        # nor 86 (the health checks ended the run, trainer/health/rules.py): a relaunch would repeat it
        "recover_on_exit_codes": [exitcodes.PREEMPTED, exitcodes.OOM_ADAPT],
    }


def _entry(c: Any, spot: bool, region: str | None) -> dict[str, Any]:
    infra = SKY_INFRA.get(c.cloud, c.cloud)
    return {
        "infra": f"{infra}/{region}" if region else infra,
        "accelerators": {check_sky_name(c.accelerator): c.count},
        "use_spot": spot,
    }


#: policies whose task lists on-demand offers after the spot ones, so that SkyPilot's own recovery falls
#: back to on demand when no spot launches, with nobody watching (`ordered` is walked from the top)
FALLING_BACK = ("deadline", "spot-fallback")


def resource_entries(spec: JobSpec, plan: Any) -> list[dict[str, Any]]:
    """The plan's offers for SkyPilot, spot first (plan order), then on-demand (with `fallback: on-demand`
    or a `deadline` / `spot-fallback` policy).

    Entries name cloud (and region when the job file restricts regions), accelerator and count, and
    leave the instance type to SkyPilot: its catalog picks the cheapest instance with those GPUs.
    """
    from orchestrator.spot.policy import policy_name_for

    res = spec.resources
    want_spot = res.spot and res.policy != "on-demand"
    falls_back = res.fallback == "on-demand" or policy_name_for(res) in FALLING_BACK
    want_ondemand = not want_spot or (falls_back and res.policy != "spot-only")
    seen: set[tuple[Any, ...]] = set()
    spot_entries: list[dict[str, Any]] = []
    od_entries: list[dict[str, Any]] = []

    def add(target: list[dict[str, Any]], c: Any, spot: bool) -> None:
        regions = [r for r in c.regions if r in res.regions] if res.regions else [None]
        for region in regions:
            key = (c.cloud, c.accelerator, c.count, spot, region)
            if key not in seen and len(target) < MAX_PER_KIND:
                seen.add(key)
                target.append(_entry(c, spot, region))

    if want_spot:
        for c in plan.candidates:
            if c.spot_hourly_usd is not None:
                add(spot_entries, c, True)
    if want_ondemand:
        by_od_cost = sorted(
            (c for c in plan.candidates if c.ondemand_hourly_usd is not None),
            key=lambda c: (c.expected_cost_ondemand_usd or math.inf, c.count),
        )
        for c in by_od_cost:
            add(od_entries, c, False)
    return spot_entries + od_entries


def regions_of(plan: Any) -> dict[str, list[str]]:
    """The regions of each offer, keyed "cloud|GPU|count" as the task names them (region_order.entry_key):
    what a cloud-wide entry is spread over when the controller moves a lost region last. Cheapest
    first by region_order.region_costs, the rule the planner priced the candidate's landing and data
    movement over: the bundled snapshot's per-region price on the market the candidate runs on (spot,
    else on-demand where no spot is quoted; on demand: on-demand) plus what moving the job's checkpoints
    and data from there to the run store costs per hour (the plan's `data_usd_per_hour`, per node), times
    the hours the hazard model's interruptions there lose on spot (`region_rates_per_hour`, the restart
    and half an interval); regions without a known price keep the plan's order, after the others."""
    from orchestrator.sizing.catalog import bundled_catalog
    from orchestrator.spot.region_order import launch_order, lost_hours, region_costs

    prices = {(o.cloud, o.instance_type): o.region_prices for o in bundled_catalog().offers}
    best: dict[str, dict[str, float]] = {}
    for c in plan.candidates:
        key = f"{SKY_INFRA.get(c.cloud, c.cloud)}|{check_sky_name(c.accelerator)}|{c.count}"
        known = best.setdefault(key, {})
        costs = region_costs(
            getattr(c, "regions", None) or [], prices.get((c.cloud, c.instance_type)) or {}, bool(c.spot),
            nodes=c.nodes, data_usd_per_hour=getattr(c, "data_usd_per_hour", None),
            rates_per_hour=getattr(c, "region_rates_per_hour", None),
            lost_h=lost_hours(c.restart_overhead_s, c.checkpoint_interval_s),
        )  # fmt: skip
        for region, cost in costs.items():
            known[region] = min(known.get(region, math.inf), cost)
    return {k: launch_order(v, v) for k, v in best.items()}


def interruption_envs(plan: Any) -> dict[str, str]:
    """The planner's interruption rates for the trainer's checkpoint interval (trainer/stops/interruptions.py):
    per cloud and GPUs per node (the highest of the offers the task may land on), per cloud, region and
    GPUs per node (the hazard model's rate there), and the chosen offer's MTBF as the fallback."""
    from trainer.stops.interruptions import mtbf_from_rate, rate_key

    rates: dict[str, float] = {}
    for c in plan.candidates:
        rate = c.interruption_rate_per_hour if c.spot_hourly_usd is not None else 0.0
        key = rate_key(c.cloud, c.count)
        rates[key] = round(max(rates.get(key, 0.0), rate), 4)
        for region, there in (getattr(c, "region_rates_per_hour", None) or {}).items():
            key = rate_key(c.cloud, c.count, region)  # the hazard model's rate where it lands
            there = there if c.spot_hourly_usd is not None else 0.0
            rates[key] = round(max(rates.get(key, 0.0), there), 4)
    chosen = getattr(plan, "chosen", None)
    rate = chosen.interruption_rate_per_hour if chosen is not None and chosen.spot else 0.0
    envs = {
        "FTORCH_INTERRUPTION_RATES": json.dumps(rates, sort_keys=True),
        "FTORCH_AUTO_MTBF_S": f"{mtbf_from_rate(rate):.0f}",
    }
    save_cost = getattr(chosen, "save_cost_s", 0.0) if chosen is not None else 0.0
    if save_cost:
        from trainer.stops.interval import SAVE_COST_ENV

        envs[SAVE_COST_ENV] = f"{save_cost:.3f}"  # the same C the planner's interval used
    return envs


def price_envs(plan: Any) -> dict[str, str]:
    """Every offer's price per node for the trainer's budget stop (trainer/stops/budget.py), FTORCH_PRICES
    keyed cloud:region:accelerator:count:market: per region where the bundled snapshot has one, and "*"
    (the offer's dearest known price) for any other region the task may land in."""
    from orchestrator.sizing.catalog import bundled_catalog
    from trainer.stops.budget import PRICES_ENV, price_key

    by_region = {(o.cloud, o.instance_type): o.region_prices for o in bundled_catalog().offers}
    prices: dict[str, float] = {}

    def put(key: str, usd: float | None) -> None:
        if usd is not None:
            prices[key] = round(max(prices.get(key, 0.0), float(usd)), 6)

    for c in plan.candidates:
        cloud, acc = c.cloud, check_sky_name(c.accelerator)  # as SKYPILOT_CLUSTER_INFO names the cloud
        regional = by_region.get((c.cloud, c.instance_type)) or {}
        for spot, usd in ((True, c.spot_hourly_usd), (False, c.ondemand_hourly_usd)):
            if usd is None:
                continue
            known = [p[1 if spot else 0] for p in regional.values() if p[1 if spot else 0] is not None]
            put(price_key(cloud, None, acc, c.count, spot), max([usd, *known]))
            for region in getattr(c, "regions", None) or []:
                od_spot = regional.get(region) or (None, None)
                put(price_key(cloud, region, acc, c.count, spot), od_spot[1 if spot else 0] or usd)
    return {PRICES_ENV: json.dumps(prices, sort_keys=True)}


#: SkyPilot job statuses its jobs controller passes to `event_callback` (sky/jobs/state.py: every failure
#: arrives as FAILED) that a dead trainer cannot report, and the ftorch event and state each one is
CALLBACK_EVENTS = {
    "RECOVERING": (
        "preempted",
        "RECOVERING",
        "SkyPilot is recovering the job (preempted, or its machine failed)",
    ),
    "FAILED": ("failed", "FAILED", "SkyPilot marked the job failed; `ftorch logs JOB` shows why"),
    "CANCELLED": ("cancelled", "CANCELLED", "the managed job was cancelled; checkpoints kept"),
}
#: seconds one callback may take in all: SkyPilot runs it synchronously, with no timeout of its own,
#: inside its status update (sky/jobs/utils.py event_callback_func), so it must never hang recovery
CALLBACK_TIMEOUT_S = 10
NOTIFY_ENV = "FTORCH_NOTIFY_WEBHOOK"
#: the callback's sender: python3's urllib (no ftorch on SkyPilot's jobs controller); argv[1] is the
#: payload for each status, built by trainer/recording/notify.py (the one payload format); it adds the time
_CALLBACK_PY = f"""import json,os,sys,time,urllib.request as u
p=json.loads(sys.argv[1]).get(os.environ.get("JOB_STATUS",""))
if p:
 p["at"]=time.time();p["sky_job_id"]=os.environ.get("JOB_ID")
 h={{"Content-Type":"application/json","User-Agent":"ftorch"}}
 u.urlopen(u.Request(os.environ["{NOTIFY_ENV}"],json.dumps(p).encode(),h),timeout=float(sys.argv[2])).read()
"""


def check_notify(spec: JobSpec) -> None:
    """`notify.command` runs on the machine that watches the job; a cloud job must not depend on one."""
    if spec.notify is not None and spec.notify.command:
        raise SpecError(
            "notify.command",
            "is not run for skypilot jobs (no machine of yours watches them); use notify.webhook: the "
            "trainer and SkyPilot's jobs controller post to it (docs/clouds.md)",
        )


def event_callback(spec: JobSpec, job_id: str, run_uri: str, output_uri: str | None = None) -> str | None:
    """The task's `event_callback`: POST the webhook on what a dead trainer cannot say (RECOVERING,
    FAILED, CANCELLED; those in notify.on), bounded by CALLBACK_TIMEOUT_S and never failing; None when
    nothing is asked for. Other statuses return at once, without starting python."""
    from trainer.recording.notify import payload

    notify = spec.notify
    if notify is None or not notify.webhook:
        return None
    row = {
        "job_id": job_id, "name": spec.name, "backend": "skypilot", "budget_usd": spec.resources.budget_usd,
        "run_uri": run_uri, "output_uri": output_uri,
    }  # fmt: skip
    bodies = {}
    for status, (event, state, reason) in CALLBACK_EVENTS.items():
        if event in notify.on:
            body = payload(event, {**row, "state": state, "reason": reason}, source="skypilot")
            body.pop("at")  # the time of the event: set when it is sent
            bodies[status] = body
    if not bodies:
        return None
    import shlex

    statuses = "|".join(bodies)
    send = (
        f"timeout -k 2 {CALLBACK_TIMEOUT_S} python3 -c {shlex.quote(_CALLBACK_PY)} "
        f"{shlex.quote(json.dumps(bodies, sort_keys=True, separators=(',', ':')))} {CALLBACK_TIMEOUT_S - 2}"
    )
    return (
        f"# ftorch: {', '.join(sorted(set(e for e, _s, _r in CALLBACK_EVENTS.values()) & set(notify.on)))}"
        f" to notify.webhook, at most {CALLBACK_TIMEOUT_S} s (never blocks SkyPilot's recovery)\n"
        f'case "$JOB_STATUS" in {statuses}) {send} || true ;; esac\n'
    )


def template_kind(spec: JobSpec, entries: list[dict[str, Any]]) -> str:
    if spec.resources.nodes > 1:
        return "multinode"
    if any(max(e["accelerators"].values()) > 1 for e in entries):
        return "node"
    return "single"


def load_template(kind: str) -> dict[str, Any]:
    """A template from the task_templates package (package data in the wheel; the folder in a checkout)."""
    from importlib import resources

    try:
        text = (resources.files("task_templates") / f"{kind}.yaml").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        path = Path(__file__).resolve().parents[2] / "task_templates" / f"{kind}.yaml"
        if not path.exists():
            raise SpecError(
                "resources.backend", f"the SkyPilot task template {kind}.yaml is missing"
            ) from None
        text = path.read_text(encoding="utf-8")
    return yaml.safe_load(text)


def pip_extras(spec: JobSpec) -> list[str]:
    """ftorch's extras the instance needs: both bucket filesystems, qlora for 4-bit or 8-bit Adam, trackers."""
    extras = ["s3", "gcs"]
    if spec.method == "qlora" or spec.train.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        extras.append("qlora")
    extras += [t for t in ("tensorboard", "wandb") if t in spec.train.report_to]
    return extras


#: flash-attn has no wheels on PyPI (it builds against the installed torch), so it is outside the lock:
#: pinned here, installed with --no-deps (its einops is in the lock); change it with the lock
FLASH_ATTN = "flash-attn==2.8.3.post2"
#: the kernel packages of train.kernels (trainer/kernels.py), outside the lock likewise: pure Python over
#: Triton (which the lock's torch carries), installed with --no-deps; change them with the lock
KERNEL_PINS = {"liger-kernel": "0.8.5"}


def extra_pip(spec: JobSpec) -> str:
    """Packages outside the lock, pinned and installed with --no-deps: the packages of train.kernels;
    flash-attn, which builds against the installed torch (so without pip's build isolation), for
    flash_attention_2. (adlfs, for az:// stores, is in the lock.)"""
    from trainer.kernels import PACKAGES

    extras = [f"{PACKAGES[k]}=={KERNEL_PINS[PACKAGES[k]]}" for k in spec.train.kernels]  # train.kernels
    if spec.train.attn_implementation == "flash_attention_2":
        extras += ["--no-build-isolation", FLASH_ATTN]
    return " ".join(extras)


def lock_setup(lock: str | None) -> tuple[str, dict[str, str]]:
    """The setup lines that write the run's lock on the instance (the pins shown in the task itself),
    and the envs that tell the template's setup where it is and which Python it is for; with no lock
    (a digest-pinned image) nothing is installed but ftorch."""
    from orchestrator.jobfile.envlock import REMOTE_LOCK
    from trainer.envlock import header

    if lock is None:
        return "", {"FTORCH_LOCK": "", "FTORCH_LOCK_PYTHON": ""}
    text = lock if lock.endswith("\n") else lock + "\n"
    lines = (
        "# ftorch: the run's environment lock (env/lock.txt in the run store), installed below as is\n"
        'mkdir -p "$(dirname "${FTORCH_LOCK}")"\n'
        f"cat > \"${{FTORCH_LOCK}}\" <<'FTORCH_LOCK_EOF'\n{text}FTORCH_LOCK_EOF\n"
    )
    return lines, {"FTORCH_LOCK": REMOTE_LOCK, "FTORCH_LOCK_PYTHON": header(text).get("python", "")}


def render_task(
    spec: JobSpec,
    job_id: str,
    run_uri: str,
    plan: Any,
    environ: Mapping[str, str] | None = None,
    lock: str | None = None,
) -> dict[str, Any]:
    """The SkyPilot task config (a dict, as in a task YAML) for one ftorch job. `lock`: the run's
    environment lock (env/lock.txt), else the one a launch writes (orchestrator/jobfile/envlock.py)."""
    from orchestrator.jobfile.envlock import check_image, task_lock

    require_remote(spec)
    check_image(spec.resources.image_id)
    lock = (None if spec.resources.image_id else lock) if lock is not None else task_lock(spec, environ)
    check_notify(spec)
    entries = resource_entries(spec, plan)
    if not entries:
        why = plan.why_none() if getattr(plan, "chosen", None) is None else "no offer fits the spot policy"
        raise SpecError("resources", why)
    kind = template_kind(spec, entries)
    task = load_template(kind)
    install = ship.install_for_task(pip_extras(spec), environ)
    resources: dict[str, Any] = {
        "ordered": entries,
        "disk_size": disk_gb(spec),
        "job_recovery": job_recovery(spec),
    }
    if spec.resources.max_hourly_usd is not None:
        resources["max_hourly_cost"] = spec.resources.max_hourly_usd
    if spec.resources.image_id:
        resources["image_id"] = spec.resources.image_id
    from orchestrator.spot.policy import spot_return_env

    envs = dict(task.get("envs") or {})
    envs.update(offload_envs(spec, plan, entries))
    lock_lines, lock_envs = lock_setup(lock)
    envs.update(lock_envs)
    envs.update(
        FTORCH_RUN_URI=run_uri,
        FTORCH_RUN_ID=job_id,
        FTORCH_PIP_SPEC=install.pip_spec,
        FTORCH_EXTRA_PIP=extra_pip(spec),
        FTORCH_STORAGE_OPTIONS=json.dumps(spec.checkpoint.storage_options, sort_keys=True),
        # the run script's watch kills a trainer frozen before its first heartbeat (trainer/stops/watchdog.py)
        **{SETUP_ENV: f"{setup_timeout(spec.train.health.setup_timeout_s):g}"},
        **interruption_envs(plan),
        **price_envs(plan),  # the trainer's budget stop: the price of whatever offer it lands on
        # a deadline job probes back to spot by itself from on demand (issue 19; trainer/stops/spot_probe.py)
        **spot_return_env(spec.resources, getattr(getattr(plan, "chosen", None), "restart_overhead_s", None)),
    )
    callback = event_callback(spec, job_id, run_uri, _output_uri(spec, run_uri))
    # an env, not a secret: SkyPilot 0.14.1 gives the callback `task.envs` only (sky/jobs/utils.py:1102);
    # hidden in --dry-run, shown by `sky jobs queue` (docs/clouds.md, "Why not a SkyPilot secret")
    if callback:
        envs[NOTIFY_ENV] = spec.notify.webhook if spec.notify else ""
    if "wandb" in spec.train.report_to:  # where the run goes (not secrets; the key is one, above)
        source = os.environ if environ is None else environ
        envs.update({k: source[k] for k in WANDB_SETTINGS if source.get(k)})
    rendered: dict[str, Any] = {"name": job_id}
    if install.workdir:
        rendered["workdir"] = install.workdir
    if install.file_mounts:
        rendered["file_mounts"] = dict(install.file_mounts)
    if kind == "multinode":
        rendered["num_nodes"] = spec.resources.nodes
    rendered["resources"] = resources
    rendered["envs"] = {k: str(v) for k, v in envs.items()}
    names = secret_names(spec, environ)
    if names:
        rendered["secrets"] = {name: None for name in names}
    rendered["setup"] = lock_lines + task["setup"]
    rendered["run"] = task["run"]
    if callback:
        rendered["event_callback"] = callback
    return rendered


def offload_envs(spec: JobSpec, plan: Any, entries: list[dict[str, Any]]) -> dict[str, str]:
    """CPU offload in the task: when the planner chose it (train.offload: auto, an offer that fits only
    with it) the trainer is told so (FTORCH_OFFLOAD, trainer/distributed.py) on whichever offer the task
    lands; and with offload every entry asks SkyPilot for the host RAM it needs (`memory: N+`, GiB), since
    SkyPilot picks the instance type."""
    from orchestrator.sizing.planner import HOST_HEADROOM
    from trainer.layout import OFFLOAD_ENV

    chosen = getattr(plan, "chosen", None)
    offload = spec.train.offload == "params" or (
        spec.train.offload == "auto" and getattr(chosen, "offload", "none") == "params"
    )
    if not offload or chosen is None:
        return {}
    need = math.ceil(chosen.host_gib / (1 - HOST_HEADROOM))
    for entry in entries:
        entry["memory"] = f"{need}+"
    return {OFFLOAD_ENV: "params"} if spec.train.offload == "auto" else {}


def _output_uri(spec: JobSpec, run_uri: str) -> str:
    from trainer.runstore.storage import join_uri

    return spec.output.uri or join_uri(run_uri, "output")  # as orchestrator/jobs/lifecycle.py


def template_of(task: Mapping[str, Any]) -> str:
    """Which template a rendered task came from (by its run script)."""
    for kind in KINDS:
        if load_template(kind)["run"] == task.get("run"):
            return kind
    return "custom"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (setup, run) as literal blocks, as people write them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(task: Mapping[str, Any]) -> str:
    """The task as YAML, with a note on where secret values come from. Never holds a secret value."""
    text = yaml.dump(dict(task), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=110)
    return (SECRETS_NOTE if task.get("secrets") else "") + text


def plan_table(plan: Any, limit: int = 8) -> list[dict[str, Any]]:
    """The plan's top offers, for --dry-run."""
    rows = []
    for c in plan.candidates[:limit]:
        rows.append(
            {
                "cloud": c.cloud,
                "instance_type": c.instance_type,
                "gpus": (f"{c.nodes} nodes x " if c.nodes > 1 else "") + f"{c.count}x {c.accelerator}",
                "layout": c.layout.describe() if c.layout else None,
                "spot": c.spot,
                "hourly_usd": round(c.hourly_usd, 4),
                "est_hours": round(c.est_hours, 2),
                "expected_cost_usd": round(c.expected_cost_usd, 2),
            }
        )
    return rows

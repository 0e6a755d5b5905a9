"""Rendering SkyPilot tasks: every cloud example renders and SkyPilot's own loader accepts it; the facts
that matter for spot runs hold; secrets never show; the templates' run scripts work for real.

Offline: SkyPilot's `Task.from_yaml_config` checks resources in depth without a server or network.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, ftorch, job_dict, prepare_run, write_data
from http_fakes import FakeMetadata, _closed_port_url

from orchestrator.backends import skypilot_render as sr
from orchestrator.backends.skypilot import render_job
from orchestrator.errors import SpecError
from orchestrator.jobfile.spec import load_job, validate_job
from trainer import exitcodes
from trainer.runstore.attempts import claim_attempt, ending, machine_key, was_preempted
from trainer.runstore.store import RunStore
from trainer.stops.interruptions import prior_mtbf_s
from trainer.stops.interval import CheckpointCost, auto_interval

EXAMPLES = sorted(REPO.glob("examples/*.yaml"))
CLOUD_EXAMPLES = [
    p for p in EXAMPLES if (yaml.safe_load(p.read_text()).get("resources") or {}).get("backend") == "skypilot"
]
MINE = ["mistral-7b-lora.yaml", "llama3-8b-chat-qlora.yaml", "llama3-8b-full-2nodes.yaml"]
SECRET_VALUES = {
    "HF_TOKEN": "hf_TESTSECRETVALUE0000",
    "AWS_ACCESS_KEY_ID": "AKIATESTSECRETKEY0000",
    "AWS_SECRET_ACCESS_KEY": "wJalrTESTSECRETACCESSKEYVALUE0000",
    "WANDB_API_KEY": "wandbTESTSECRETKEYVALUE00000000000000000",
}


@pytest.fixture(scope="module")
def sky(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """SkyPilot, imported with a private HOME so nothing touches the user's ~/.sky."""
    sky = pytest.importorskip("sky")
    home = tmp_path_factory.mktemp("sky-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("SKYPILOT_DISABLE_LOCAL_API_SERVER", "1")
        yield sky


def sky_accepts(sky: Any, task: dict[str, Any], secrets: dict[str, str] | None = None) -> Any:
    """SkyPilot's loader (in-depth resources check) and its recovery-strategy registry."""
    import sky.jobs.recovery_strategy  # noqa: F401 - fills JOBS_RECOVERY_STRATEGY_REGISTRY

    overrides = list((secrets or {}).items()) or None
    loaded = sky.Task.from_yaml_config(copy.deepcopy(task), secrets_overrides=overrides)
    for resources in loaded.resources:
        recovery = resources.job_recovery
        assert recovery["strategy"].lower() in sky.JOBS_RECOVERY_STRATEGY_REGISTRY
        assert recovery["recover_on_exit_codes"] == [exitcodes.PREEMPTED, exitcodes.OOM_ADAPT]
    return loaded


def render_example(path: Path, **env: str) -> tuple[Any, dict[str, Any]]:
    spec = load_job(path, check_support=False)
    return render_job(spec, f"{spec.name}-abc123", f"{spec.checkpoint.uri}/{spec.name}-abc123", environ=env)


def test_my_examples_exist_and_are_cloud_jobs() -> None:
    names = {p.name for p in CLOUD_EXAMPLES}
    assert set(MINE) <= names
    assert len(CLOUD_EXAMPLES) >= 6


@pytest.mark.parametrize("path", CLOUD_EXAMPLES, ids=lambda p: p.stem)
def test_every_cloud_example_renders_and_skypilot_accepts_it(sky: Any, path: Path) -> None:
    _plan, task = render_example(path, **SECRET_VALUES)
    loaded = sky_accepts(sky, task, {n: SECRET_VALUES[n] for n in task.get("secrets", {})})
    assert loaded.name == task["name"]
    assert task["envs"]["FTORCH_RUN_ID"] == task["name"]
    assert task["envs"]["FTORCH_RUN_URI"].endswith("/" + task["name"])
    assert task["envs"]["FTORCH_RUN_URI"].split("://")[0] in ("s3", "gs")
    entries = task["resources"]["ordered"]
    spots = [e["use_spot"] for e in entries]
    assert spots == sorted(spots, reverse=True), "spot offers come first"
    spec = load_job(path, check_support=False)
    from orchestrator.backends.skypilot_controller import needs_controller, watch_lines

    # every entry's price travels in the task: the trainer's budget stop finds the one it lands on
    prices = json.loads(task["envs"]["FTORCH_PRICES"])
    for e in entries:
        acc, count = next(iter(e["accelerators"].items()))
        market = "spot" if e["use_spot"] else "on-demand"
        assert any(k.endswith(f":{acc}:{count}:{market}") and v > 0 for k, v in prices.items()), (e, prices)
    if spec.resources.budget_usd is not None:  # the trainer's (trainer/stops/budget.py), no controller's
        assert any(f"budget: ${spec.resources.budget_usd:g}" in line for line in watch_lines(spec, task))
        assert needs_controller(spec, task) == needs_controller(
            spec.model_copy(update={"notify": None}), task
        )
    from orchestrator.spot.policy import policy_name_for

    falls_back = spec.resources.fallback == "on-demand" or policy_name_for(spec.resources) in sr.FALLING_BACK
    if not falls_back and spec.resources.spot:
        assert all(spots), "on-demand offers only with fallback: on-demand or a deadline/spot-fallback policy"
    elif spec.resources.spot:
        assert any(spots) and not all(spots)
    clouds = {e["infra"].split("/")[0] for e in entries}
    assert clouds <= set(spec.resources.clouds or clouds)
    assert task["resources"]["disk_size"] >= 100
    if spec.resources.max_hourly_usd:
        assert task["resources"]["max_hourly_cost"] == spec.resources.max_hourly_usd
    # the YAML as printed is what SkyPilot's YAML loader reads, and holds no secret value
    text = sr.to_yaml(task)
    for value in SECRET_VALUES.values():
        assert value not in text
    assert yaml.safe_load(text) == task


def test_my_examples_pass_full_validation_where_the_trainer_can_run_them() -> None:
    spec = load_job(REPO / "examples/mistral-7b-lora.yaml")  # unsupported features refused here
    assert spec.resources.backend == "skypilot" and spec.method == "lora"


def test_templates_are_valid_skypilot_tasks(sky: Any) -> None:
    for kind in sr.KINDS:
        template = sr.load_template(kind)
        sky_accepts_plain = sky.Task.from_yaml_config({**copy.deepcopy(template), "name": kind})
        assert "python -m trainer" in template["run"]
        assert "trainer.runstore.attempts" in template["run"]
        assert sky_accepts_plain.run == template["run"]
    node = sr.load_template("node")["run"]
    assert "torchrun --standalone" in node and "SKYPILOT_NUM_GPUS_PER_NODE" in node
    multi = sr.load_template("multinode")["run"]
    for var in (
        "SKYPILOT_NODE_IPS",
        "SKYPILOT_NODE_RANK",
        "SKYPILOT_NUM_NODES",
        "SKYPILOT_NUM_GPUS_PER_NODE",
    ):
        assert f"${var}" in multi, var


def test_template_choice_and_multi_node_wiring(sky: Any) -> None:
    _p, single = render_example(REPO / "examples/mistral-7b-lora.yaml")
    assert sr.template_of(single) == "single" and "num_nodes" not in single
    _p, node = render_example(REPO / "examples/llama3-8b-full.yaml")
    assert sr.template_of(node) == "node"
    assert any(max(e["accelerators"].values()) == 8 for e in node["resources"]["ordered"])
    _p, multi = render_example(REPO / "examples/llama3-8b-full-2nodes.yaml")
    assert sr.template_of(multi) == "multinode" and multi["num_nodes"] == 2
    loaded = sky_accepts(sky, multi)
    assert loaded.num_nodes == 2


def test_fallback_and_spot_switches(tmp_path: Path) -> None:
    path = REPO / "examples/mistral-7b-lora.yaml"
    spec = load_job(path, ["resources.fallback=none"])
    _p, task = render_job(spec, "j", "s3://b/j", environ={})
    assert all(e["use_spot"] for e in task["resources"]["ordered"])
    spec = load_job(path, ["resources.spot=false"])
    _p, task = render_job(spec, "j", "s3://b/j", environ={})
    assert not any(e["use_spot"] for e in task["resources"]["ordered"])
    spec = load_job(path, ["resources.regions=[us-east-1]"])
    _p, task = render_job(spec, "j", "s3://b/j", environ={})
    assert {e["infra"] for e in task["resources"]["ordered"]} == {"aws/us-east-1"}


#: a container pinned by digest: what resources.image_id must be for a docker image (orchestrator/jobfile/envlock.py)
PINNED_IMAGE = "docker:pytorch/pytorch@sha256:" + "ab" * 32


def test_recovery_settings_are_wired() -> None:
    spec = load_job(
        REPO / "examples/llama3-8b-chat-qlora.yaml",
        [f"resources.image_id={PINNED_IMAGE}"],
        check_support=False,
    )
    _p, task = render_job(spec, "j", "gs://b/j", environ={})
    assert task["resources"]["job_recovery"] == {
        "strategy": "FAILOVER",
        "max_restarts_on_errors": 2,
        "recover_on_exit_codes": [75, 88],  # preempted; out of memory with the layout adapted (not 89)
    }
    assert task["resources"]["image_id"] == PINNED_IMAGE
    assert task["envs"]["FTORCH_PIP_SPEC"] == ".[s3,gcs,qlora]"  # bitsandbytes and accelerate
    assert task["secrets"] == {"HF_TOKEN": None}


def test_planner_and_trainer_size_auto_checkpoints_with_one_young_function_and_one_rate() -> None:
    # clouds with spot quotes only: with runpod and lambda open an on-demand consumer card can be cheapest
    spec = load_job(
        REPO / "examples/llama3-8b-qlora.yaml", ["resources.clouds=[aws, gcp]"], check_support=False
    )
    assert spec.checkpoint.every == "auto"
    plan, task = render_job(spec, "j", "s3://b/j", environ={})
    chosen = plan.chosen
    assert chosen.spot and chosen.interruption_rate_per_hour > 0, chosen
    mtbf, _source = prior_mtbf_s(task["envs"])  # what the trainer starts from, off the cluster info
    assert mtbf == pytest.approx(3600.0 / chosen.interruption_rate_per_hour, abs=1)
    # the interval the planner priced is the trainer's for the same cost (trainer.stops.interval)
    cost = CheckpointCost(chosen.checkpoint_blocking_s, chosen.checkpoint_write_s)
    assert chosen.checkpoint_interval_s == pytest.approx(auto_interval(cost, mtbf).seconds, rel=1e-3)


def test_disk_grows_with_the_model() -> None:
    small = load_job(REPO / "examples/mistral-7b-lora.yaml")
    big = load_job(REPO / "examples/llama3-70b-qlora.yaml", check_support=False)
    assert sr.disk_gb(small) == 100
    assert sr.disk_gb(big) >= 300  # 70B in 16 bit is 140 GB; downloaded, then cached
    assert sr.disk_gb(load_job(REPO / "examples/llama3-8b-full-2nodes.yaml", check_support=False)) == 500


def test_default_secrets_follow_the_store_and_the_environment() -> None:
    spec = load_job(REPO / "examples/mistral-7b-lora.yaml")
    assert sr.secret_names(spec, {}) == []
    assert sr.secret_names(spec, SECRET_VALUES) == ["HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    gcs = load_job(REPO / "examples/mistral-7b-lora.yaml", ["checkpoint.uri=gs://b/f", "data.path=gs://b/d"])
    assert sr.secret_names(gcs, SECRET_VALUES) == ["HF_TOKEN"]


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("checkpoint.uri=../runs", "checkpoint.uri"),
        ("checkpoint.uri=memory://runs", "checkpoint.uri"),
        ("data.path=/tmp", "data.path"),
        ("output.uri=/tmp/out", "output.uri"),
    ],
)
def test_local_paths_are_refused_for_the_cloud(override: str, field: str) -> None:
    spec = load_job(REPO / "examples/mistral-7b-lora.yaml", [override])
    with pytest.raises(SpecError) as caught:
        render_job(spec, "j", f"{spec.checkpoint.uri}/j", environ={})
    assert caught.value.field == field
    assert "\n" not in str(caught.value)


def test_cli_dry_run_prints_plan_and_task_and_no_secret(tmp_path: Path) -> None:
    env = {**SECRET_VALUES, "FTORCH_HOME": str(tmp_path / "home")}
    result = ftorch(
        "launch",
        "examples/mistral-7b-lora.yaml",
        "--dry-run",
        "--set",
        "resources.secrets=[HF_TOKEN]",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    for value in SECRET_VALUES.values():
        assert value not in result.stdout and value not in result.stderr
    assert "(dry run: nothing launched)" in result.stdout and "recover_on_exit_codes" in result.stdout
    result = ftorch(
        "launch",
        "examples/mistral-7b-lora.yaml",
        "--dry-run",
        "--json",
        "--set",
        "train.report_to=[wandb]",
        env={**env, "WANDB_PROJECT": "my-project"},
    )
    assert result.returncode == 0, result.stderr
    for value in SECRET_VALUES.values():
        assert value not in result.stdout and value not in result.stderr
    out = json.loads(result.stdout)
    assert out["dry_run"] and out["plan"]["chosen"]["count"] == 1
    assert out["plan"]["top_offers"][0]["cloud"] in ("aws", "gcp", "azure")
    # the default secrets: the hub token, the store's keys and, for W&B, its key (names only)
    task = yaml.safe_load(out["task_yaml"])
    assert task["secrets"] == dict.fromkeys(
        ["HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY"]
    )
    assert task["envs"]["WANDB_PROJECT"] == "my-project" and "wandb" in task["envs"]["FTORCH_PIP_SPEC"]
    assert "recover_on_exit_codes:\n    - 75" in out["task_yaml"]
    assert not (tmp_path / "home" / "registry.db").exists(), "a dry run records nothing"


def test_cli_refuses_a_local_store_in_one_line(tmp_path: Path) -> None:
    result = ftorch(
        "launch",
        "examples/mistral-7b-lora.yaml",
        "--dry-run",
        "--set",
        "checkpoint.uri=/tmp/runs",
        env={"FTORCH_HOME": str(tmp_path / "home")},
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: checkpoint.uri: /tmp/runs is not reachable from a cloud instance")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# ---- attempt numbers on the cloud -----------------------------------------------------------------
def test_attempt_numbers_are_claimed_per_placement(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.write_spec({"job": {}, "run_id": "r"})
    node_a = {"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_CLUSTER_INFO": '{"cloud": "aws"}'}
    node_b = {"SKYPILOT_NODE_IPS": "10.0.9.1\n10.0.9.2", "SKYPILOT_CLUSTER_INFO": '{"cloud": "gcp"}'}
    assert claim_attempt(store, node_a) == 1
    assert claim_attempt(store, node_a) == 1  # the other node of the same attempt
    assert claim_attempt(store, node_b) == 2  # relaunched elsewhere after a preemption
    assert machine_key(node_a) != machine_key(node_b)
    assert store.read_json("attempts/0002.json")["cluster_info"] == {"cloud": "gcp"}
    store.write_progress({"attempt": 5, "state": "preempted"})  # a run started by another launcher
    assert claim_attempt(store, {"SKYPILOT_NODE_IPS": "x"}) == 6
    assert was_preempted(store, 5) and not was_preempted(store, 6)


def test_a_relaunch_on_the_same_machines_gets_a_new_attempt_number(tmp_path: Path) -> None:
    """FAILOVER (or a restart after an error) on a cluster still up: same node IPs, same cluster info.
    Once attempt 1's trainer has started (its epoch), the same key claims 2; both nodes agree."""
    store = RunStore(str(tmp_path / "run"))
    store.write_spec({"job": {}, "run_id": "r"})
    same = {"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_CLUSTER_INFO": '{"cloud": "aws"}'}
    assert claim_attempt(store, same) == 1 and claim_attempt(store, same) == 1  # node 0, node 1
    store.claim_epoch({"attempt": 1})  # rank 0's trainer of attempt 1 starts
    store.write_progress({"attempt": 1, "state": "preempted"})
    assert claim_attempt(store, same) == 2  # the relaunch, node 0
    assert claim_attempt(store, same) == 2  # node 1 of the relaunch
    assert sorted(store.listdir("attempts")) == ["0001.json", "0002.json"]


def test_a_worker_node_waits_for_rank_0s_record_before_exit_75(tmp_path: Path) -> None:
    """Multi-node: a worker's torchrun ends first (killed when rank 0 leaves); only rank 0's recorded
    preemption turns its exit into 75, so it waits (bounded) while progress still says running."""
    import threading

    store = RunStore(str(tmp_path / "run"))
    store.write_progress({"attempt": 7, "state": "running"})
    assert not was_preempted(store, 7)  # the race, judged at once
    later = threading.Timer(0.3, lambda: store.write_progress({"attempt": 7, "state": "preempted"}))
    later.start()
    assert was_preempted(store, 7, wait_s=10, poll_s=0.05)
    store.write_progress({"attempt": 8, "state": "failed"})  # rank 0 recorded a crash: no wait, no 75
    assert not was_preempted(store, 8, wait_s=10, poll_s=0.05)
    # what the run script asks (`--ending`): the same bounded wait, and an unhealthy end read the same way
    store.write_progress({"attempt": 9, "state": "running"})
    later = threading.Timer(0.3, lambda: store.write_progress({"attempt": 9, "state": "preempted"}))
    later.start()
    assert ending(store, 9, wait_s=10, poll_s=0.05) == "preempted"
    store.claim_epoch({"attempt": 10, "ended": "unhealthy"})
    store.write_progress({"attempt": 10, "state": "failed"})
    assert ending(store, 10, wait_s=10, poll_s=0.05) == "unhealthy"
    assert ending(store, 8, wait_s=10, poll_s=0.05) == ""
    template = (REPO / "task_templates/multinode.yaml").read_text()
    assert '--ending "$FTORCH_ATTEMPT" --wait "$wait_s"' in template and "wait_s=120" in template


# ---- the templates' run scripts, for real (bash, the trainer, torchrun on CPU) ---------------------
def _template_env(run_uri: str, metadata_url: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("AWS", "GCP", "AZURE"):
        env[f"FTORCH_{name}_METADATA_URL"] = _closed_port_url()
    env["FTORCH_AWS_METADATA_URL"] = metadata_url
    env.update(
        FTORCH_RUN_URI=run_uri,
        FTORCH_NOTICE_POLL_S="0.05",
        FTORCH_PROGRESS_EVERY_S="0.05",
        SKYPILOT_NUM_GPUS_PER_NODE="1",
        SKYPILOT_NODE_IPS="127.0.0.1",
        SKYPILOT_CLUSTER_INFO='{"cloud": "aws", "region": "test"}',
        OMP_NUM_THREADS="1",
    )
    env["PATH"] = f"{Path(os.sys.executable).parent}:{env.get('PATH', '')}"
    return env


def test_node_template_turns_a_notice_under_torchrun_into_exit_75(tiny_model: Path, tmp_path: Path) -> None:
    """torchrun reports a worker's 75 as 1; the template asks the run store and exits 75 itself."""
    data = write_data(tmp_path / "data.jsonl", "instruction", 64)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 3000})
    job["checkpoint"]["every"] = 100000
    run_uri = prepare_run(job, "node-run")
    store = RunStore(run_uri)
    script = sr.load_template("node")["run"]
    with FakeMetadata("aws") as fake:
        proc = subprocess.Popen(
            ["bash", "-c", script],
            env=_template_env(run_uri, fake.url),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.time() + 120
            while time.time() < deadline and proc.poll() is None:
                if (store.read_progress() or {}).get("step", 0) >= 3:
                    break
                time.sleep(0.05)
            fake.notice.set()
            out, _ = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = out.decode(errors="replace")
    assert proc.returncode == exitcodes.PREEMPTED, log
    assert "preemption notice: aws spot terminate" in log
    assert store.complete_checkpoints(), log
    assert store.read_json("attempts/0001.json")["cluster_info"]["region"] == "test"


def test_validate_job_accepts_the_new_resources_fields() -> None:
    base = {"model": "x", "data": {"path": "s3://b/d"}, "checkpoint": {"uri": "s3://b/c"}}
    spec = validate_job({**base, "resources": {"backend": "skypilot", "secrets": ["HF_TOKEN"]}})
    assert spec.resources.recovery == "EAGER_NEXT_REGION"
    with pytest.raises(SpecError) as caught:
        validate_job({**base, "resources": {"recovery": "NOPE"}})
    assert caught.value.field == "resources.recovery"
    with pytest.raises(SpecError):
        validate_job({**base, "resources": {"secrets": ["not a name"]}})


def test_a_multi_gpu_plan_is_one_the_trainer_can_run() -> None:
    """The 8-GPU example renders the sharded template, and the trainer accepts several ranks (FSDP):
    no launch check stands between a multi-GPU plan and the cloud (the old one-GPU refusal is gone)."""
    from orchestrator.backends import skypilot_render

    spec = load_job(REPO / "examples/llama3-8b-full.yaml", check_support=False)
    _p, task = render_job(spec, "j", "s3://b/j", environ={})
    assert skypilot_render.template_of(task) != "single"
    probe = validate_job(
        {
            "model": "x",
            "data": {"path": "x"},
            "checkpoint": {"uri": "x"},
            "train": {"micro_batch_size": 64},
            "local": {"nproc": 2},
        },
        check_support=False,
    )
    from trainer.config import unsupported_features

    assert not [f for f, _ in unsupported_features(probe) if f == "local.nproc"]


def _aws_catalog_row(monkeypatch: pytest.MonkeyPatch, gpu_name: str) -> dict[str, Any]:
    """The row SkyPilot's own AWS catalog fetcher makes for g7e.48xlarge when EC2 reports its GPU as
    `gpu_name`: its real processing, with the five EC2/pricing calls (network) answered by one row each."""
    import pandas as pd
    from sky.catalog.data_fetchers import fetch_aws

    gpus = {
        "Gpus": [{"Name": gpu_name, "Manufacturer": "NVIDIA", "Count": 8, "MemoryInfo": {"SizeInMiB": 98304}}]
    }
    described = {
        "InstanceType": "g7e.48xlarge", "GpuInfo": gpus, "VCpuInfo": {"DefaultVCpus": 192},
        "MemoryInfo": {"SizeInMiB": 2097152}, "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
        "InstanceStorageSupported": False, "NetworkInfo": {"EfaSupported": False},
    }  # fmt: skip
    zone = {"InstanceType": "g7e.48xlarge", "AvailabilityZoneName": "us-east-1a"}
    zones = {"AvailabilityZoneName": "us-east-1a", "AvailabilityZone": "use1-az1"}
    price = {"InstanceType": "g7e.48xlarge", "Price": 33.1, "vCPU": 192.0, "Memory": "2048 GiB"}
    answers = {
        "_get_availability_zones": pd.DataFrame([zones]),
        "_get_instance_types": pd.DataFrame([described]),
        "_get_instance_type_offerings": pd.DataFrame([zone]),
        "_get_pricing_table": pd.DataFrame([price]),
        "_get_spot_pricing_table": pd.DataFrame([{**zone, "SpotPrice": 14.4}]).set_index(list(zone)),
    }
    for name, frame in answers.items():
        monkeypatch.setattr(fetch_aws, name, lambda _region, frame=frame: frame)
    table = fetch_aws._get_instance_types_df("us-east-1")
    assert not isinstance(table, str), f"SkyPilot's AWS fetcher failed for {table}"
    return dict(table.iloc[0])


def test_accelerator_names_are_skypilots_catalog_names(sky: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS g7e's GPU: the offer table says "RTX PRO Server 6000", SkyPilot's catalog `RTXPRO6000`
    (its own AWS catalog fetcher renames it); either name in the job file plans the same offers."""
    from orchestrator.sizing.sky_names import check_sky_name

    row = _aws_catalog_row(monkeypatch, "RTX PRO Server 6000")  # what EC2 calls it
    assert (row["AcceleratorName"], row["AcceleratorCount"]) == ("RTXPRO6000", 8)  # SkyPilot's own name
    path = REPO / "examples/mistral-7b-lora.yaml"
    tasks = []
    for name in ("RTX PRO Server 6000", "RTXPRO6000"):
        spec = load_job(path, [f"resources.accelerators=[{name}]", "resources.clouds=[aws]"])
        _p, task = render_job(spec, "j", "s3://b/j", environ={})
        tasks.append(task["resources"]["ordered"])
    assert tasks[0] == tasks[1] and tasks[0]
    assert {n for e in tasks[0] for n in e["accelerators"]} == {"RTXPRO6000"}
    sky_accepts(sky, {**task, "resources": {**task["resources"], "ordered": tasks[0]}})
    with pytest.raises(SpecError, match="resources.accelerators: 'Some GPU 9000' is not a SkyPilot"):
        check_sky_name("Some GPU 9000")

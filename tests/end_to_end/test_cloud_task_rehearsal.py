"""The SkyPilot task rehearsed on this machine: the rendered task's own `setup` and `run`, with SkyPilot's
environment variables, for the single-GPU, one-node and two-node templates.

What SkyPilot would do on its instances is done here:
- the task is rendered as `ftorch launch JOB --backend skypilot --dry-run` renders it (the run store and
  the data on the tests' S3 server, the model a Hub id whose files sit in a local Hub cache);
- the workdir (the source tree, as orchestrator/backends/ship.py ships it) is copied to a folder, and `setup`
  runs there once against a fresh "instance" environment, pip offline (`PIP_NO_INDEX`): it installs the
  run's lock (FTORCH_LOCK_FILE: this venv's versions, as the launch writes it into the store; the GPU
  lock's CUDA wheels cannot be fetched here) with --no-deps, peft and accelerate from a find-links
  folder of wheels made from the venv's own files, the other pins already on a path entry to the test
  venv, then checks every pin (trainer/envlock.py); gcsfs, which the instance would download, is not
  needed here;
- `run` runs under `bash -c` once per node, with SKYPILOT_NODE_IPS/RANK/NUM_NODES/NUM_GPUS_PER_NODE,
  SKYPILOT_TASK_ID (stable), SKYPILOT_CLUSTER_INFO, the task's envs and the store's
  credentials (its secrets). Two "nodes" are two processes on 127.0.0.1; torchrun's rendezvous goes
  through SKYPILOT_NODE_IPS' first line; on CPU torch uses gloo, one process per node.
- a preemption is SIGTERM to each node's whole process group (what a cancel or a Kubernetes eviction
  sends; a VM that disappears sends nothing, and SkyPilot recovers it for being down); SkyPilot recovers
  a node exit of 75 (`recover_on_exit_codes`); the relaunch here is the hardest case for the attempt
  number: the same machines (FAILOVER on a cluster still up), so the same node IPs and cluster info.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, assert_bitwise_equal, build_tiny_model, job_dict, process_gone, write_data
from s3runs import s3_final_weights
from s3server import SeaweedS3, s3_env

from trainer import exitcodes
from trainer.envlock import parse
from trainer.runstore.store import RunStore

#: a Hub id, so that the render accepts the model; its files are in the Hub cache made below
MODEL_ID = "ftorch-rehearsal/tiny-llama"
SOURCES = ("pyproject.toml", "README.md", "orchestrator", "trainer", "task_templates")
STEPS = 60


@dataclass
class Instance:
    """The rehearsal's "cloud": a bucket, the instance environment after `setup`, the synced workdir."""

    bucket: str
    endpoint: str
    venv: Path
    workdir: Path
    env: dict[str, str]
    data_uri: str
    home: Path
    setups: list[str] = field(default_factory=list)

    def job(self, health: dict[str, Any] | None = None, **resources: Any) -> dict[str, Any]:
        job = job_dict(
            MODEL_ID,
            Path(self.data_uri),
            Path("/unused"),
            data={"path": self.data_uri, "format": "instruction", "max_seq_len": 96},
            checkpoint={
                "uri": f"s3://{self.bucket}/runs",
                "every": 10,
                "keep": 2,
                "storage_options": {"endpoint_url": self.endpoint},
            },
            resources={"backend": "skypilot", "accelerators": ["H100"], **resources},
            train={
                "max_steps": STEPS,
                "log_every": 1,
                "warmup_steps": 2,
                **({"health": health} if health else {}),
            },
        )
        job.pop("local")
        return job

    def render(self, run_id: str, health: dict[str, Any] | None = None, **resources: Any) -> dict[str, Any]:
        """What `ftorch launch JOB --backend skypilot --dry-run` shows, and what the launch writes to the store."""
        from orchestrator.backends import skypilot
        from orchestrator.jobfile.spec import validate_job
        from orchestrator.jobs.lifecycle import _resolved_spec
        from trainer.runstore.storage import join_uri

        spec = validate_job(self.job(health, **resources))
        run_uri = join_uri(spec.checkpoint.uri, run_id)
        result = skypilot.dry_run(spec, run_id, run_uri)
        assert yaml.safe_load(result["task_yaml"]) == result["task"]  # the YAML shown is the task
        from orchestrator.jobfile import envlock as runenv

        store = RunStore(run_uri, spec.checkpoint.storage_options)
        runenv.write_lock(store, *runenv.lock_for_launch(spec, remote=True))
        store.write_spec(_resolved_spec(spec, run_id, join_uri(run_uri, "output")))
        task = result["task"]
        task["_template"] = result["template"]
        return task

    def node_env(
        self, task: dict[str, Any], rank: int, nodes: int, relaunch: int, port: int
    ) -> dict[str, str]:
        env = dict(self.env)
        env.update(task["envs"])
        env.update(
            SKYPILOT_NODE_IPS="\n".join(["127.0.0.1"] * nodes),
            SKYPILOT_NODE_RANK=str(rank),
            SKYPILOT_NUM_NODES=str(nodes),
            SKYPILOT_NUM_GPUS_PER_NODE="1",
            SKYPILOT_TASK_ID=f"sky-managed-2026-12-01-00-00-00-000000_{task['name']}_1-0",
            # a relaunch lands on a new cluster: where it is changes (the node IPs cannot, on one machine)
            SKYPILOT_CLUSTER_INFO=json.dumps(
                {"cluster": f"{task['name']}-1", "cloud": "gcp", "region": f"r{relaunch}", "zone": None}
            ),
            FTORCH_MASTER_PORT=str(port),  # the template's 29500 may be taken on a shared CI machine
            FTORCH_LOG_ALL_RANKS="1",  # every node's trainer says which attempt it runs
        )
        return env

    def start(self, task: dict[str, Any], nodes: int = 1, relaunch: int = 0) -> list[Node]:
        port = _free_port()
        return [
            Node.start(task["run"], self.workdir, self.node_env(task, rank, nodes, relaunch, port))
            for rank in range(nodes)
        ]


@dataclass
class Node:
    """One node's `bash -c "$run"`, in its own process group (as SkyPilot runs a task's script)."""

    proc: subprocess.Popen[str]
    lines: list[str]
    reader: threading.Thread

    @classmethod
    def start(cls, script: str, cwd: Path, env: dict[str, str]) -> Node:
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        lines: list[str] = []
        assert proc.stdout is not None
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
        reader.start()
        return cls(proc, lines, reader)

    def wait(self, timeout: float = 150) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError("node timed out:\n" + self.log()) from None
        self.reader.join(10)
        return code

    def log(self) -> str:
        return "".join(self.lines)[-4000:]

    def wait_for(self, needle: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(needle in line for line in list(self.lines)):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {needle!r} in the node's log:\n{self.log()}")

    def preempt(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hub_cache(model: Path, cache: Path) -> None:
    """The model's files as the Hub client caches a download (read with HF_HUB_OFFLINE=1)."""
    repo = cache / f"models--{MODEL_ID.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(model, repo / "snapshots" / commit)


#: installed by setup from the lock, as wheels in a local find-links folder (made from the test venv's
#: own files), so hidden from the instance's path entry; every other pin is already there
FROM_WHEELS = ("peft", "accelerate")


def _wheelhouse(tmp: Path) -> tuple[Path, set[str]]:
    """FROM_WHEELS packed back into wheels (orchestrator/backends/ship.py, as the installed ftorch is shipped),
    and the top-level names of the test venv's folder they own."""
    from importlib import metadata

    from orchestrator.backends.ship import INSTALL_ONLY, pack_wheel

    links, owned = tmp / "wheelhouse", set()
    for name in FROM_WHEELS:
        dist = metadata.distribution(name)
        files = {}
        for item in dist.files or []:
            rel = item.as_posix()
            parts = rel.split("/")
            owned.add(parts[0])
            if parts[0] == ".." or "__pycache__" in parts or rel.endswith(".pyc"):
                continue
            if parts[0].endswith(".dist-info") and parts[-1] in INSTALL_ONLY:
                continue
            files[rel] = Path(item.locate()).read_bytes()
        pack_wheel(dist.metadata["Name"], dist.version, files, links)
    return links, owned


def _instance_venv(tmp: Path, hidden: set[str]) -> Path:
    """A fresh environment: only pip's target; the dependencies from the test venv via a path entry (a
    folder of links to its site-packages, less `hidden`: those the setup installs from wheels)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = tmp / "test-dependencies"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name not in hidden:
            (deps / entry.name).symlink_to(entry)
    Path(purelib, "zz_test_dependencies.pth").write_text(f"{deps}\n")
    # torch's console script, as pip writes it when it installs torch on the instance
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(f"#!{python}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n")
    torchrun.chmod(0o755)
    return venv


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedS3) -> Iterator[Instance]:
    import fsspec

    tmp = tmp_path_factory.mktemp("rehearsal")
    bucket = "rehearsal"
    s3_server.make_bucket(bucket)
    model = build_tiny_model(tmp / "model")
    _hub_cache(model, tmp / "hf" / "hub")
    home = tmp / "home"
    data = write_data(tmp / "data.jsonl", "instruction", 120)
    fs = fsspec.filesystem("s3", endpoint_url=s3_server.endpoint, **_keys(s3_server.endpoint))
    data_uri = f"s3://{bucket}/data/train.jsonl"
    fs.put_file(str(data), data_uri)

    workdir = tmp / "sky_workdir"  # SkyPilot syncs the workdir here and runs setup and run in it
    workdir.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, workdir / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, workdir / name)
    links, owned = _wheelhouse(tmp)
    venv = _instance_venv(tmp, owned)
    from orchestrator.jobfile.envlock import LOCK_FILE_ENV, local_lock

    # the run's lock: this venv's versions (the instance here has no GPU and no index to reach)
    lock = tmp / "instance-lock.txt"
    lock.write_text(local_lock())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "FTORCH_FAULTS")}
    env.update(s3_env(s3_server.endpoint))  # the task's secrets: the store's credentials
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
        HF_HUB_CACHE=str(tmp / "hf" / "hub"),
        HF_HUB_OFFLINE="1",
        PYTHONNOUSERSITE="1",
        OMP_NUM_THREADS="1",
        FTORCH_HOME=str(home),
        FTORCH_NOTICES="0",  # no cloud metadata service here
        FTORCH_PROGRESS_EVERY_S="0.2",
        # setup's pip, offline: nothing is downloaded; the lock's pins are on the path or in the wheelhouse
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(links),
        FTORCH_LOCK=str(tmp / "instance-env" / "lock.txt"),  # where setup writes the lock (not /tmp/...)
        PIP_NO_DEPS="1",
        PIP_NO_BUILD_ISOLATION="0",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FTORCH_HOME", str(home))
        # the planner reads the model's shape from the same Hugging Face cache (huggingface_hub read
        # HF_HUB_CACHE when it was imported)
        mp.setattr(constants, "HF_HUB_CACHE", str(tmp / "hf" / "hub"))
        mp.setenv("HF_HUB_CACHE", str(tmp / "hf" / "hub"))
        mp.setenv(LOCK_FILE_ENV, str(lock))  # what `ftorch launch` renders and writes into the store
        for key, value in s3_env(s3_server.endpoint).items():
            mp.setenv(key, value)
        yield Instance(bucket, s3_server.endpoint, venv, workdir, env, data_uri, home)


def _keys(endpoint: str) -> dict[str, Any]:
    env = s3_env(endpoint)
    return {"key": env["AWS_ACCESS_KEY_ID"], "secret": env["AWS_SECRET_ACCESS_KEY"]}


def _setup(instance: Instance, task: dict[str, Any]) -> None:
    """The task's setup, as SkyPilot runs it before `run` on every (re)launch; installed once here (the
    three templates' setups are one script; a relaunch on new machines installs again, as here)."""
    if task["setup"] in instance.setups:
        return
    env = {**instance.env, **task["envs"], "FTORCH_LOCK": instance.env["FTORCH_LOCK"]}
    done = subprocess.run(
        ["bash", "-c", task["setup"]],
        cwd=instance.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "ftorch trainer ready" in done.stdout
    # the lock was installed as is, then checked: every pin at its version
    pins = parse(Path(env["FTORCH_LOCK"]).read_text())
    assert f"ftorch: environment matches the run's lock ({len(pins)} packages)" in done.stdout
    assert pins["peft"].version == metadata.version("peft") and "transformers" in pins
    for module in ("trainer", *FROM_WHEELS):  # installed into the instance's environment (from wheels)
        where = subprocess.run(
            [str(instance.venv / "bin" / "python"), "-c", f"import {module}; print({module}.__file__)"],
            cwd="/",
            env=env,
            capture_output=True,
            text=True,
        )
        assert where.stdout.startswith(str(instance.venv)), where
    instance.setups.append(task["setup"])


def _store(instance: Instance, task: dict[str, Any]) -> RunStore:
    return RunStore(task["envs"]["FTORCH_RUN_URI"], {"endpoint_url": instance.endpoint})


def _wait_committed(instance: Instance, task: dict[str, Any], step: int, timeout: float = 120) -> None:
    """Until the run store holds a committed checkpoint at `step` or later: a trainer frozen while its
    upload is still in flight (a loaded machine) leaves nothing to resume from, and the test would not
    show a resume."""
    store = _store(instance, task)
    deadline = time.monotonic() + timeout
    while True:
        newest = store.list_checkpoints().newest
        if newest is not None and newest.step >= step:
            return
        assert time.monotonic() < deadline, f"no checkpoint at step {step} or later committed"
        time.sleep(0.1)


def _attempts(store: RunStore) -> list[int]:
    return sorted(int(n.removesuffix(".json")) for n in store.listdir("attempts") if n.endswith(".json"))


def _claimed(node: Node) -> int:
    """The attempt number this node's run script claimed (the trainer logs it)."""
    for line in node.lines:
        if "attempt " in line and " of run " in line:
            return int(line.split("attempt ", 1)[1].split()[0])
    raise AssertionError(f"no attempt line:\n{node.log()}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("kind", "resources"), [("single", {"gpus": 1}), ("node", {"gpus": 2})])
def test_one_node_task_trains_to_completion(instance: Instance, kind: str, resources: dict[str, Any]) -> None:
    task = instance.render(f"{kind}-1", **resources)
    assert task["_template"] == kind
    _setup(instance, task)
    (node,) = instance.start(task)
    assert node.wait() == 0, node.log()
    store = _store(instance, task)
    progress = store.read_progress() or {}
    assert progress["state"] == "finished" and progress["step"] == STEPS, progress
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(store.listdir("output"))
    assert _attempts(store) == [1]
    (record,) = [store.read_json(f"attempts/{n}") for n in store.listdir("attempts") if n.endswith(".json")]
    assert record["versions"]["peft"] == metadata.version("peft")  # each attempt records its versions


def _probe_wheel(links: Path, version: str) -> None:
    """A tiny distribution `ftorch-probe` in the instance's find-links folder."""
    from orchestrator.backends.ship import pack_wheel

    info = f"ftorch_probe-{version}.dist-info"
    pack_wheel(
        "ftorch-probe",
        version,
        {
            "ftorch_probe/__init__.py": b"",
            f"{info}/METADATA": f"Metadata-Version: 2.1\nName: ftorch-probe\nVersion: {version}\n".encode(),
            f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        },
        links,
    )


@pytest.mark.timeout(300)
def test_a_setup_that_refuses_the_environment_ends_the_attempt_with_0_and_records_why(
    instance: Instance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 78 from the setup would be relaunched by SkyPilot's max_restarts_on_errors (a new machine, the
    same refusal): the setup records the refusal in the run store and the run step ends with 0, training
    nothing. The mismatch is made as a later install makes one: the lock pins ftorch-probe 1.0, and the
    task's extra pip (outside the lock) installs 2.0 over it."""
    from orchestrator.jobfile.envlock import LOCK_FILE_ENV
    from trainer.runstore.env_refusal import REFUSED

    links = Path(instance.env["PIP_FIND_LINKS"])
    for version in ("1.0", "2.0"):
        _probe_wheel(links, version)
    lock = tmp_path / "lock-with-probe.txt"
    lock.write_text(Path(os.environ[LOCK_FILE_ENV]).read_text() + "ftorch-probe==1.0\n")
    monkeypatch.setenv(LOCK_FILE_ENV, str(lock))
    task = instance.render("refused")
    assert "ftorch-probe==1.0" in task["setup"]
    own_lock = tmp_path / "env" / "lock.txt"  # this test's own: the marker beside it must not reach others
    task["envs"].update(FTORCH_LOCK=str(own_lock), FTORCH_EXTRA_PIP="ftorch-probe==2.0")
    done = subprocess.run(
        ["bash", "-c", task["setup"]],
        cwd=instance.workdir,
        env={**instance.env, **task["envs"]},
        capture_output=True,
        text=True,
        timeout=180,
    )
    line = "ftorch: environment: ftorch-probe: the run's lock pins 1.0, 2.0 is installed; refusing to start"
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert line in done.stderr and "ftorch trainer ready" not in done.stdout
    store = _store(instance, task)
    assert store.read_json(REFUSED)["line"].startswith(line)
    (node,) = instance.start(task)
    assert node.wait(60) == 0, node.log()
    assert line in node.log() and not store.exists("attempts")  # no attempt claimed, nothing trained
    assert (store.read_progress() or {}).get("step") is None


@pytest.mark.timeout(600)
def test_two_nodes_train_are_preempted_agree_on_the_attempt_and_resume_exactly(instance: Instance) -> None:
    # an uninterrupted two-node run: the reference adapter
    ref_task = instance.render("two-ref", nodes=2, gpus=1)
    assert ref_task["_template"] == "multinode" and ref_task["num_nodes"] == 2
    _setup(instance, ref_task)
    nodes = instance.start(ref_task, nodes=2)
    codes = [n.wait() for n in nodes]
    assert codes == [0, 0], "\n".join(n.log() for n in nodes)
    reference = s3_final_weights(_store(instance, ref_task))

    # the same job preempted: SIGTERM to both nodes' process groups once training runs
    task = instance.render("two-cut", nodes=2, gpus=1)
    store = _store(instance, task)
    nodes = instance.start(task, nodes=2, relaunch=0)
    nodes[0].wait_for(f"step 3/{STEPS}")
    for node in nodes:
        node.preempt()
    codes = [n.wait() for n in nodes]
    logs = "\n---\n".join(n.log() for n in nodes)
    assert codes == [exitcodes.PREEMPTED] * 2, logs  # what job_recovery.recover_on_exit_codes relaunches
    assert exitcodes.PREEMPTED in task["resources"]["job_recovery"]["recover_on_exit_codes"]
    progress = store.read_progress() or {}
    assert progress["state"] == "preempted" and progress["attempt"] == 1, progress
    cut = progress["step"]
    assert 3 <= cut < STEPS and progress["last_checkpoint_step"] == cut, progress  # saved on the notice
    assert [_claimed(n) for n in nodes] == [1, 1] and _attempts(store) == [1]

    # SkyPilot's relaunch (exit 75 on a cluster still up, FAILOVER): the same run script on the same
    # machines, the same node IPs and cluster info, so the same attempt key; still a new attempt number
    nodes = instance.start(task, nodes=2, relaunch=0)
    codes = [n.wait() for n in nodes]
    logs = "\n---\n".join(n.log() for n in nodes)
    assert codes == [0, 0], logs
    assert [_claimed(n) for n in nodes] == [2, 2] and _attempts(store) == [1, 2]
    for node in nodes:  # both ranks load the preempted attempt's checkpoint
        assert f"resumed from checkpoints/step-{cut:08d} (step {cut}/{STEPS})" in "".join(node.lines), logs
    progress = store.read_progress() or {}
    assert progress["state"] == "finished" and progress["step"] == STEPS and progress["attempt"] == 2
    assert_bitwise_equal(s3_final_weights(store), reference)


@pytest.mark.timeout(400)
def test_the_run_script_kills_a_frozen_trainer_and_runs_it_again_to_the_end(instance: Instance) -> None:
    """SIGSTOP (a hung collective or a dead mount looks so): the trainer's own watchdog cannot run; the run
    script's heartbeat watch kills it once its heartbeat is older than the published stall timeout, and the
    replacement (a new attempt number) resumes from the newest checkpoint and finishes; exit 0."""
    task = instance.render("single-stall", health={"stall_timeout_s": 4}, gpus=1)
    assert task["_template"] == "single" and "trainer.stops.heartbeat_watch" in task["run"]
    _setup(instance, task)
    (node,) = instance.start(task)
    node.wait_for(f"step 14/{STEPS}", timeout=200)
    _wait_committed(instance, task, 10)  # the freeze must leave a checkpoint to resume from
    pid = next(int(line.split("watching pid ")[1]) for line in node.lines if "watching pid " in line)
    os.kill(pid, signal.SIGSTOP)  # never continued
    frozen_at = time.monotonic()
    assert node.wait(300) == 0, node.log()
    log = "".join(node.lines)
    assert "stalled: no heartbeat" in log and "restarting after the stall" in log, node.log()
    store = _store(instance, task)
    assert _attempts(store) == [1, 2], node.log()
    assert "resumed from checkpoints/step-" in log.split("restarting after the stall", 1)[1], node.log()
    progress = store.read_progress() or {}
    assert progress["state"] == "finished" and progress["step"] == STEPS and progress["attempt"] == 2
    assert time.monotonic() - frozen_at < 300


def _rank0_trainer(root: int) -> int:
    """The rank-0 trainer below `root` (torchrun starts it in a session of its own): RANK=0 in its
    environment, `-m trainer` in its command line."""
    from trainer.stops.heartbeat_watch import _tree

    for pid in _tree(root):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"RANK=0" in environ and b"trainer" in cmdline and b"-m" in cmdline:
            return pid
    raise AssertionError(f"no rank-0 trainer below {root}")


@pytest.mark.timeout(600)
def test_the_node_run_script_kills_a_frozen_torchrun_trainer_and_resumes_it_exactly(
    instance: Instance,
) -> None:
    """The one-node multi-GPU template (torchrun --standalone) under the same heartbeat watch: the frozen
    rank-0 trainer and the whole torchrun tree are killed (each rank runs in a session of its own), the
    command runs again under a new attempt number, resumes from the newest checkpoint, and ends with the
    weights of an uninterrupted run, bit for bit."""
    health = {"stall_timeout_s": 4}
    ref_task = instance.render("node-stall-ref", health=health, gpus=2)
    assert ref_task["_template"] == "node" and "trainer.stops.heartbeat_watch" in ref_task["run"]
    _setup(instance, ref_task)
    (node,) = instance.start(ref_task)
    assert node.wait(300) == 0, node.log()
    reference = s3_final_weights(_store(instance, ref_task))

    task = instance.render("node-stall", health=health, gpus=2)
    (node,) = instance.start(task)
    node.wait_for(f"step 14/{STEPS}", timeout=200)
    _wait_committed(instance, task, 10)  # the freeze must leave a checkpoint to resume from
    watched = next(int(line.split("watching pid ")[1]) for line in node.lines if "watching pid " in line)
    trainer = _rank0_trainer(watched)
    assert trainer != watched  # below torchrun, not the watched shell
    os.kill(trainer, signal.SIGSTOP)  # never continued
    frozen_at = time.monotonic()
    assert node.wait(300) == 0, node.log()
    assert process_gone(trainer), "the frozen rank was left behind"
    log = "".join(node.lines)
    assert "stalled: no heartbeat" in log and "restarting after the stall" in log, node.log()
    store = _store(instance, task)
    assert _attempts(store) == [1, 2], node.log()
    assert "resumed from checkpoints/step-" in log.split("restarting after the stall", 1)[1], node.log()
    progress = store.read_progress() or {}
    assert progress["state"] == "finished" and progress["step"] == STEPS and progress["attempt"] == 2
    assert time.monotonic() - frozen_at < 300
    records = store.epoch_records()
    stalled = [r for r in records.values() if r.get("attempt") == 1]
    assert stalled and stalled[-1]["ended"] == "stalled", records  # the watch recorded its kill
    assert_bitwise_equal(s3_final_weights(store), reference)


def _end_node(node: Node) -> None:
    """What SkyPilot does to the other nodes when one node's run exits non-zero (it fails the job fast):
    their run scripts end, with every process below them."""
    from trainer.stops.heartbeat_watch import _tree

    for pid in _tree(node.proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    node.wait(30)


@pytest.mark.timeout(600)
def test_two_nodes_a_frozen_trainer_ends_the_node_with_75_and_the_relaunch_resumes(
    instance: Instance,
) -> None:
    """Several nodes: the other node's torchrun could not meet a restarted one again, so node 0's watch
    kills its frozen trainer's tree, records the stall and exits 75; SkyPilot ends the other node and
    relaunches both (a new attempt number), which resume from the newest checkpoint and finish."""
    task = instance.render("two-stall", health={"stall_timeout_s": 4}, nodes=2, gpus=1)
    assert task["_template"] == "multinode" and "--stall-exit 75" in task["run"]
    _setup(instance, task)
    store = _store(instance, task)
    nodes = instance.start(task, nodes=2)
    nodes[0].wait_for(f"step 14/{STEPS}", timeout=200)
    _wait_committed(instance, task, 10)  # the freeze must leave a checkpoint to resume from
    watched = next(int(line.split("watching pid ")[1]) for line in nodes[0].lines if "watching pid " in line)
    trainer = _rank0_trainer(watched)
    os.kill(trainer, signal.SIGSTOP)  # never continued
    assert nodes[0].wait(120) == exitcodes.PREEMPTED, nodes[0].log()  # recover_on_exit_codes
    assert process_gone(trainer), "the frozen rank was left behind"
    assert "stalled: no heartbeat" in nodes[0].log() and "restarting after the stall" not in nodes[0].log()
    _end_node(nodes[1])
    (record,) = [r for r in store.epoch_records().values() if r.get("attempt") == 1]
    assert record["ended"] == "stalled" and isinstance(record["stall_checkpoint_step"], int), record

    nodes = instance.start(task, nodes=2, relaunch=1)  # SkyPilot's recovery: both nodes together
    codes = [n.wait(300) for n in nodes]
    logs = "\n---\n".join(n.log() for n in nodes)
    assert codes == [0, 0], logs
    assert [_claimed(n) for n in nodes] == [2, 2] and _attempts(store) == [1, 2], logs
    for node in nodes:
        assert "resumed from checkpoints/step-" in "".join(node.lines), logs
    progress = store.read_progress() or {}
    assert progress["state"] == "finished" and progress["step"] == STEPS and progress["attempt"] == 2

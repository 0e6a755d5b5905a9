"""A run store is data, never code (issue 30, S1 S2 R1 R2, point 1): the real CLI attaches and resumes a
tampered copy of a real run store. Nothing the store says runs here, no id read from it leaves
$FTORCH_HOME, the adopted run's output goes to the store it was attached from (or where `resume --set
output.uri` says), no storage option, local path, image or secret list is taken from it, and a running job's
settings do not change when its store's spec.json does."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from helpers import ftorch
from support.adopted import Runs, copy_store, make_runs, same_adapter, wait_ended

from orchestrator.registry import Registry


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Runs:
    return make_runs(tmp_path_factory.mktemp("adopt-runs"), tiny_model)


def restate(runs: Runs) -> list[str]:
    """The --set items that give an adopted run's local paths again (not taken from a store others can
    write)."""
    job = json.loads((runs.crashed / "spec.json").read_text())["job"]
    return ["--set", f"model={job['model']}", "--set", f"data.path={job['data']['path']}"]


def test_a_notify_command_in_a_store_never_runs_here(runs: Runs, tmp_path: Path, ftorch_home: Path) -> None:
    """S1: spec.json's notify.command (and webhook) are not taken; attach says so and how to set them."""
    planted = tmp_path / "planted-by-the-bucket"
    notify = {
        "command": f"touch {planted}",
        "webhook": "http://127.0.0.1:9/hook",
        "on": ["succeeded", "failed"],
    }
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id, job_notify=notify)
    attached = ftorch("attach", str(store))
    assert attached.returncode == 0, attached.stderr
    said = attached.stdout
    assert "not taken from the store: notify.command" in said and "--set notify.command=" in said, said
    assert "not taken from the store: notify.webhook" in said, said
    assert (Registry().get(runs.run_id).spec.get("notify") or {}).get("command") is None
    resumed = ftorch("resume", runs.run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert wait_ended(runs.run_id)["state"] == "SUCCEEDED"
    time.sleep(2)  # the supervisor notifies after it records SUCCEEDED
    assert not planted.exists(), "a command read from the run store ran on this machine"
    assert (json.loads((store / "spec.json").read_text())["job"].get("notify") or {}).get("command") is None


def test_a_run_id_that_climbs_out_of_the_home_is_refused(
    runs: Runs, tmp_path: Path, ftorch_home: Path
) -> None:
    """S2: spec.json's run_id is validated like a job id, by attach and by `resume RUN_URI`."""
    for bad in ("../../../../escaped", "/abs/olute", "a/../../b", "x" * 300):
        store = copy_store(runs.crashed, tmp_path / "bucket" / f"s{len(bad)}", run_id=bad)
        for command in (("attach", str(store)), ("resume", str(store))):
            refused = ftorch(*command)
            assert refused.returncode == 2, (bad, refused.stdout, refused.stderr)
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1 and "run_id" in lines[0] and "not a job id" in lines[0], refused.stderr
            assert len(lines[0]) < 400, lines[0]  # F11: a long value is quoted short
    assert Registry().jobs() == []
    assert not list(tmp_path.rglob("escaped")) and not list(tmp_path.rglob("supervisor.log"))
    assert sorted(p.name for p in ftorch_home.iterdir()) <= [
        "registry.db",
        "registry.db-shm",
        "registry.db-wal",
    ]


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_an_adopted_store_writes_its_output_in_itself(
    runs: Runs, tmp_path: Path, ftorch_home: Path, how: str
) -> None:
    """R1: a moved or copied store's spec.json names the original's output_uri; the output goes to the
    attached store, bit for bit the clean run's, and the original is left as it was."""
    original = copy_store(runs.crashed, tmp_path / "original" / runs.run_id)
    adopted = copy_store(original, tmp_path / "elsewhere" / runs.run_id, output_uri=str(original / "output"))
    before = {p.relative_to(original): p.read_bytes() for p in original.rglob("*") if p.is_file()}
    if how == "moved":
        shutil.rmtree(original)
    attached = ftorch("attach", str(adopted))
    assert attached.returncode == 0, attached.stderr
    assert ftorch("resume", runs.run_id).returncode == 0
    detail = wait_ended(runs.run_id)
    assert detail["state"] == "SUCCEEDED", detail
    assert detail["output_uri"] == str(adopted / "output"), detail
    assert not [e for e in Registry().events(runs.run_id) if e["kind"] == "spec"], (
        "an untouched spec.json rewritten"
    )
    assert same_adapter(adopted / "output", runs.clean / "output")
    if how == "copied":
        after = {p.relative_to(original): p.read_bytes() for p in original.rglob("*") if p.is_file()}
        assert after == before, "the copy wrote into the original run's store"
    else:
        assert not original.exists(), "the moved store's old place was written to"


def test_resume_set_output_uri_is_honoured(runs: Runs, tmp_path: Path, ftorch_home: Path) -> None:
    """R2: `resume --set output.uri=...` sends the output there (the math is unchanged: no refusal); a
    notify.command given here runs (the way attach points to)."""
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id)
    mine = tmp_path / "my-own-command-ran"
    assert ftorch("attach", str(store)).returncode == 0
    elsewhere = tmp_path / "final"
    resumed = ftorch(
        "resume", runs.run_id, "--set", f"output.uri={elsewhere}",
        "--set", f"notify={{command: 'touch {mine}', on: [succeeded]}}",
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    detail = wait_ended(runs.run_id)
    assert detail["state"] == "SUCCEEDED" and detail["output_uri"] == str(elsewhere), detail
    assert same_adapter(elsewhere, runs.clean / "output")
    assert not (store / "output").exists()
    assert json.loads((store / "spec.json").read_text())["output_uri"] == str(elsewhere)
    deadline = time.time() + 30
    while not mine.exists() and time.time() < deadline:
        time.sleep(0.2)
    assert mine.exists(), "notify.command set on this machine did not run"


def _spec_of(store: Path) -> dict:
    return json.loads((store / "spec.json").read_text())


def test_storage_options_in_a_store_are_not_taken(runs: Runs, tmp_path: Path, ftorch_home: Path) -> None:
    """Point 1: spec.json's checkpoint.storage_options (an endpoint_url would send the checkpoints and the
    output, with this machine's credentials, to a server the bucket's writer picks) are not taken; attach
    names each and how to give it here; the resumed run uses none of them."""
    checkpoint = {**_spec_of(runs.crashed)["job"]["checkpoint"]}
    checkpoint["storage_options"] = {"endpoint_url": "http://127.0.0.1:9/evil", "use_ssl": False}
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id, job_checkpoint=checkpoint)
    attached = ftorch("attach", str(store))
    assert attached.returncode == 0, attached.stderr
    said = attached.stdout
    for key in ("endpoint_url", "use_ssl"):
        assert f"not taken from the store: checkpoint.storage_options.{key} " in said, said
        assert f"--storage-option {key}=" in said and f"--set checkpoint.storage_options.{key}=" in said, said
    assert "http://127.0.0.1:9/evil" not in json.dumps(Registry().get(runs.run_id).spec)
    assert ftorch("resume", runs.run_id).returncode == 0
    assert wait_ended(runs.run_id)["state"] == "SUCCEEDED"
    assert same_adapter(store / "output", runs.clean / "output")
    assert _spec_of(store)["job"]["checkpoint"]["storage_options"] == {}


def test_a_local_path_in_a_store_is_not_taken_until_given_here(
    runs: Runs, tmp_path: Path, ftorch_home: Path
) -> None:
    """Point 1: spec.json's local paths (model, data.path, data.eval_path, a chat template file, chaos
    traces) would have this machine read its own files into a run whose records the bucket's writer
    reads; from a store others can write, attach does not take them, and resume refuses (exit 2, one line
    naming the field, nothing written) until --set gives each again. `resume RUN_URI` refuses before
    registering anything."""
    secret = tmp_path / "home" / "private.jsonl"
    secret.parent.mkdir()
    secret.write_text(json.dumps({"instruction": "my password", "output": "hunter2"}) + "\n")
    data = {**_spec_of(runs.crashed)["job"]["data"], "path": str(secret)}
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id, job_data=data)
    (store / "spec.json").chmod(0o666)  # a folder others can write: a shared mount, a synced bucket
    bare = copy_store(store, tmp_path / "other" / runs.run_id)
    refused = ftorch("resume", str(bare))  # `resume RUN_URI` of a store with local paths: nothing registered
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()] and "model:" in refused.stderr
    assert Registry().jobs() == []
    attached = ftorch("attach", str(store))
    assert attached.returncode == 0, attached.stderr
    for field in ("model", "data.path"):
        line = next(
            x for x in attached.stdout.splitlines() if x.startswith(f"not taken from the store: {field} ")
        )
        assert f"--set {field}=" in line, line
    assert str(secret) not in json.dumps(Registry().get(runs.run_id).spec)
    before = (store / "spec.json").read_bytes()
    model_only = restate(runs)[:2]
    refused = ftorch("resume", runs.run_id, *model_only)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].removeprefix("error: ").startswith(
        "data.path: not taken from the run"
    ), lines
    assert "--set data.path=" in lines[0]
    assert Registry().get(runs.run_id).state == "FAILED" and len(Registry().attempts(runs.run_id)) == 1
    assert (store / "spec.json").read_bytes() == before
    assert ftorch("resume", runs.run_id, *restate(runs)).returncode == 0
    assert wait_ended(runs.run_id)["state"] == "SUCCEEDED"
    assert same_adapter(store / "output", runs.clean / "output")
    assert str(secret) not in (store / "spec.json").read_text()


def test_a_cloud_image_and_secret_list_in_a_store_are_not_taken(tmp_path: Path, ftorch_home: Path) -> None:
    """Point 1, SkyPilot: resources.image_id (an image the bucket's writer chose) and resources.secrets
    (this machine's variables sent to it) are dropped at attach, one line each. Tested on the pure
    function: attaching a SkyPilot run asks its API server (test_attach.py fakes it in-process)."""
    from orchestrator.jobs import adopt

    spec = {
        "model": "org/model", "data": {"path": "org/data"},
        "checkpoint": {"uri": "s3://b/runs", "storage_options": {}},
        "resources": {"backend": "skypilot", "image_id": "docker:evil/x@sha256:" + "0" * 64,
                      "secrets": ["GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"]},
    }  # fmt: skip
    taken, left = adopt.local_settings(spec, "s3://b/runs/r1")
    assert taken["resources"]["image_id"] is None and taken["resources"]["secrets"] is None
    assert taken["model"] == "org/model" and taken["data"]["path"] == "org/data"  # hub ids are no paths
    assert [x.split(" (")[0] for x in left] == [
        f"not taken from the store: resources.image_id 'docker:evil/x@sha256:{'0' * 64}'",
        'not taken from the store: resources.secrets \'["GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"]\'',
    ]
    assert all("--set resources." in x for x in left)


def test_a_running_jobs_settings_do_not_change_when_its_store_does(
    runs: Runs, tmp_path: Path, ftorch_home: Path
) -> None:
    """Point 2: the trainer reads spec.json at every attempt; the supervisor writes the launched one back
    before each. Attempt 2 crashes at step 13 (after a tamper of train.lr, notify.command and output_uri
    while it runs); attempt 3 runs the registry's settings: the weights are the untampered run's."""
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id)
    planted = tmp_path / "planted-by-the-bucket"
    elsewhere = tmp_path / "elsewhere"
    assert ftorch("attach", str(store)).returncode == 0
    faults = {"FTORCH_FAULTS": "crash@13:2,slow-step@1000:2"}
    assert ftorch("resume", runs.run_id, env=faults).returncode == 0
    deadline = time.time() + 120
    while not (store / "fence" / "epoch-00000002.json").exists():  # attempt 2 has read spec.json
        assert time.time() < deadline, "attempt 2 did not start"
        time.sleep(0.05)
    tampered = _spec_of(store)
    tampered["job"]["train"]["lr"] = 0.5
    tampered["job"]["notify"] = {"command": f"touch {planted}", "on": ["succeeded", "failed", "budget"]}
    tampered["output_uri"] = str(elsewhere)
    (store / "spec.json").write_text(json.dumps(tampered))
    detail = wait_ended(runs.run_id)
    assert detail["state"] == "SUCCEEDED", detail
    assert detail["attempts"] >= 3, detail
    assert same_adapter(store / "output", runs.clean / "output")
    assert not elsewhere.exists() and not planted.exists()
    final = _spec_of(store)
    assert final["job"]["train"]["lr"] == _spec_of(runs.crashed)["job"]["train"]["lr"]
    assert final["output_uri"] == str(store / "output") and not final["job"].get("notify")
    events = [e["detail"] for e in Registry().events(runs.run_id) if e["kind"] == "spec"]
    assert len(events) == 1 and "job.train" in events[0] and "output_uri" in events[0], events


def test_the_trainer_refuses_a_spec_changed_after_its_supervisor_pinned_it(
    runs: Runs, tmp_path: Path
) -> None:
    """The race left by pinning: spec.json rewritten in the store between the supervisor's write and the
    trainer's read. The supervisor hands the trainer the digest of what it wrote (FTORCH_SPEC_DIGEST); the
    trainer trains with that spec.json only, else exits 2 with one line before it claims the run."""
    from helpers import run_trainer

    from trainer.runstore.store import SPEC_DIGEST_ENV, spec_digest

    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id)
    pinned = _spec_of(store)
    epochs = sorted((store / "fence").iterdir())
    tampered = json.loads(json.dumps(pinned))
    tampered["job"]["train"]["lr"] = 0.5
    (store / "spec.json").write_text(json.dumps(tampered, indent=1))
    refused = run_trainer(str(store), 2, env={SPEC_DIGEST_ENV: spec_digest(pinned)})
    assert refused.returncode == 2, refused.stderr[-2000:]
    errors = [x for x in refused.stdout.splitlines() + refused.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1 and "spec.json in the run store changed after" in errors[0], errors
    assert "Traceback" not in refused.stderr
    assert sorted((store / "fence").iterdir()) == epochs  # nothing claimed, nothing trained
    # the same content in another key order and spacing is the pinned spec.json: it trains to the end
    (store / "spec.json").write_text(json.dumps(pinned, indent=3, sort_keys=True))
    done = run_trainer(str(store), 2, env={SPEC_DIGEST_ENV: spec_digest(pinned)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert same_adapter(store / "output", runs.clean / "output")


def test_attach_set_gives_the_paths_here_and_a_bad_one_registers_nothing(
    runs: Runs, tmp_path: Path, ftorch_home: Path
) -> None:
    """Point 1: `attach --set` gives what the store's spec.json does not (no line for it then); a --set
    that does not validate is refused in one line naming the field, nothing registered."""
    store = copy_store(runs.crashed, tmp_path / "bucket" / runs.run_id)
    (store / "spec.json").chmod(0o664)  # a group can write it: not this user's own
    bad = ftorch("attach", str(store), *restate(runs), "--set", "train.lr=-1")
    assert bad.returncode == 2, (bad.stdout, bad.stderr)
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].removeprefix("error: ").startswith("train.lr:"), lines
    assert Registry().jobs() == []
    attached = ftorch("attach", str(store), *restate(runs)[:2])
    assert attached.returncode == 0, attached.stderr
    said = attached.stdout
    assert "not taken from the store: model " not in said and "not taken from the store: data.path " in said
    spec = Registry().get(runs.run_id).spec
    assert spec["model"] == _spec_of(runs.crashed)["job"]["model"]


def test_only_a_folder_only_this_user_can_write_is_its_own(tmp_path: Path) -> None:
    """own_store: a local run folder and spec.json owned by this user, no links, no group/other write."""
    from orchestrator.jobs.adopt import own_store

    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "spec.json").write_text("{}")
    (run / "spec.json").chmod(0o600)
    assert own_store(str(run)) and own_store(f"file://{run}")
    assert not own_store("s3://bucket/run") and not own_store(str(tmp_path / "missing"))
    (run / "spec.json").chmod(0o620)
    assert not own_store(str(run))
    (run / "spec.json").chmod(0o600)
    run.chmod(0o777)
    assert not own_store(str(run))
    run.chmod(0o700)
    linked = tmp_path / "linked"
    linked.symlink_to(run)
    assert not own_store(str(linked))

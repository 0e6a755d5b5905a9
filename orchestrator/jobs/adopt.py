"""`ftorch attach RUN_URI`: register a run found in its store (the store is the truth; the registry at
$FTORCH_HOME is a cache of it), on a new machine or after the registry was lost.

What the store holds decides the job's state: an output with a finished progress is SUCCEEDED; a stop
request (control/stop.json) is CANCELLED or STOPPED (budget); anything else has no one running it from
here and is FAILED, resumable (`ftorch resume` continues from the newest checkpoint; a trainer still
running elsewhere is fenced by the new attempt). The attempts come from the trainer's epoch records
(fence/epoch-N.json). The job's backend may know more (`Backend.adopt`: a SkyPilot managed job by name).
No torch, no sky at import.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from orchestrator.backends.base import backend_for
from orchestrator.errors import SpecError, UserError, quoted
from orchestrator.registry import JobState, Outcome, Registry
from orchestrator.run_records import attempts_from_store, store_log_lines  # noqa: F401 - store_log_lines: the backends

ADOPTED = "adopted"


def normalize(run_uri: str) -> str:
    import os

    run_uri = run_uri.rstrip("/")
    if run_uri.startswith("file://"):
        run_uri = run_uri[len("file://") :]
    return run_uri if "://" in run_uri else os.path.abspath(os.path.expanduser(run_uri))


def read_run(run_uri: str, storage_options: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(store, spec.json, the validated job spec as JSON); a one-line UserError if it is no ftorch run."""
    from orchestrator.jobfile.spec import validate_job
    from trainer.runstore.store import RunStore

    not_a_run = f"RUN_URI: {run_uri} is not a ftorch run store"
    try:
        store = RunStore(run_uri, storage_options, retry_seconds=5)
        resolved = store.read_json_or_none("spec.json")
    except Exception as exc:  # noqa: BLE001 - unreachable or unreadable: one line
        raise UserError(f"RUN_URI: cannot read {run_uri}: {exc.__class__.__name__}: {exc}") from None
    if resolved is None:
        raise UserError(f"{not_a_run} (no spec.json)")
    if not (isinstance(resolved, dict) and isinstance(resolved.get("job"), dict)
            and isinstance(resolved.get("run_id"), str) and resolved["run_id"]):  # fmt: skip
        raise UserError(f"{not_a_run} (spec.json has no job and run_id)")
    try:
        spec = validate_job(resolved["job"]).model_dump(mode="json")
    except (SpecError, UserError) as exc:
        raise UserError(f"{not_a_run} (its spec.json does not validate: {exc})") from None
    return store, resolved, spec


def derive_state(store: Any, resolved: dict[str, Any]) -> tuple[JobState, str]:
    """The job's state and reason from what the store holds."""
    from trainer.stops.interruptions import STOP_REQUEST

    progress = store.read_progress() or {}
    # the output in this store (spec.json's output_uri may name another store: never trusted, R1)
    if progress.get("state") == "finished" and _has_output(store, ""):
        return JobState.SUCCEEDED, "finished (adopted from its run store)"
    stop = store.read_json_or_none(STOP_REQUEST)
    reason = stop.get("reason") if isinstance(stop, dict) else None
    step = _newest_step(store)
    where = f"step {step}" if step else "step 0 (no checkpoint)"
    if reason == "cancel":
        return (
            JobState.CANCELLED,
            f"cancelled (adopted from its run store); `ftorch resume` continues from {where}",
        )
    if reason == "budget":
        return JobState.STOPPED, f"budget stop (adopted from its run store); resume continues from {where}"
    note = ""
    updated = progress.get("updated_at")
    if (
        progress.get("state") == "running"
        and isinstance(updated, int | float)
        and time.time() - updated < 300
    ):
        note = f"; its progress moved {time.time() - updated:.0f} s ago: it may still run elsewhere (a resume here fences it)"
    return (
        JobState.FAILED,
        f"adopted from its run store; nothing runs it from here: `ftorch resume` continues from {where}{note}",
    )


def _has_output(store: Any, output_uri: str) -> bool:
    from trainer.runstore.store import RunStore

    try:
        out = RunStore(output_uri, store.storage_options) if output_uri else store
        names = set(out.listdir("" if output_uri else "output"))
    except Exception:  # noqa: BLE001
        return False
    return bool(names & {"adapter_config.json", "config.json"})


def _newest_step(store: Any) -> int:
    try:
        found = store.complete_checkpoints()
    except Exception:  # noqa: BLE001
        return 0
    return found[-1].step if found else 0


#: what a job id is (orchestrator/jobs/lifecycle.py new_job_id makes them): a run store's run_id must be one, since it
#: names folders under $FTORCH_HOME
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_run_id(run_id: str) -> str:
    """spec.json's run_id, validated like user input (it names folders on this machine)."""
    if not JOB_ID.match(run_id) or ".." in run_id:
        raise UserError(
            f"RUN_URI: spec.json's run_id {quoted(run_id)} is not a job id (letters, digits, '.', '_', '-',"
            " at most 100, no '..'); the run store is not attached"
        )
    return run_id


#: what a setting this machine did not take from a run store holds until its user gives it (`--set`): no
#: path, no hub id, so nothing reads it; `ftorch resume` refuses it (refuse_not_taken)
NOT_TAKEN = "<not taken from the run store>"
#: the settings that name a file or folder on the machine that reads them (a path chosen by whoever wrote
#: the bucket would have this machine read its own files into the run, whose records the writer reads)
PATH_FIELDS = ("model", "data.path", "data.eval_path", "data.chat_template", "local.chaos.trace")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


def own_store(run_uri: str) -> bool:
    """Whether the run store is a folder on this machine that only this user can write (the run folder
    and its spec.json owned by this user, not links, not writable by group or others: as the trainer
    writes them). Its spec.json is then this user's own file, as trusted as a job file; a bucket, or a
    folder others can write, is not."""
    import os
    import stat

    if "://" in run_uri and not run_uri.startswith("file://"):
        return False
    folder = run_uri.removeprefix("file://")
    try:
        infos = [os.lstat(folder), os.lstat(os.path.join(folder, "spec.json"))]
    except OSError:
        return False
    return all(
        not stat.S_ISLNK(i.st_mode) and i.st_uid == os.getuid() and not i.st_mode & 0o022 for i in infos
    )


def local_settings(
    spec: dict[str, Any], run_uri: str, own: bool | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The job spec as this machine takes it from a store, and a line per setting it did not take.

    A store is data: whatever runs or is contacted from this machine (notify.command, notify.webhook),
    how it reaches storage (checkpoint.storage_options) and the image and secrets of a cloud job come
    only from this machine's user (`--set`); so do the files it reads (PATH_FIELDS), unless the store is
    this user's own folder (`own`, default own_store). The run's records and output stay in the store it
    was attached from (checkpoint.uri its parent, output.uri unset)."""
    from trainer.runstore.storage import join_uri
    from trainer.runstore.store import OUTPUT

    spec = json.loads(json.dumps(spec))
    left: list[str] = []
    notify = spec.get("notify") or {}
    for key in ("command", "webhook"):
        if notify.get(key):
            notify[key] = None
            left.append(
                f"not taken from the store: notify.{key} (set it here: `ftorch resume JOB --set notify.{key}=...`)"
            )
    if notify and not (notify.get("command") or notify.get("webhook")):
        spec["notify"] = None
    output = spec.get("output") or {}
    if output.get("uri"):
        left.append(
            f"not taken from the store: output.uri {quoted(str(output['uri']))} (the output goes to "
            f"{join_uri(run_uri, OUTPUT)}; `ftorch resume JOB --set output.uri=...` sends it elsewhere)"
        )
        output["uri"] = None
    checkpoint = spec.setdefault("checkpoint", {})
    for key in sorted(checkpoint.get("storage_options") or {}):
        left.append(
            f"not taken from the store: checkpoint.storage_options.{key} (this machine reaches the store with"
            f" its own options: `ftorch attach RUN_URI --storage-option {key}=...`, the environment, or"
            f" `ftorch resume JOB --set checkpoint.storage_options.{key}=...`)"
        )
    checkpoint["storage_options"] = {}
    checkpoint["uri"] = run_uri.rsplit("/", 1)[0] if "/" in run_uri else run_uri
    if not (own_store(run_uri) if own is None else own):
        left += _drop_local_paths(spec)
    left += _drop_cloud_image(spec)
    return spec, left


def is_local_path(field: str, value: str) -> bool:
    """Whether `value` of `field` names a file or folder on the machine that reads it (not a URL, a Hub id
    or an inline chat template)."""
    if field == "data.chat_template":
        return "{{" not in value and "{%" not in value
    if field == "local.chaos.trace" or value.startswith("file://"):
        return True
    if "://" in value:
        return False
    import os

    local = value.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(value))
    return local or value.lower().endswith(DATA_SUFFIXES) or not HUB_ID.match(value)


def _drop_local_paths(spec: dict[str, Any]) -> list[str]:
    """PATH_FIELDS that name a path on this machine, set to NOT_TAKEN: a line each."""
    left = []
    for field in PATH_FIELDS:
        *parents, key = field.split(".")
        node: Any = spec
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        value = node.get(key) if isinstance(node, dict) else None
        values = value if isinstance(value, list) else [value]
        if not any(isinstance(v, str) and is_local_path(field, v) for v in values):
            continue
        assert isinstance(node, dict)
        node[key] = [NOT_TAKEN] if isinstance(value, list) else NOT_TAKEN
        left.append(
            f"not taken from the store: {field} {quoted(str(value))} (a path on this machine: give it here,"
            f" `ftorch resume JOB --set {field}=...` or `ftorch attach RUN_URI --set {field}=...`; resume"
            " refuses the job until then)"
        )
    return left


def _drop_cloud_image(spec: dict[str, Any]) -> list[str]:
    """resources.image_id and resources.secrets (a cloud job's image, and the variables of this machine
    sent to it) unset: a line each."""
    resources = spec.get("resources") or {}
    left = []
    for key in ("image_id", "secrets"):
        if resources.get(key) is not None:
            left.append(
                f"not taken from the store: resources.{key} {quoted(_shown(resources[key]))} (set it"
                f" here: `ftorch resume JOB --set resources.{key}=...`; unset, the job runs on ftorch's"
                " image with its default secrets)"
            )
            resources[key] = None
    return left


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def not_taken(spec: dict[str, Any]) -> list[str]:
    """The PATH_FIELDS of `spec` still holding NOT_TAKEN."""
    found = []
    for field in PATH_FIELDS:
        node: Any = spec
        for part in field.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node == NOT_TAKEN or (isinstance(node, list) and NOT_TAKEN in node):
            found.append(field)
    return found


def refuse_not_taken(spec: dict[str, Any], overrides: list[str], job: str) -> None:
    """A one-line UserError naming the first setting not taken from the store that `overrides` (applied to
    a copy of `spec`) leave unset; nothing is written before it."""
    from orchestrator.jobfile.spec import apply_overrides

    missing = not_taken(apply_overrides(json.loads(json.dumps(spec)), overrides))
    if missing:
        field = missing[0]
        raise UserError(
            f"{field}: not taken from the run store when {job} was attached (a path on this machine); give"
            f" it: `ftorch resume {job} --set {field}=...`"
        )


def _restated(spec: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`spec` with attach's --set items applied and validated (a one-line UserError naming the field)."""
    if not overrides:
        return spec
    from orchestrator.errors import SpecErrors
    from orchestrator.jobfile.spec import apply_overrides, validate_job

    try:
        spec = apply_overrides(spec, overrides)
        validate_job(spec, check_support=False)
    except SpecError as exc:
        raise UserError(str(exc.errors[0] if isinstance(exc, SpecErrors) else exc)) from None
    return spec


def check_resume(job_ref: str, overrides: list[str]) -> None:
    """`ftorch resume JOB`: refused, nothing written, while a setting not taken from the run store at
    attach is not given again (refuse_not_taken); a job not found is left to resume to report."""
    try:
        job = Registry().lookup(job_ref)
    except Exception:  # noqa: BLE001 - unknown or ambiguous: resume says so
        return
    refuse_not_taken(job.spec, overrides, job.job_id)


def attach(
    run_uri: str,
    name: str | None = None,
    storage_options: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
) -> str:
    """Register the run in `run_uri`; the message for the user. Nothing is written when it is no run (or
    an item of `overrides`, `--set` as at resume, does not validate), and the registration is one
    transaction: a kill leaves the job registered in full or not at all."""
    from trainer.runstore.storage import join_uri
    from trainer.runstore.store import OUTPUT

    run_uri = normalize(run_uri)
    options = dict(storage_options or {})
    store, resolved, spec = read_run(run_uri, options)
    job_id = check_run_id(resolved["run_id"])
    registry = Registry()
    known = registry.find(job_id)
    if known and known[0].job_id == job_id:
        if known[0].run_uri.rstrip("/") == run_uri:
            return f"{job_id} is already registered (state {known[0].state}); nothing to do"
        raise UserError(
            f"RUN_URI: a job {job_id} is already registered with another run store ({known[0].run_uri})"
        )
    spec, left = local_settings(spec, run_uri)
    spec["checkpoint"]["storage_options"] = options  # those that reached the store here, none of its own
    left = [line for line in left if not _given(line, options, overrides or [])]
    spec = _restated(spec, list(overrides or []))
    state, reason = derive_state(store, resolved)
    backend = spec.get("resources", {}).get("backend", "local")
    created = resolved.get("created_at")
    job = registry.adopt_job(
        {
            "job_id": job_id, "name": name or spec.get("name") or job_id, "backend": backend,
            "run_uri": run_uri, "output_uri": join_uri(run_uri, OUTPUT), "spec": spec,
            "hourly_usd": _number(spec.get("local", {}).get("hourly_usd")),
            "created_at": created if isinstance(created, int | float) and created > 0 else None,
        },
        state, reason, _attempt_rows(store, state), [(ADOPTED, run_uri)],
    )  # fmt: skip
    note = backend_for(backend).adopt(registry, job)
    job = registry.get(job_id)
    lines = [f"{job_id} attached from {run_uri}: {job.state}", *left]
    return "\n".join(lines + ([note] if note else []))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _attempt_rows(store: Any, state: JobState) -> list[dict[str, Any]]:
    """The attempts table's rows for the store's attempt records."""
    rows = []
    for entry in attempts_from_store(store):
        fields: dict[str, Any] = {"started_at": entry["started_at"], "end_step": entry.get("end_step")}
        if entry.get("ended_at") is None and state.terminal:
            entry["ended_at"] = time.time()
            entry.setdefault("end_reason", "ended without a record (killed or crashed)")
            if state is JobState.SUCCEEDED:
                entry.update(outcome=Outcome.SUCCEEDED, end_reason="succeeded")
        for key in ("ended_at", "end_reason", "outcome"):
            if entry.get(key) is not None:
                fields[key] = str(entry[key]) if key == "outcome" else entry[key]
        rows.append({k: v for k, v in fields.items() if v is not None})
    return rows


def parse_options(items: list[str]) -> dict[str, Any]:
    """`--storage-option KEY=VALUE` items (YAML-typed values); a one-line UserError on a bad one."""
    import yaml

    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(
                f"--storage-option: {item!r} is not KEY=VALUE (e.g. endpoint_url=http://host:9000)"
            )
        options[key.strip()] = yaml.safe_load(value) if value else ""
    return options


def looks_like_run_uri(ref: str) -> bool:
    """A URL or a folder holding a spec.json (a job id is neither)."""
    import os

    return "://" in ref or os.path.isfile(os.path.join(os.path.expanduser(ref), "spec.json"))


def _given(line: str, options: dict[str, Any], overrides: list[str]) -> bool:
    """Whether a 'not taken' line's setting was given on this machine (an option, or a --set of it)."""
    field = line.removeprefix("not taken from the store: ").split(" ", 1)[0]
    if field.startswith("checkpoint.storage_options.") and field.rsplit(".", 1)[1] in options:
        return True
    return any(item.partition("=")[0].strip() == field for item in overrides)


def attach_for_resume(run_uri: str, overrides: list[str] | None = None) -> tuple[str, str]:
    """(what attach said, the job id) for `resume RUN_URI`: refused (nothing registered) when a setting
    not taken from the store is not given again in `overrides`."""
    run_uri = normalize(run_uri)
    _store, resolved, spec = read_run(run_uri, {})
    job_id = check_run_id(resolved["run_id"])
    known = Registry().find(job_id)
    if not (known and known[0].job_id == job_id):
        refuse_not_taken(local_settings(spec, run_uri)[0], list(overrides or []), job_id)
    return attach(run_uri), job_id

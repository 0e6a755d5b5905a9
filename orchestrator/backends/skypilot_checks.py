"""What must hold before a SkyPilot launch is recorded: the secrets set, and at least one planned offer on
a cloud SkyPilot can use."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from orchestrator.backends import skypilot_render as render
from orchestrator.backends import skypilot_sdk as sdk
from orchestrator.errors import SpecError, UserError
from orchestrator.jobfile.models import check_hub_model
from trainer.config import JobSpec


def check_secrets(spec: JobSpec, environ: Mapping[str, str] | None = None) -> list[str]:
    environ = os.environ if environ is None else environ
    names = render.secret_names(spec, environ)
    missing = [n for n in names if not environ.get(n)]
    if missing:
        raise UserError(
            f"resources.secrets: {', '.join(missing)} not set in your environment; export "
            f"{'it' if len(missing) == 1 else 'them'} before launching (values are never stored)"
        )
    return names


def _cloud_of(entry: Mapping[str, Any]) -> str:
    return str(entry["infra"]).split("/")[0].lower()


def restrict_to_clouds(task: dict[str, Any], clouds: list[str]) -> dict[str, Any]:
    """Keep the offers on clouds SkyPilot can use; a one-line UserError when none is left."""
    entries = task["resources"]["ordered"]
    usable = [e for e in entries if _cloud_of(e) in clouds]
    if not usable:
        wanted = ", ".join(dict.fromkeys(_cloud_of(e) for e in entries))
        raise UserError(
            f"resources.clouds: SkyPilot has no access to {wanted} (enabled: {', '.join(clouds) or 'none'}); "
            "set up credentials and run `sky check` (see docs/clouds.md)"
        )
    task = dict(task)
    task["resources"] = {**task["resources"], "ordered": usable}
    return task


def preflight(spec: JobSpec, run_uri: str, task: dict[str, Any]) -> dict[str, Any]:
    """Before anything is recorded: secrets set, cloud access (jobs.launch has probed the store).
    Returns the usable task."""
    for warning in (check_data_readable(spec), check_hub_model(spec.model)):
        if warning:
            sys.stderr.write(f"warning: {warning}\n")
    return usable_task(spec, task)


def check_data_readable(spec: JobSpec, timeout_s: float = 10.0) -> str | None:
    """The data (and a separate held-out set) must be readable from here with the job's storage options
    (the VM gets the same credentials): a missing or forbidden file is refused before a VM is paid for.
    When the store cannot be reached from here, a warning line (the VM may reach it). Hub ids pass."""
    from fsspec.core import url_to_fs

    from orchestrator.jobfile.data_check import quick_fail
    from trainer.data.source import looks_like_hub_id

    options = dict(spec.checkpoint.storage_options)
    sources = [("data.path", spec.data.path)]
    if spec.data.eval_path is not None:
        sources.append(("data.eval_path", spec.data.eval_path))
    for field, path in sources:
        if looks_like_hub_id(path):
            continue
        try:
            fs, where = url_to_fs(path, **quick_fail(path, options, timeout_s))
            if fs.isdir(where):
                fs.ls(where)
            else:
                with fs.open(where, "rb") as handle:
                    handle.read(1)
        except Exception as exc:  # noqa: BLE001 - judged below
            text = " ".join(str(exc).split()) or exc.__class__.__name__
            if not isinstance(exc, (FileNotFoundError, PermissionError)):
                return f"could not check {field} {path} from here ({exc.__class__.__name__}: {text})"
            raise SpecError(
                field,
                f"cannot read {path} from here ({exc.__class__.__name__}: {text}); a cloud VM with the same "
                "credentials would fail after it is paid for",
            ) from None
    return None


def usable_task(spec: JobSpec, task: dict[str, Any]) -> dict[str, Any]:
    """The checks a launch and a resume share: secrets, cloud access."""
    check_secrets(spec)
    return restrict_to_clouds(task, sdk.enabled_clouds())

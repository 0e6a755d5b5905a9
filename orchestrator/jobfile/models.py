"""Models where users keep them: a Hub id's config.json through huggingface_hub (its standard cache under
HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN or the saved login, HF_ENDPOINT), and the launch
preflight that a model can be had where the job will run.

- `cached_config(repo)`: the config.json in the Hugging Face cache, or None (no network).
- `download_config(repo)`: fetch it into that cache (what `--online` sizing does).
- `check_hub_model(model, environ)`: for a cloud VM (which downloads the model itself, with the token it
  is given): a gated, private or missing model is refused before a VM is paid for; a Hub that cannot
  be asked gives a warning.
- `check_local_model(model)`: for the local backend (this machine loads it): cached, or reachable now.

huggingface_hub is imported inside the functions: the CLI stays fast.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError, UserError

TIMEOUT_S = 5.0
TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
OFFLINE_VALUES = ("1", "on", "yes", "true")


def looks_like_hub_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "/", "~")) and "://" not in model


def hub_offline(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get("HF_HUB_OFFLINE", "").strip().lower() in OFFLINE_VALUES


def cached_config(repo_id: str) -> Path | None:
    """config.json of `repo_id` in the Hugging Face cache (the revision `refs/main` points at), or None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found: Any = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id
        return None
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def download_config(repo_id: str, timeout_s: float = TIMEOUT_S) -> Path:
    """Fetch only config.json into the Hugging Face cache; SpecError naming what to do when it cannot."""
    from huggingface_hub import hf_hub_download

    if hub_offline():
        raise SpecError(
            "model",
            f"{repo_id} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; unset it or "
            f"download it first (`hf download {repo_id} config.json`)",
        )
    try:
        return Path(hf_hub_download(repo_id, "config.json", etag_timeout=timeout_s))
    except Exception as exc:  # noqa: BLE001 - every failure of the Hub client becomes one line
        raise SpecError("model", _hub_problem(repo_id, exc, token=_token(os.environ))) from None


def _token(env: Mapping[str, str]) -> str | None:
    return next((env[n] for n in TOKENS if env.get(n)), None)


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _judge(model: str, exc: BaseException, token: str | None) -> tuple[bool, str]:
    """(no retry fixes it, one line): gated, private, missing; or why the Hub could not be asked."""
    kinds = {cls.__name__ for cls in type(exc).__mro__}
    status = _status(exc)
    anonymous = (
        f"{model} is gated, private or missing on the Hugging Face Hub (HTTP {status}) and HF_TOKEN is "
        "not set; export HF_TOKEN (a token with access) or fix the name"
    )
    if "GatedRepoError" in kinds or (status in (401, 403) and "RepositoryNotFoundError" not in kinds):
        if token:
            return True, (
                f"{model} refuses your Hugging Face token (HTTP {status}); accept the model's license on "
                "huggingface.co with that account, or use a token that has access"
            )
        return True, anonymous
    if "RepositoryNotFoundError" in kinds:
        return True, f"{model} was not found on the Hugging Face Hub (HTTP {status})" if token else anonymous
    if "EntryNotFoundError" in kinds or status == 404:
        return True, f"{model} was not found on the Hugging Face Hub (HTTP 404), or has no config.json"
    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
    return False, reason


def _hub_problem(model: str, exc: BaseException, token: str | None) -> str:
    final, line = _judge(model, exc, token)
    return line if final else f"could not reach the Hugging Face Hub for {model} ({line})"


def _ask_hub(
    model: str, env: Mapping[str, str], timeout_s: float, saved_login: bool = False
) -> BaseException | None:
    """HEAD config.json with this environment's endpoint and token (and the saved `hf auth login` if
    `saved_login`); the error, or None when it is there."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    endpoint = env.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")
    url = hf_hub_url(model, "config.json", endpoint=endpoint)
    token: str | bool | None = _token(env) or (None if saved_login else False)
    try:  # token=False: judge with the token the VM is given, not a saved login it will not have
        get_hf_file_metadata(url, token=token, timeout=timeout_s, endpoint=endpoint)
    except Exception as exc:  # noqa: BLE001 - judged by the caller
        return exc
    return None


def check_hub_model(
    model: str, environ: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S
) -> str | None:
    """For a job that downloads the model on a cloud VM with the token it gets (HF_TOKEN): None when
    the model is reachable with it; a warning line when the Hub could not be asked; a one-line UserError
    when the VM could not download it."""
    env = os.environ if environ is None else environ
    if not looks_like_hub_id(model) or os.path.exists(os.path.expanduser(model)):
        return None
    if hub_offline(env):
        return f"HF_HUB_OFFLINE is set: could not check model {model} on the Hub; launching anyway"
    error = _ask_hub(model, env, timeout_s)
    if error is None:
        return None
    final, line = _judge(model, error, _token(env))
    if final:
        raise UserError(f"model: {line}")
    return f"could not check model {model} on the Hub ({line}); launching anyway"


def check_local_model(model: str, timeout_s: float = TIMEOUT_S) -> str:
    """For a job this machine runs: where its model comes from ('folder', 'cache', 'hub'); SpecError
    when the trainer could not have it (not cached and offline, unreachable, gated, missing)."""
    if os.path.isdir(os.path.expanduser(model)):
        return "folder"
    if not looks_like_hub_id(model):
        raise SpecError(
            "model",
            f"{model!r} is neither a folder with config.json nor a Hugging Face Hub id (org/name); "
            "the local backend loads the model from one of them",
        )
    if cached_config(model) is not None:
        return "cache"
    if hub_offline():
        raise SpecError(
            "model",
            f"{model} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; download it "
            f"first (`hf download {model}`) or unset HF_HUB_OFFLINE",
        )
    error = _ask_hub(model, os.environ, timeout_s, saved_login=True)
    if error is None:
        return "hub"
    raise SpecError("model", _hub_problem(model, error, _token(os.environ)))

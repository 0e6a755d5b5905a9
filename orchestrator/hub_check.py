"""Launch preflight for a Hugging Face Hub model: a gated, private or missing model is caught before a
cloud VM is paid for (the trainer would fail on it after boot, once per retry).

One HEAD request for the model's config.json, with the token the VM would get (HF_TOKEN or
HUGGING_FACE_HUB_TOKEN from this environment) and a short timeout. The Hub answers 401/403 for gated,
private and (to anonymous callers) missing repos alike, 404 for missing ones. When the Hub cannot be
reached (offline, timeout) the model is not judged: the launch goes on with a warning.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Mapping

from orchestrator.errors import UserError

TIMEOUT_S = 5.0
TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def looks_like_hub_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "/", "~")) and "://" not in model


def check_hub_model(
    model: str, environ: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S
) -> str | None:
    """None when the model is reachable with this environment's token; a warning line when the Hub
    could not be asked; a one-line UserError when the VM could not download it."""
    env = os.environ if environ is None else environ
    if not looks_like_hub_id(model) or os.path.exists(os.path.expanduser(model)):
        return None
    endpoint = env.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    request = urllib.request.Request(f"{endpoint}/{model}/resolve/main/config.json", method="HEAD")
    token = next((env[n] for n in TOKENS if env.get(n)), None)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):  # noqa: S310 (the Hub's https endpoint)
            return None
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            if token:
                raise UserError(
                    f"model: {model} refuses your Hugging Face token (HTTP {exc.code}); accept the model's "
                    "license on huggingface.co with that account, or use a token that has access"
                ) from None
            raise UserError(
                f"model: {model} is gated, private or missing on the Hugging Face Hub (HTTP {exc.code}) "
                "and HF_TOKEN is not set; export HF_TOKEN (a token with access) or fix the name"
            ) from None
        if exc.code == 404:
            raise UserError(f"model: {model} was not found on the Hugging Face Hub (HTTP 404)") from None
        return f"could not check model {model} on the Hub (HTTP {exc.code}); launching anyway"
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"could not check model {model} on the Hub ({reason}); launching anyway"

"""Upload an export folder to the Hugging Face Hub: the repo is created when missing (private unless
asked otherwise), then the folder goes up as one commit. huggingface_hub does the talking, so HF_TOKEN,
HF_ENDPOINT (a mirror or an enterprise Hub) and its retries apply as they do for every other HF tool.
No torch here."""

from __future__ import annotations

from typing import Any

from trainer.config import check_repo_id


class PushError(Exception):
    """A one-line reason the push failed (the CLI exits 2 for a bad repo id, 1 otherwise)."""


def push_folder(folder: str, repo_id: str, private: bool, message: str) -> dict[str, Any]:
    """Create `repo_id` if needed and upload `folder` to it; the repo's URL and the commit."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    check_repo_id(repo_id)
    api = HfApi()
    try:
        repo = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id, repo_type="model", folder_path=folder, commit_message=message
        )
    except HfHubHTTPError as exc:
        status = getattr(exc.response, "status_code", None)
        hint = " (is HF_TOKEN set, with write access to that namespace?)" if status in (401, 403) else ""
        raise PushError(f"--push-to-hub: the Hub refused {repo_id}: HTTP {status}{hint}") from None
    except ValueError as exc:  # the Hub's check of the card's metadata (api/validate-yaml)
        raise PushError(
            f"--push-to-hub: the Hub refused the model card: {' '.join(str(exc).split())}"
        ) from None
    except OSError as exc:  # connection refused, DNS, timeouts
        raise PushError(f"--push-to-hub: cannot reach the Hub: {exc.__class__.__name__}: {exc}") from None
    return {"repo_id": repo_id, "url": str(repo), "commit": getattr(commit, "oid", None)}

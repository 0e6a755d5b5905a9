"""SkyPilot launch preflight: a gated or missing Hub model without a token, and data that is not
readable, are refused before a VM is paid for; a Hub that does not answer does not hang the launch."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import REPO

from orchestrator.backends.skypilot_checks import check_data_readable
from orchestrator.errors import SpecError, UserError
from orchestrator.jobfile.models import check_hub_model
from orchestrator.jobfile.spec import load_job


class FakeHub(BaseHTTPRequestHandler):
    """The Hub's answers for config.json: gated needs a token with access, missing is 401 anonymously."""

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        token = self.headers.get("Authorization")
        if self.path.startswith("/open/"):
            code = 200
        elif self.path.startswith("/gated/"):
            code = 200 if token == "Bearer good" else (403 if token else 401)
        else:
            code = 404 if token else 401
        self.send_response(code)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The stand-in Hub on 127.0.0.1; huggingface_hub's offline switch (the suite sets HF_HUB_OFFLINE so
    that nothing reaches the real Hub) is turned off for requests to it."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_gated_or_missing_models_are_refused_before_a_vm(hub: str) -> None:
    assert check_hub_model("open/model", {"HF_ENDPOINT": hub}) is None
    with pytest.raises(
        UserError, match=r"model: gated/llama is gated, private or missing .* HF_TOKEN is not set"
    ):
        check_hub_model("gated/llama", {"HF_ENDPOINT": hub})
    assert check_hub_model("gated/llama", {"HF_ENDPOINT": hub, "HF_TOKEN": "good"}) is None
    with pytest.raises(UserError, match="refuses your Hugging Face token .* accept the model's license"):
        check_hub_model("gated/llama", {"HF_ENDPOINT": hub, "HUGGING_FACE_HUB_TOKEN": "other"})
    with pytest.raises(UserError, match="was not found on the Hugging Face Hub"):
        check_hub_model("nobody/nothing", {"HF_ENDPOINT": hub, "HF_TOKEN": "good"})


def test_a_hub_that_does_not_answer_does_not_hang_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts, never answers
    try:
        started = time.monotonic()
        warning = check_hub_model(
            "gated/llama", {"HF_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}"}, 1.0
        )
        assert time.monotonic() - started < 5
        assert warning and warning.startswith("could not check model gated/llama on the Hub")
    finally:
        silent.close()


def test_unreadable_data_is_refused_before_a_vm(s3) -> None:  # noqa: ANN001 - the conftest bucket
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3.endpoint})
    fs.pipe(f"{s3.name}/data/train.jsonl", b'{"instruction": "a", "output": "b"}\n')
    overrides = [
        f"checkpoint.uri={s3.uri}/ftorch",
        f"checkpoint.storage_options={{endpoint_url: '{s3.endpoint}'}}",
    ]
    spec = load_job(
        REPO / "examples/mistral-7b-lora.yaml", [*overrides, f"data.path={s3.uri}/data/train.jsonl"]
    )
    assert check_data_readable(spec) is None
    spec = load_job(
        REPO / "examples/mistral-7b-lora.yaml", [*overrides, f"data.path={s3.uri}/data/missing.jsonl"]
    )
    with pytest.raises(SpecError, match=r"data.path: cannot read s3://.*/data/missing.jsonl from here"):
        check_data_readable(spec)

"""Local HTTP servers that stand in for outside services: a webhook receiver and the clouds' instance
metadata services (AWS IMDSv2, GCE, Azure scheduled events), all on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


class Hook:
    """A webhook receiver: records each POST; answers with `status`."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.status = 200
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                try:  # strictly, as a receiver in another language would: no NaN or Infinity
                    parsed = json.loads(body, parse_constant=_not_json)
                except ValueError as exc:
                    hook.received.append({"path": self.path, "error": str(exc), "raw": body})
                    self.send_response(400)
                    self.end_headers()
                    return
                hook.received.append(
                    {"path": self.path, "type": self.headers["Content-Type"], "body": parsed}
                )
                self.send_response(hook.status)
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


TOKEN = "tok-123"


class FakeMetadata:
    """One fake metadata service: `provider` is aws, gcp or azure; `notice` flips the answer."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.notice = threading.Event()
        #: what the instance says it is: "spot" or "on-demand" (AWS instance-life-cycle, GCP preemptible,
        #: Azure priority), as trainer/stops/lifecycle.py reads it
        self.market = "spot"
        self.requests: list[tuple[str, str]] = []
        #: the first `slow_answers` requests are answered only after `slow_s` seconds (a busy VM)
        self.slow_answers = 0
        self.slow_s = 0.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _record(self, method: str) -> None:
                outer.requests.append((method, self.path))
                if outer.slow_answers > 0:
                    outer.slow_answers -= 1
                    time.sleep(outer.slow_s)

            def do_PUT(self) -> None:  # noqa: N802
                self._record("PUT")
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                if outer.provider == "aws" and self.path == "/latest/api/token" and ttl:
                    self._send(200, TOKEN.encode())
                else:
                    self._send(404)

            def do_GET(self) -> None:  # noqa: N802
                self._record("GET")
                p = outer.provider
                if p == "aws" and self.path == "/latest/meta-data/spot/instance-action":
                    if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                        self._send(401)
                    elif outer.notice.is_set():
                        body = {"action": "terminate", "time": "2026-01-01T00:02:00Z"}
                        self._send(200, json.dumps(body).encode())
                    else:
                        self._send(404)
                elif p == "aws" and self.path == "/latest/meta-data/instance-life-cycle":
                    ok = self.headers.get("X-aws-ec2-metadata-token") == TOKEN
                    self._send(200, outer.market.encode()) if ok else self._send(401)
                elif p == "gcp" and self.path == "/computeMetadata/v1/instance/scheduling/preemptible":
                    body = b"TRUE" if outer.market == "spot" else b"FALSE"
                    self._send(200, body, {"Metadata-Flavor": "Google"})
                elif p == "gcp" and self.path == "/computeMetadata/v1/instance/preempted":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        self._send(403)
                    else:
                        body = b"TRUE" if outer.notice.is_set() else b"FALSE"
                        self._send(200, body, {"Metadata-Flavor": "Google"})
                elif p == "azure" and self.path.startswith("/metadata/instance/compute/priority"):
                    self._send(200, b"Spot" if outer.market == "spot" else b"Regular")
                elif p == "azure" and self.path.startswith("/metadata/scheduledevents"):
                    events = [{"EventType": "Preempt", "NotBefore": "soon"}] if outer.notice.is_set() else []
                    self._send(200, json.dumps({"DocumentIncarnation": 1, "Events": events}).encode())
                else:
                    self._send(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeMetadata:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"

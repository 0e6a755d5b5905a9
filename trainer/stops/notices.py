"""Cloud preemption notices: a background thread that polls the instance metadata service.

A spot VM is warned before it is taken away: AWS 2 minutes ahead (`spot/instance-action`, IMDSv2),
GCP about 30 s ahead (`instance/preempted`), Azure at least 30 s ahead (scheduled events, `Preempt`).
SkyPilot 0.14.1 does not watch these on VMs, so the trainer does: on a notice it sets the same
PreemptionFlag a SIGTERM sets, the loop checkpoints at the next step boundary and exits 75.

Off a cloud, the probes are refused or time out (nothing answers at the link-local metadata address)
and the thread ends: a few seconds of one idle thread at most. A probe that timed out is retried with a
longer timeout, so a busy VM that answers late is still watched. No torch, no third-party imports here.

Environment (for tests and unusual setups):
    FTORCH_NOTICES=0                     disable the watcher
    FTORCH_NOTICE_POLL_S=2               seconds between polls once a provider is found
    FTORCH_NOTICE_PROBE_TIMEOUT_S=0.5    timeout of the first detection probe (then 2x, 4x)
    FTORCH_AWS_METADATA_URL / FTORCH_GCP_METADATA_URL / FTORCH_AZURE_METADATA_URL
                                         base URLs (default http://169.254.169.254)
    FTORCH_NOTICE_PROVIDERS=aws,gcp,azure  which providers to probe, in order
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

METADATA_URL = "http://169.254.169.254"
PROVIDERS = ("aws", "gcp", "azure")
PROBE_ROUNDS = 3  # timeouts of 1x, 2x, 4x FTORCH_NOTICE_PROBE_TIMEOUT_S


class Flag(Protocol):
    def set(self, reason: str) -> None: ...

    def is_set(self) -> bool: ...


class NotOnThisCloud(Exception):
    """The provider's metadata service does not answer here."""


def _request(
    url: str, headers: dict[str, str], timeout: float, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body); HTTP errors are returned, connection failures raise OSError."""
    # never through a proxy: the metadata service is link-local
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, headers=headers, method=method, data=b"" if method == "PUT" else None)
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers or {}), b""


def _base(provider: str) -> str:
    return os.environ.get(f"FTORCH_{provider.upper()}_METADATA_URL", METADATA_URL).rstrip("/")


@dataclass
class AwsNotices:
    """EC2 spot interruption notice through IMDSv2 (a session token, then `spot/instance-action`)."""

    base: str
    timeout: float
    token: str | None = None
    token_at: float = 0.0
    name: str = "aws"

    def _token(self) -> str:
        if self.token is None or time.time() - self.token_at > 3000:
            status, _h, body = _request(
                f"{self.base}/latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": "3600"},
                self.timeout,
                method="PUT",
            )
            if status != 200 or not body:
                raise NotOnThisCloud(f"IMDSv2 token: HTTP {status}")
            self.token, self.token_at = body.decode().strip(), time.time()
        return self.token

    def probe(self) -> None:
        self._token()

    def poll(self) -> str | None:
        token = self._token()
        status, _h, body = _request(
            f"{self.base}/latest/meta-data/spot/instance-action",
            {"X-aws-ec2-metadata-token": token},
            self.timeout,
        )
        if status == 401:  # the token expired early: get a new one next time
            self.token = None
            return None
        if status != 200:
            return None  # 404: no interruption scheduled
        try:
            notice = json.loads(body)
        except ValueError:
            notice = {}
        action = notice.get("action", "terminate") if isinstance(notice, dict) else "terminate"
        when = notice.get("time", "soon") if isinstance(notice, dict) else "soon"
        return f"aws spot {action} at {when}"


@dataclass
class GcpNotices:
    """GCE preemption: `instance/preempted` turns TRUE about 30 s before the VM stops."""

    base: str
    timeout: float
    name: str = "gcp"

    def _get(self) -> tuple[int, dict[str, str], bytes]:
        return _request(
            f"{self.base}/computeMetadata/v1/instance/preempted",
            {"Metadata-Flavor": "Google"},
            self.timeout,
        )

    def probe(self) -> None:
        status, headers, _b = self._get()
        flavor = {k.lower(): v for k, v in headers.items()}.get("metadata-flavor")
        if status != 200 or flavor != "Google":
            raise NotOnThisCloud(f"GCE metadata: HTTP {status}")

    def poll(self) -> str | None:
        status, _h, body = self._get()
        if status == 200 and body.strip().upper() == b"TRUE":
            return "gcp instance preempted"
        return None


@dataclass
class AzureNotices:
    """Azure scheduled events: a `Preempt` event is posted at least 30 s before a spot VM is evicted."""

    base: str
    timeout: float
    name: str = "azure"

    def _get(self) -> tuple[int, bytes]:
        status, _h, body = _request(
            f"{self.base}/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"}, self.timeout
        )
        return status, body

    def probe(self) -> None:
        status, body = self._get()
        if status != 200:
            raise NotOnThisCloud(f"Azure scheduled events: HTTP {status}")
        try:
            payload = json.loads(body)
        except ValueError:
            raise NotOnThisCloud("Azure scheduled events: not JSON") from None
        if not isinstance(payload, dict) or "Events" not in payload:
            raise NotOnThisCloud("Azure scheduled events: unexpected answer")

    def poll(self) -> str | None:
        status, body = self._get()
        if status != 200:
            return None
        try:
            events = json.loads(body).get("Events") or []
        except (ValueError, AttributeError):
            return None
        for event in events:
            if isinstance(event, dict) and event.get("EventType") == "Preempt":
                return f"azure spot eviction at {event.get('NotBefore') or 'soon'}"
        return None


def _make(provider: str, timeout: float) -> AwsNotices | GcpNotices | AzureNotices:
    kinds = {"aws": AwsNotices, "gcp": GcpNotices, "azure": AzureNotices}
    return kinds[provider](_base(provider), timeout)


Watcher = AwsNotices | GcpNotices | AzureNotices


def _timed_out(exc: BaseException) -> bool:
    """A probe that got no answer in time (as opposed to a refusal or a wrong answer)."""
    if isinstance(exc, urllib.error.URLError):
        return isinstance(exc.reason, TimeoutError)
    return isinstance(exc, TimeoutError)


def detect(
    providers: tuple[str, ...] | None = None, timeout: float | None = None, rounds: int = PROBE_ROUNDS
) -> Watcher | None:
    """The first provider whose metadata service answers like the real one, or None (not on a cloud).

    A probe refused or answered wrongly rules its provider out at once. A probe that timed out is tried
    again with twice the timeout, `rounds` times in all: a VM busy loading a model can answer late, and
    a watcher that gave up on its first slow answer would miss every notice of the run.
    """
    if timeout is None:
        timeout = float(os.environ.get("FTORCH_NOTICE_PROBE_TIMEOUT_S", "0.5"))
    if providers is None:
        env = os.environ.get("FTORCH_NOTICE_PROVIDERS")
        providers = tuple(p.strip() for p in env.split(",") if p.strip()) if env else PROVIDERS
    pending = [p for p in providers if p in PROVIDERS]
    for round_ in range(rounds):
        slow = []
        for provider in pending:
            watcher = _make(provider, timeout * 2**round_)
            try:
                watcher.probe()
            except (NotOnThisCloud, OSError, ValueError) as exc:
                if _timed_out(exc):
                    slow.append(provider)
                continue
            return watcher
        pending = slow
        if not pending:
            break
    return None


class NoticeWatcher(threading.Thread):
    """Polls the detected provider and sets the flag on a notice; ends when none is found."""

    def __init__(
        self, flag: Flag, poll_s: float | None = None, log: Callable[[str], None] | None = None
    ) -> None:
        super().__init__(name="ftorch-notices", daemon=True)
        self.flag = flag
        self.poll_s = poll_s if poll_s is not None else float(os.environ.get("FTORCH_NOTICE_POLL_S", "2"))
        self.log = log or (lambda _m: None)
        self.provider: str | None = None
        self.stopped = threading.Event()
        self.detected = threading.Event()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        watcher = detect()
        self.provider = watcher.name if watcher else None
        self.detected.set()
        if watcher is None:
            return  # not on a cloud that gives notices: nothing to do, ever
        self.log(f"watching {watcher.name} preemption notices every {self.poll_s:g}s")
        failures = 0
        while not self.stopped.is_set() and not self.flag.is_set():
            try:
                reason = watcher.poll()
                failures = 0
            except (OSError, NotOnThisCloud, ValueError):
                failures += 1
                reason = None
                if failures == 30:
                    self.log(f"{watcher.name} metadata service stopped answering; still trying")
            if reason:
                self.log(f"preemption notice: {reason}")
                self.flag.set(reason)
                return
            self.stopped.wait(self.poll_s)


def start_watcher(flag: Flag, log: Callable[[str], None] | None = None) -> NoticeWatcher | None:
    """Start the notice watcher for this process (unless FTORCH_NOTICES=0). Returns it, or None."""
    if os.environ.get("FTORCH_NOTICES", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    watcher = NoticeWatcher(flag, log=log)
    watcher.start()
    return watcher

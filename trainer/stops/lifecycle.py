"""Is this attempt on spot or on demand? FTORCH_ON_SPOT (1/0) if set, else the instance metadata service.

AWS: `instance-life-cycle` (IMDSv2) is `spot` or `on-demand`; GCP: `scheduling/preemptible` is TRUE for
spot and preemptible VMs; Azure: `compute/priority` is `Spot` (or `Low`) or `Regular`. Off a cloud nothing
answers at the link-local address and the answer is None (unknown). The same base URLs and timeouts as
the preemption-notice watcher (trainer/stops/notices.py). No torch, no third-party imports.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from trainer.stops.notices import PROVIDERS, AwsNotices, NotOnThisCloud, _base, _request


def _aws(timeout: float) -> bool | None:
    aws = AwsNotices(_base("aws"), timeout)
    token = aws._token()
    status, _h, body = _request(
        f"{aws.base}/latest/meta-data/instance-life-cycle", {"X-aws-ec2-metadata-token": token}, timeout
    )
    text = body.decode(errors="replace").strip().lower() if status == 200 else ""
    return {"spot": True, "on-demand": False, "scheduled": False}.get(text)


def _gcp(timeout: float) -> bool | None:
    status, headers, body = _request(
        f"{_base('gcp')}/computeMetadata/v1/instance/scheduling/preemptible",
        {"Metadata-Flavor": "Google"},
        timeout,
    )
    if status != 200 or {k.lower(): v for k, v in headers.items()}.get("metadata-flavor") != "Google":
        return None
    return {"TRUE": True, "FALSE": False}.get(body.decode(errors="replace").strip().upper())


def _azure(timeout: float) -> bool | None:
    status, _h, body = _request(
        f"{_base('azure')}/metadata/instance/compute/priority?api-version=2021-02-01&format=text",
        {"Metadata": "true"},
        timeout,
    )
    text = body.decode(errors="replace").strip().lower() if status == 200 else ""
    return {"spot": True, "low": True, "regular": False}.get(text)


def on_spot(env: Mapping[str, str] | None = None) -> bool | None:
    """True on spot, False on demand, None when nothing says."""
    env = os.environ if env is None else env
    given = env.get("FTORCH_ON_SPOT", "").strip().lower()
    if given in ("1", "true", "yes", "spot"):
        return True
    if given in ("0", "false", "no", "on-demand"):
        return False
    timeout = float(env.get("FTORCH_NOTICE_PROBE_TIMEOUT_S", "0.5"))
    ask = {"aws": _aws, "gcp": _gcp, "azure": _azure}
    for provider in PROVIDERS:
        try:
            answer = ask[provider](timeout)
        except (NotOnThisCloud, OSError, ValueError):
            continue
        if answer is not None:
            return answer
    return None

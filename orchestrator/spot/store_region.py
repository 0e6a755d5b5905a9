"""The run store's region read from its bucket (S3 GetBucketLocation), cached.

The planner prices data movement from the store's region (orchestrator/spot/egress.py). When the job file
does not give `checkpoint.region`, the bucket is asked once, within a short time limit, and the answer is
kept per bucket (and endpoint) in $FTORCH_HOME/store_regions.json (owner-only). No credentials, no network
or no answer in time: None (the plan then says the region is unknown, or refuses where it needs it).
GCS and Azure buckets are not asked (gcsfs/adlfs are not dependencies): their region is
`checkpoint.region`.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from orchestrator.home import ftorch_home, private_dir, write_private

CACHE_FILE = "store_regions.json"
TIMEOUT_S = 3.0
#: buckets this process could not ask (not cached on disk: the next process asks again)
_UNKNOWN: set[str] = set()


def _cache_key(uri: str, options: Mapping[str, Any]) -> tuple[str, str] | None:
    parsed = urlparse(uri)
    if not parsed.netloc:
        return None
    endpoint = str(
        options.get("endpoint_url")
        or (options.get("client_kwargs") or {}).get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL")
        or ""
    )
    return parsed.scheme.lower(), f"{parsed.scheme.lower()}://{parsed.netloc}|{endpoint}"


def _s3_region(bucket: str, options: Mapping[str, Any], timeout_s: float) -> str | None:
    import botocore.session
    from botocore.config import Config

    session = botocore.session.get_session()
    session.set_config_variable("metadata_service_timeout", 1)
    session.set_config_variable("metadata_service_num_attempts", 1)
    key, secret = options.get("key"), options.get("secret")
    if key and secret:
        session.set_credentials(key, secret, options.get("token"))
    if session.get_credentials() is None:
        return None  # no credentials: the bucket cannot be asked
    endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
    config = Config(connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 1})
    client = session.create_client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config)
    answer = client.get_bucket_location(Bucket=bucket)
    # S3 answers no constraint for us-east-1 (and "EU" for the old eu-west-1)
    location = answer.get("LocationConstraint") or "us-east-1"
    return "eu-west-1" if location == "EU" else str(location).lower()


def _ask(scheme: str, bucket: str, options: Mapping[str, Any], timeout_s: float) -> str | None:
    """The bucket's region, or None when it cannot be known within `timeout_s` (errors are None too)."""
    asker = {"s3": _s3_region, "s3a": _s3_region}.get(scheme)  # gs://, az://: checkpoint.region
    if asker is None:
        return None
    found: list[str | None] = []

    def run() -> None:
        try:
            found.append(asker(bucket, options, timeout_s))
        except Exception:  # noqa: BLE001 - offline, denied, missing client: unknown, said by the plan
            found.append(None)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout_s + 1.0)
    return found[0] if found else None


def detect(uri: str, options: Mapping[str, Any] | None = None, timeout_s: float = TIMEOUT_S) -> str | None:
    """The region of the bucket of `uri` (cached per bucket and endpoint), or None when unknowable now."""
    options = dict(options or {})
    key = _cache_key(uri, options)
    if key is None:
        return None
    scheme, name = key
    path = ftorch_home() / CACHE_FILE  # made (owner-only) only when there is an answer to keep
    try:
        cache = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache.get(name), str):
        return cache[name]
    if name in _UNKNOWN:
        return None
    region = _ask(scheme, urlparse(uri).netloc, options, timeout_s)
    if region is None:
        _UNKNOWN.add(name)  # asked once per process: a plan of many offers waits at most once
    else:
        cache[name] = region
        path = private_dir() / CACHE_FILE
        write_private(path, json.dumps(cache, indent=1, sort_keys=True).encode())
    return region

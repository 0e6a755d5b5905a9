"""The run store's region: asked of the bucket (the suite's real S3 server), cached owner-only, and a
launch refused in one line when it cannot be known and the offers span regions."""

from __future__ import annotations

import json
import stat

import pytest
from helpers import REPO

from orchestrator.errors import SpecError
from orchestrator.jobfile.spec import load_job
from orchestrator.sizing.planner import make_plan
from orchestrator.spot import store_region
from orchestrator.spot.egress import require_region, store_of

EXAMPLE = REPO / "examples" / "llama3-8b-full.yaml"


def spec_for(uri: str, *sets: str):
    return load_job(EXAMPLE, [f"checkpoint.uri={uri}", *sets], check_support=False)


def test_the_region_is_asked_of_the_bucket_and_cached_owner_only(s3, ftorch_home, monkeypatch) -> None:  # noqa: ANN001
    store = store_of(spec_for(f"s3://{s3.name}/runs"))
    assert (store.cloud, store.region, store.how) == ("aws", "us-east-1", "bucket")
    cache = ftorch_home / store_region.CACHE_FILE
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    (key,) = json.loads(cache.read_text())
    assert key.startswith(f"s3://{s3.name}|") and s3.endpoint in key
    # the cached answer is used: without credentials the bucket cannot be asked, the cache still knows
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(ftorch_home / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(ftorch_home / "none"))
    assert store_region._ask("s3", s3.name, {}, 2.0) is None
    assert store_of(spec_for(f"s3://{s3.name}/other")).region == "us-east-1"
    # the job file's region wins, and is not asked
    assert store_of(spec_for("s3://elsewhere/x", "checkpoint.region=eu-west-1")).how == "checkpoint.region"


def test_the_plan_prices_data_movement_from_the_detected_region(s3, ftorch_home) -> None:  # noqa: ANN001
    spec = spec_for(f"s3://{s3.name}/runs", "resources.clouds=[aws]", "resources.regions=[us-west-2]")
    plan = make_plan(spec)
    assert plan.chosen is not None and plan.chosen.egress_usd > 0  # us-west-2 -> the bucket's us-east-1
    assert not any(n.startswith("egress: not priced") for n in plan.notes)


def test_an_unknowable_region_is_refused_where_it_decides_the_offer(ftorch_home, monkeypatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(ftorch_home / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(ftorch_home / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    spread = spec_for("s3://nobody-can-ask/runs", "resources.clouds=[aws]")
    plan = make_plan(spread)
    assert store_of(spread).how == "unknown"
    with pytest.raises(SpecError) as refused:
        require_region(spread, plan.candidates)
    assert refused.value.field == "checkpoint.region"
    assert "us-east-1" in refused.value.message and "\n" not in str(refused.value)
    assert not ftorch_home.exists()  # nothing kept of an unknown, not even the folder
    # pinned to one region, where the store is does not change the choice: nothing to refuse
    pinned = spec_for("s3://nobody-can-ask/runs", "resources.clouds=[aws]", "resources.regions=[us-east-1]")
    require_region(pinned, make_plan(pinned).candidates)


def test_a_launch_is_refused_in_one_line_and_nothing_is_written(ftorch_home, monkeypatch) -> None:
    from orchestrator.backends import skypilot, skypilot_sdk

    # past the preflight (as tests/orchestrator_tests/backends/test_skypilot_launch.py: clouds enabled)
    monkeypatch.setattr(skypilot_sdk, "enabled_clouds", lambda: ["aws", "gcp"])
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(ftorch_home / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(ftorch_home / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    before = sorted(p.name for p in ftorch_home.rglob("*"))
    with pytest.raises(SpecError) as refused:
        skypilot.prepare(spec_for("s3://nobody-can-ask/runs"), "job-1", "s3://nobody-can-ask/runs/job-1")
    assert str(refused.value).startswith("checkpoint.region: ")
    assert sorted(p.name for p in ftorch_home.rglob("*")) == before

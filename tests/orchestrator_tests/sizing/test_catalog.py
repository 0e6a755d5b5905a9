"""The GPU catalog: the bundled snapshot, its build script, and the SkyPilot fallback."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from orchestrator.sizing import catalog as cat

SHARED_CATALOG = REPO.parent / "shared" / "data" / "catalog"


def test_bundled_catalog_is_complete_and_sane():
    c = cat.bundled_catalog()
    assert len(c.offers) > 100 and not c.live and "bundled snapshot" in c.source
    clouds = {o.cloud for o in c.offers}
    assert {"aws", "gcp", "lambda", "runpod"} <= clouds
    for o in c.offers:
        assert o.count >= 1 and o.gpu_memory_gib > 0 and o.regions
        assert o.ondemand_usd or o.spot_usd
        if o.spot_usd and o.ondemand_usd:
            assert o.spot_usd < o.ondemand_usd * 1.5
    assert all(o.spot_usd is None for o in c.offers if o.cloud == "lambda")  # Lambda sells no spot
    assert all(o.spot_usd is None for o in c.offers if o.cloud == "runpod")  # SECURE pods are not spot
    assert not any(o.instance_type.startswith("g6f.") for o in c.offers)  # fractional GPUs dropped
    by_name = {(o.cloud, o.instance_type): o for o in c.offers}
    assert by_name[("gcp", "a2-highgpu-2g")].nvlink  # SXM family, inferred
    assert not by_name[("aws", "g5.12xlarge")].nvlink


def test_build_script_reproduces_the_bundled_files(tmp_path: Path):
    if not SHARED_CATALOG.exists():
        pytest.skip("shared catalog data not present")
    spec = importlib.util.spec_from_file_location("build_catalog", REPO / "scripts" / "build_catalog.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(SHARED_CATALOG, tmp_path)
    for name in ("gpu_offers.csv", "gpu_offer_regions.csv"):
        assert (tmp_path / name).read_text() == (REPO / "orchestrator" / "data" / name).read_text(), name


def test_filter_by_memory_cloud_and_accelerator():
    c = cat.bundled_catalog()
    big = c.filter(min_memory_gib=80)
    assert big and all(o.gpu_memory_gib >= 80 for o in big)
    assert {o.cloud for o in c.filter(clouds=["gcp"])} == {"gcp"}
    assert {o.accelerator for o in c.filter(accelerators=["l4"])} == {"L4"}


def test_region_prices_are_medians_over_allowed_regions():
    offers = cat.parse_offers(
        "cloud,instance_type,accelerator,count,gpu_memory_gib,ondemand_usd,spot_usd,regions,interconnect\n"
        "aws,x1,L4,1,22,1.0,0.4,us-east-1;us-west-2;eu-west-1,n/a\n",
        "cloud,instance_type,region,ondemand_usd,spot_usd\n"
        "aws,x1,us-east-1,0.9,0.3\naws,x1,us-west-2,1.0,0.5\naws,x1,eu-west-1,1.2,\n",
    )
    (offer,) = offers
    assert offer.prices_in(None)[:2] == (1.0, 0.4)
    assert offer.prices_in(["eu-west-1"])[:2] == (1.2, None)
    assert offer.prices_in(["us-east-1", "us-west-2"])[:2] == (pytest.approx(0.95), pytest.approx(0.4))
    assert offer.prices_in(["ap-south-1"]) == (None, None, ())


def test_offline_and_missing_skypilot_use_the_bundled_snapshot(monkeypatch):
    assert cat.load_catalog(offline=True) is cat.bundled_catalog()
    monkeypatch.setattr(cat, "sky_available", lambda: False)
    c = cat.load_catalog(offline=False)
    assert not c.live and "SkyPilot is not installed" in c.source and c.offers


def test_a_failing_or_slow_skypilot_falls_back(monkeypatch):
    monkeypatch.setattr(cat, "sky_available", lambda: True)

    def broken(timeout_s=None):
        raise RuntimeError("catalog fetch failed")

    monkeypatch.setattr(cat, "_sky_offers", broken)
    c = cat.load_catalog(offline=False)
    assert not c.live and "unavailable" in c.source and "catalog fetch failed" in c.source

    def slow(timeout_s=None):
        raise subprocess.TimeoutExpired("sky probe", timeout_s)

    monkeypatch.setattr(cat, "_sky_offers", slow)
    c = cat.load_catalog(offline=False)
    assert not c.live and "no answer" in c.source


def test_a_readable_skypilot_catalog_is_used(monkeypatch):
    live = [cat.Offer("aws", "p5.48xlarge", "H100", 8, 80, 98.0, 20.0, "unknown")]
    monkeypatch.delitem(sys.modules, "sky", raising=False)  # another test in this process may have loaded it
    monkeypatch.setattr(cat, "sky_available", lambda: True)
    monkeypatch.setattr(cat, "_sky_offers", lambda timeout_s=None: live)
    c = cat.load_catalog(offline=False)
    assert c.live and "SkyPilot catalog" in c.source
    assert c.offers[0].interconnect == "NVLink"  # taken from the snapshot where SkyPilot does not say
    assert "sky" not in sys.modules


def test_the_real_probe_is_bounded_and_quiet():
    """Whatever SkyPilot does here (absent, offline, slow), load_catalog returns quickly with offers."""
    import time

    start = time.monotonic()
    c = cat.load_catalog(offline=False)
    assert c.offers and time.monotonic() - start < cat.SKY_PROBE_TIMEOUT_S + 3


def test_ftorch_gpus_lists_the_consumer_tier():
    from helpers import ftorch

    data = json.loads(ftorch("gpus", "--tier", "consumer", "--json", "--offline").stdout)
    offers = data["offers"]
    assert offers and all(o["tier"] == "consumer" for o in offers)
    cards = {(o["cloud"], o["accelerator"]) for o in offers}
    assert {
        ("runpod", "RTX4090"),
        ("vast", "RTX4090"),
        ("runpod", "RTXA4000"),
        ("runpod", "RTX6000-Ada"),
    } <= cards
    assert all(o["interconnect"] == "PCIe" for o in offers if o["cloud"] in ("runpod", "vast"))
    table = ftorch("gpus", "--min-memory", "40", "--offline", "--cloud", "runpod")
    rows = [line for line in table.stdout.splitlines() if "RTX6000-Ada" in line or "H100" in line]
    assert table.returncode == 0 and "tier" in table.stdout
    tiers = [("consumer" in r, "datacenter" in r) for r in rows]
    assert (True, False) in tiers and (False, True) in tiers
    assert tiers.index((True, False)) < tiers.index((False, True))  # grouped: consumer cards first
    bad = ftorch("gpus", "--tier", "gaming", "--offline")
    assert bad.returncode == 2 and "--tier" in bad.stderr and "consumer, datacenter" in bad.stderr

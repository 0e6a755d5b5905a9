"""`ftorch simulate`: output, JSON, options, one-line errors with exit code 2."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from helpers import REPO

from orchestrator.cli import app as cli

SHARED = (
    REPO.parent / "shared/data/spot-traces/availability/1-node/aws-02-15-2023"
)  # ../shared, as CI lays it
NUMBERS = [
    "--hours",
    "8",
    "--spot-price",
    "0.66",
    "--ondemand-price",
    "3.06",
    "--checkpoint-interval",
    "10m",
    "--restart-overhead",
    "300",
]


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, str]:
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: sim\nmodel: gpt2\ndata: {path: s3://b/d.jsonl}\ncheckpoint: {uri: s3://b/c}\n"
        "resources: {deadline: 12h}\n"
    )
    # zone a: up 6 h, then down; zone b: down 2 h, up 1 h, down 13 h, then up (5-minute ticks)
    a = [1] * 72 + [0] * 500
    b = [0] * 24 + [1] * 12 + [0] * 156 + [1] * 380
    out = {"job": str(job)}
    for name, data in (("a", a), ("b", b)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": data}))
        out[name] = str(path)
    return out


def ftorch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["ftorch", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_table(monkeypatch, capsys, files) -> None:
    code, out, err = ftorch(
        monkeypatch, capsys, "simulate", files["job"], "--trace", files["a"], "--trace", files["b"], *NUMBERS
    )
    assert code == 0, err
    assert "2 zone(s)" in out and "deadline 12.00 h" in out
    rows = {
        line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in cli_names()
    }
    assert set(rows) == set(cli_names())
    assert "MISSED" in rows["spot-only"] and " met" in rows["deadline"] and " met" in rows["on-demand"]


def cli_names() -> tuple[str, ...]:
    from orchestrator.spot.policy import BASELINE_NAMES, POLICY_NAMES

    return (*POLICY_NAMES, *BASELINE_NAMES)


def test_json_and_files_after_trace(monkeypatch, capsys, files) -> None:
    code, out, err = ftorch(
        monkeypatch, capsys, "simulate", files["job"], "--trace", files["a"], files["b"], *NUMBERS, "--json"
    )
    assert code == 0, err
    payload = json.loads(out)
    assert payload["traces"]["zones"] == ["a", "b"] and payload["traces"]["gap_s"] == 300
    assert payload["job"]["work_s"] == 8 * 3600 and payload["job"]["checkpoint_interval_s"] == 600
    assert payload["job"]["deadline_s"] == 12 * 3600
    assert set(payload["job"]["sources"].values()) == {"given"}
    results = {r["policy"]: r for r in payload["results"]}
    assert set(results) == set(cli_names())
    d = results["deadline"]
    for key in (
        "cost_usd",
        "cost_vs_ondemand",
        "finish_s",
        "deadline_met",
        "preemptions",
        "wait_s",
        "work_lost_s",
    ):
        assert key in d
    assert d["deadline_met"] and not results["spot-only"]["deadline_met"]
    assert d["cost_usd"] < results["on-demand"]["cost_usd"]
    assert results["on-demand"]["cost_vs_ondemand"] == pytest.approx(1.0)


def test_one_policy_deadline_override_start_and_windows(monkeypatch, capsys, files) -> None:
    base = ["simulate", files["job"], "--trace", files["a"], *NUMBERS, "--json", "--policy", "deadline"]
    code, out, err = ftorch(monkeypatch, capsys, *base, "--deadline", "9h", "--start", "1h")
    assert code == 0, err
    payload = json.loads(out)
    assert [r["policy"] for r in payload["results"]] == ["deadline", "on-demand"]
    assert payload["job"]["deadline_s"] == 9 * 3600 and payload["traces"]["start_h"] == 1.0
    code, out, err = ftorch(monkeypatch, capsys, *base, "--windows", "4")
    assert code == 0, err
    payload = json.loads(out)
    assert payload["windows"] == 4 and {s["policy"] for s in payload["summaries"]} == {
        "deadline",
        "on-demand",
    }
    code, out, err = ftorch(monkeypatch, capsys, *base[:-3], "--windows", "4")
    assert code == 0 and "start offsets" in out and "cost/OD" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--policy", "yolo"], "--policy: unknown policy 'yolo'"),
        (["--deadline", "tomorrow"], "--deadline:"),
        (["--deadline", "2020-01-01T00:00+00:00"], "not in the future"),
        (["--restart-overhead", "soon"], "--restart-overhead:"),
        (["--start", "400d"], "--start: is past the end"),
        (["--windows", "0"], "--windows"),
        (["--frobnicate"], "unknown option --frobnicate"),
        (["missing.json"], "missing.json does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line(monkeypatch, capsys, files, extra, message) -> None:
    code, out, err = ftorch(
        monkeypatch, capsys, "simulate", files["job"], "--trace", files["a"], *NUMBERS, *extra
    )
    assert code == 2, (out, err)
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_trace_and_bad_job(monkeypatch, capsys, files, tmp_path) -> None:
    code, _, err = ftorch(monkeypatch, capsys, "simulate", files["job"], *NUMBERS)
    assert code == 2 and "--trace" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "model: gpt2\ndata: {path: s3://b/d}\ncheckpoint: {uri: s3://b/c}\nresources: {deadline: soon}\n"
    )
    code, _, err = ftorch(monkeypatch, capsys, "simulate", str(bad), "--trace", files["a"], *NUMBERS)
    assert code == 2 and "resources.deadline" in err


def test_without_a_planner_the_numbers_are_required(monkeypatch, capsys, files) -> None:
    monkeypatch.setitem(sys.modules, "orchestrator.sizing.planner", None)  # import fails
    code, _, err = ftorch(
        monkeypatch, capsys, "simulate", files["job"], "--trace", files["a"], "--hours", "8"
    )
    assert code == 2 and "--spot-price" in err


def test_planner_fills_what_is_not_given(monkeypatch, capsys, files) -> None:
    chosen = types.SimpleNamespace(
        cloud="aws",
        instance_type="p3.2xlarge",
        accelerator="V100",
        count=1,
        est_hours=6.0,
        spot_hourly_usd=0.9,
        ondemand_hourly_usd=3.06,
        checkpoint_interval_s=900.0,
        restart_overhead_s=240.0,
    )
    fake = types.ModuleType("orchestrator.sizing.planner")
    fake.make_plan = lambda spec, offline=True: types.SimpleNamespace(chosen=chosen)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "orchestrator.sizing.planner", fake)
    code, out, err = ftorch(
        monkeypatch, capsys, "simulate", files["job"], "--trace", files["a"], "--hours", "7", "--json"
    )
    assert code == 0, err
    job = json.loads(out)["job"]
    assert job["work_s"] == 7 * 3600 and job["sources"]["hours"] == "given"
    assert (
        job["spot_hourly_usd"] == 0.9
        and job["restart_overhead_s"] == 240
        and job["checkpoint_interval_s"] == 900
    )
    assert job["sources"]["spot_price"] == "planner (aws p3.2xlarge V100 x1)"
    chosen.spot_hourly_usd = None  # an offer with no spot price
    code, _, err = ftorch(
        monkeypatch, capsys, "simulate", files["job"], "--trace", files["a"], "--hours", "7"
    )
    assert code == 2 and "give --spot-price" in err


def test_with_the_real_planner(monkeypatch, capsys, files) -> None:
    planner = pytest.importorskip("orchestrator.sizing.planner")
    if not hasattr(planner, "make_plan"):
        pytest.skip("the planner has no make_plan yet")
    args = ["simulate", files["job"], "--trace", files["a"], "--json"]
    args += ["--set", "data.tokens=20000000", "--set", "model=meta-llama/Llama-3.1-8B"]
    code, out, err = ftorch(monkeypatch, capsys, *args)
    assert code == 0, err
    job = json.loads(out)["job"]
    assert job["work_s"] > 0 and job["ondemand_hourly_usd"] > 0
    assert all(v.startswith("planner") for v in job["sources"].values())


@pytest.mark.skipif(not SHARED.exists(), reason="shared spot traces not present")
def test_shared_traces_folder(monkeypatch, capsys, files) -> None:
    code, out, err = ftorch(monkeypatch, capsys, "simulate", files["job"], "--trace", str(SHARED), *NUMBERS)
    assert code == 0, err
    assert "9 zone(s)" in out and "20158 ticks of 195 s" in out


def test_no_observer_policy(monkeypatch, capsys, files) -> None:
    """What a deadline job does with nobody watching: it never waits, falls back and probes back."""
    base = ["simulate", files["job"], "--trace", files["a"], files["b"], *NUMBERS, "--json"]
    code, out, err = ftorch(monkeypatch, capsys, *base, "--policy", "no-observer")
    assert code == 0, err
    results = {r["policy"]: r for r in json.loads(out)["results"]}
    assert list(results) == ["no-observer", "on-demand"]
    alone = results["no-observer"]
    assert alone["deadline_met"] and alone["ondemand_s"] > 0 and alone["spot_s"] > 0
    assert alone["probes"] >= 1 and alone["wait_s"] < 3600  # no waiting: only SkyPilot's failed spot launches
    code, out, err = ftorch(monkeypatch, capsys, *base)
    assert code == 0, err
    assert "no-observer" in {r["policy"] for r in json.loads(out)["results"]}

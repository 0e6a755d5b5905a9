"""`ftorch estimate`, `ftorch plan`, `ftorch gpus` end to end, through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from helpers import REPO

EXAMPLES = REPO / "examples"


def ftorch(*args: str, env_home: Path | None = None) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ)
    if env_home is not None:
        env["FTORCH_HOME"] = str(env_home)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.app", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )


def test_estimate_json_on_an_example():
    out = ftorch("estimate", str(EXAMPLES / "llama3-8b-full.yaml"), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["n_gpus"] == 1 and data["peak_gib_per_gpu"] > 80 and data["params"] == 8_030_261_248
    sharded = json.loads(
        ftorch("estimate", str(EXAMPLES / "llama3-8b-full.yaml"), "--gpus", "8", "--json").stdout
    )
    assert sharded["n_gpus"] == 8 and sharded["peak_gib_per_gpu"] < 80


def test_estimate_text_on_a_config_only_model_folder(tmp_path: Path):
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 1024,
                "num_hidden_layers": 8,
                "num_attention_heads": 16,
                "num_key_value_heads": 4,
                "intermediate_size": 2816,
                "vocab_size": 32000,
                "tie_word_embeddings": True,
            }
        )
    )
    (tmp_path / "data.jsonl").write_text(
        "\n".join(json.dumps({"text": "hello world " * 50}) for _ in range(10))
    )
    job = {
        "model": "my-model",
        "method": "lora",
        "data": {"path": "data.jsonl", "max_seq_len": 512},
        "checkpoint": {"uri": str(tmp_path / "runs")},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    out = ftorch("estimate", str(tmp_path / "job.yaml"))
    assert out.returncode == 0, out.stderr
    assert "my-model" in out.stdout and "peak" in out.stdout and "activations" in out.stdout
    plan = json.loads(ftorch("plan", str(tmp_path / "job.yaml"), "--json", "--offline", "--no-trace").stdout)
    assert plan["chosen"] is not None and plan["workload"]["tokens_per_epoch"] == 10 * 150


def test_plan_table_and_json_on_examples():
    out = ftorch("plan", str(EXAMPLES / "llama3-8b-qlora.yaml"), "--offline", "--no-trace")
    assert out.returncode == 0, out.stderr
    assert "estimated" in out.stdout and "traced" not in out.stdout.split("rejected")[0]
    assert "chosen:" in out.stdout and "►" in out.stdout and "rejected" in out.stdout
    assert "bundled snapshot" in out.stdout
    data = json.loads(
        ftorch("plan", str(EXAMPLES / "llama3-70b-qlora.yaml"), "--json", "--offline", "--no-trace").stdout
    )
    chosen = data["chosen"]
    for key in (
        "cloud",
        "instance_type",
        "accelerator",
        "count",
        "gpu_memory_gib",
        "interconnect",
        "spot",
        "hourly_usd",
        "est_hours",
        "expected_cost_usd",
    ):
        assert key in chosen
    assert data["candidates"] and all("reason" in r for r in data["rejected"])


def test_an_impossible_job_exits_2_with_one_line(tmp_path: Path):
    out = ftorch(
        "plan",
        str(EXAMPLES / "llama3-8b-full.yaml"),
        "--offline",
        "--no-trace",
        "--set",
        "resources.clouds=[runpod]",
        "--set",
        "train.offload=none",  # with CPU offload (auto) a RunPod H100 can run it, slowly
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no offer can run this job" in lines[0] and "Traceback" not in out.stderr


def test_bad_input_exits_2():
    assert ftorch("estimate", str(EXAMPLES / "llama3-8b-qlora.yaml"), "--gpus", "0").returncode == 2
    out = ftorch("estimate", str(EXAMPLES / "llama3-8b-qlora.yaml"), "--set", "model=acme/unknown")
    assert out.returncode == 2 and out.stderr.startswith("error: model:") and "--online" in out.stderr
    out = ftorch(
        "plan", str(EXAMPLES / "llama3-8b-qlora.yaml"), "--offline", "--no-trace", "--set", "data.tokens=null"
    )
    assert out.returncode == 2 and "data.tokens" in out.stderr


def test_gpus_lists_offers_and_their_source():
    out = ftorch("gpus", "--min-memory", "80", "--offline")
    assert out.returncode == 0 and out.stdout.startswith("source: bundled snapshot")
    data = json.loads(ftorch("gpus", "--min-memory", "80", "--cloud", "gcp", "--json", "--offline").stdout)
    assert data["offers"] and all(o["gpu_memory_gib"] >= 80 and o["cloud"] == "gcp" for o in data["offers"])
    assert "bundled snapshot" in data["source"] and data["live"] is False

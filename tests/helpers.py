"""Test helpers: a tiny model and tokenizer built from a config, data made here, runs of the real trainer."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# one thread per process: tests run several processes at once, and oversubscribed OpenMP threads spin
os.environ.setdefault("OMP_NUM_THREADS", "1")

WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]


def quickstart_maker() -> Any:
    """examples/make_quickstart.py as a module (its tokenizer builder is shared with the tests)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_quickstart", REPO / "examples" / "make_quickstart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_tiny_model(folder: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    rng = random.Random(seed)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)]
    corpus += ["### Instruction:\n", "### Response:\n", "### Input:\n", "<|user|>", "<|assistant|>"] * 20
    hf_tok = quickstart_maker().build_tokenizer(corpus, vocab_size=300)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
    )
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    hf_tok.save_pretrained(folder)
    return folder


def write_data(path: Path, fmt: str, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(n):
            words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
            if fmt == "text":
                row: dict[str, Any] = {"text": " ".join(words)}
            elif fmt == "instruction":
                row = {"instruction": "first", "input": " ".join(words), "output": words[0]}
            else:
                row = {
                    "messages": [
                        {"role": "system", "content": "be brief"},
                        {"role": "user", "content": " ".join(words)},
                        {"role": "assistant", "content": words[-1]},
                    ]
                }
            handle.write(json.dumps(row) + "\n")
    return path


def job_dict(model: Path, data_path: Path, ckpt: Path, **sections: Any) -> dict[str, Any]:
    """A small valid job; keyword arguments replace or extend sections (dicts are merged)."""
    job: dict[str, Any] = {
        "name": "t",
        "model": str(model),
        "method": "lora",
        "lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj", "lm_head"]},
        "data": {"path": str(data_path), "format": "instruction", "max_seq_len": 96},
        "train": {
            "micro_batch_size": 4,
            "grad_accum": 1,
            "max_steps": 30,
            "lr": 5e-3,
            "seed": 7,
            "precision": "fp32",
            "log_every": 1,
            "warmup_steps": 3,
        },
        "checkpoint": {"uri": str(ckpt), "every": 5, "keep": 2},
        "local": {"threads": 1, "restart_backoff_s": 0.2},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(job.get(key), dict):
            job[key] = {**job[key], **value}
        else:
            job[key] = value
    return job


def prepare_run(job: dict[str, Any], run_id: str = "run") -> str:
    """Write a run store by hand (what `ftorch launch` does), for running the trainer directly."""
    from orchestrator.jobfile.spec import validate_job
    from trainer.runstore.storage import join_uri
    from trainer.runstore.store import RunStore

    spec = validate_job(job)
    run_uri = join_uri(spec.checkpoint.uri, run_id)
    RunStore(run_uri).write_spec(
        {
            "job": spec.model_dump(mode="json"),
            "run_id": run_id,
            "output_uri": join_uri(run_uri, "output"),
            "created_at": 0.0,
        }
    )
    return run_uri


def trainer_cmd(run_uri: str, attempt: int = 1) -> list[str]:
    return [sys.executable, "-m", "trainer", run_uri, "--attempt", str(attempt)]


def run_trainer(
    run_uri: str, attempt: int = 1, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        trainer_cmd(run_uri, attempt),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


def ftorch(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "ftorch"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "orchestrator.cli.app"]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


def final_weights(run_uri: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    folder = Path(run_uri) / "output"
    name = (
        "adapter_model.safetensors"
        if (folder / "adapter_model.safetensors").exists()
        else "model.safetensors"
    )
    return load_file(str(folder / name))


def assert_bitwise_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    import torch

    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs (max abs diff {(a[key] - b[key]).abs().max()})"


def wandb_records(path: Path) -> list:  # noqa: ANN401
    """The records of a W&B transaction log (`run-<id>.wandb`: a LevelDB-style log of wandb's protobuf
    Records, 32 KiB blocks, 7-byte record headers), parsed with wandb's own protobuf classes."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    records, pos, parts = [], 7, b""
    while pos < len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if length == 0 and kind == 0:
            pos += left
            continue
        if pos + 7 + length > len(data):  # a record cut short (a copy taken while W&B wrote): not there
            break
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


def cli_in_process(capsys: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """`ftorch ARGS` in this process (fast: no interpreter start), as a CompletedProcess."""
    from orchestrator.cli import app as cli_mod

    capsys.readouterr()
    argv, sys.argv = sys.argv, ["ftorch", *args]
    code = 0
    try:
        cli_mod.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out.out, out.err)


def per_rank(micro_batch: int, accum: int, checkpointing: bool = False) -> dict[str, Any]:
    """An out-of-memory adaptation's layout as status shows it (`adaptations[].from` / `.to`)."""
    return {
        "micro_batch_per_rank": micro_batch,
        "grad_accum_per_rank": accum,
        "gradient_checkpointing": checkpointing,
    }


def open_to_others(root: Path) -> list[str]:
    """Every file or folder under `root` (itself included) that group or others may read, write or enter."""
    import stat

    return [
        f"{p.relative_to(root)} {oct(stat.S_IMODE(p.lstat().st_mode))}"
        for p in [root, *root.rglob("*")]
        if not p.is_symlink() and stat.S_IMODE(p.lstat().st_mode) & 0o077
    ]


def process_gone(pid: int, within: float = 10.0) -> bool:
    """No such process (or only its zombie, which its new parent has not reaped yet) within `within` s."""
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False

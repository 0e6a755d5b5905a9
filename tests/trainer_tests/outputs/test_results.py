"""Results where users take them: every export carries ftorch's model card and training_summary.json
(one definition of the first/last loss, the `--follow` summary's too), `export --push-to-hub` against a
stand-in Hub on 127.0.0.1 (HF_ENDPOINT; never the network), and `generate`/`chat` on the trained model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, ftorch, job_dict, write_data
from hub_server import HubServer

from orchestrator.registry import Registry
from trainer.outputs import model_card
from trainer.runstore.store import RunStore


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, Any]:
    """A 20-step LoRA run launched with --follow (its summary kept), in its own FTORCH_HOME."""
    tmp = tmp_path_factory.mktemp("results")
    data = write_data(tmp / "d.jsonl", "instruction", 64)
    job = job_dict(
        tiny_model,
        data,
        tmp / "runs",
        name="res",
        data={"eval_examples": 8},
        train={"max_steps": 20, "lr": 3e-2, "log_every": 1, "eval_every": 10},
        checkpoint={"every": 5, "keep": 5},
    )
    job_file = tmp / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    env = {"FTORCH_HOME": str(tmp / "home")}
    done = ftorch("launch", str(job_file), "--follow", env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job_id = done.stdout.splitlines()[0].strip()
    return {"job_id": job_id, "env": env, "follow": done.stdout, "tmp": tmp, "model": tiny_model}


def _home(run: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.setenv("FTORCH_HOME", run["env"]["FTORCH_HOME"])
    return Registry()


def test_one_first_and_last_loss_for_the_card_the_summary_and_follow(
    run: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _home(run, monkeypatch).get(run["job_id"])
    summary = json.loads((Path(job.output_uri) / model_card.SUMMARY).read_text())
    losses = [r["loss"] for r in RunStore(job.run_uri).read_metrics()]
    assert len(losses) == 20
    assert (summary["first_loss"], summary["final_loss"]) == model_card.loss_ends(losses)
    said = f"training loss: {summary['first_loss']:.4f} (first steps) -> {summary['final_loss']:.4f} (last steps)"
    assert said in run["follow"], run["follow"][-1500:]
    card = (Path(job.output_uri) / model_card.CARD).read_text()
    assert f"{summary['first_loss']:.4f} (first steps) -> {summary['final_loss']:.4f}" in card


def test_every_export_carries_the_card_and_summary(run: dict[str, Any], tmp_path: Path) -> None:
    from huggingface_hub import ModelCard

    env = run["env"]
    newest, early, merged = tmp_path / "newest", tmp_path / "step5", tmp_path / "merged"
    for args in ((), ("--step", "5"), ("--merge",)):
        target = {(): newest, ("--step", "5"): early, ("--merge",): merged}[args]
        done = ftorch("export", run["job_id"], "--to", str(target), *args, env=env)
        assert done.returncode == 0, done.stderr
    final = json.loads((newest / model_card.SUMMARY).read_text())
    assert final["steps"] == 20 and final["export"] == {"step": 20, "merge": False}
    assert final["data"]["training_examples"] == 56 and final["eval_after"]["examples"] == 8
    card = ModelCard.load(newest / model_card.CARD)  # the Hub's own reader
    assert card.data.library_name == "peft" and "ftorch" in card.data.tags
    assert "PeftModel.from_pretrained" in card.text and "Exported from the checkpoint at step 20" in card.text
    assert "peft" not in (newest / model_card.CARD).read_text().split("## Training")[0].lower().replace(
        "library_name: peft", ""
    )  # not PEFT's empty template

    five = json.loads((early / model_card.SUMMARY).read_text())
    store = RunStore(str(Path(env["FTORCH_HOME"]).parent / "runs" / run["job_id"]))
    head = [r["loss"] for r in store.read_metrics() if r["step"] <= 5]
    assert five["steps"] == 5 and (five["first_loss"], five["final_loss"]) == model_card.loss_ends(head)
    assert five["eval_after"] is None and five["data"]["training_examples"] == 56
    assert "Exported from the checkpoint at step 5" in (early / model_card.CARD).read_text()

    merged_card = ModelCard.load(merged / model_card.CARD)
    assert merged_card.data.library_name == "transformers" and "merged" in merged_card.data.tags
    assert "PeftModel" not in merged_card.text


#: what a library's own noise looks like on stderr: tqdm's progress bars and Python's warnings
NOISE = re.compile(r"it/s|s/it|%\||FutureWarning|UserWarning|DeprecationWarning")


def _users_env(run: dict[str, Any]) -> dict[str, str]:
    """The environment as a user's shell has it: the libraries at their default verbosity (the suite sets
    TRANSFORMERS_VERBOSITY=error), their bars and warnings not switched off."""
    quieted = ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE", "PYTHONWARNINGS")
    return {**{k: v for k, v in os.environ.items() if k not in quieted}, **run["env"]}


def _ftorch_as_a_user(run: dict[str, Any], *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).parent / "ftorch")
    kwargs.setdefault("capture_output", True)
    return subprocess.run([exe, *args], cwd=REPO, env=_users_env(run), timeout=300, **kwargs)


def test_export_is_quiet(run: dict[str, Any], tmp_path: Path) -> None:
    """`ftorch export` prints its one line, not the libraries' progress bars ("Loading checkpoint shards",
    "Writing model shards") or FutureWarnings/UserWarnings: an adapter and a merged model."""
    for args in ((), ("--merge",)):
        target = str(tmp_path / f"out{len(args)}")
        done = _ftorch_as_a_user(run, "export", run["job_id"], "--to", target, *args, text=True)
        assert done.returncode == 0, done.stderr
        assert not NOISE.search(done.stderr), done.stderr[-3000:]
        assert done.stderr.strip() == "", done.stderr[-3000:]  # off a terminal: no spinner either
        assert len(done.stdout.splitlines()) == 1 and " from step 20 of " in done.stdout, done.stdout


def _read_terminal(leader: int, chunks: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end is closed and read out
            return
        if not chunk:
            return
        chunks.append(chunk)


def test_generate_prints_only_the_answer_with_or_without_a_terminal(run: dict[str, Any]) -> None:
    """The loading spinner of `generate`/`chat` goes to a terminal's stderr only: piped, stdout is the
    answer and nothing else, stderr empty; with stderr on a terminal the spinner shows there and stdout
    is unchanged."""
    import pty

    args = ("generate", run["job_id"], "-p", "first")
    piped = _ftorch_as_a_user(run, *args, text=True)
    assert piped.returncode == 0, piped.stderr
    assert len(piped.stdout.splitlines()) == 1 and piped.stderr == "", (piped.stdout, piped.stderr)

    leader, follower = pty.openpty()
    exe = str(Path(sys.executable).parent / "ftorch")
    env = {**_users_env(run), "TERM": "xterm-256color"}
    with subprocess.Popen([exe, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=follower) as on_tty:
        os.close(follower)  # the child holds the terminal now: reading ends (EIO) when it exits
        chunks: list[bytes] = []
        reader = threading.Thread(target=_read_terminal, args=(leader, chunks), daemon=True)
        reader.start()  # read while it runs: a full terminal buffer would block the spinner
        out, _ = on_tty.communicate(timeout=300)
        reader.join(timeout=30)
    os.close(leader)
    seen = b"".join(chunks)
    assert on_tty.returncode == 0, seen.decode(errors="replace")
    assert out.decode() == piped.stdout  # the spinner never touches stdout
    assert f"loading {run['job_id']}'s model" in seen.decode(errors="replace"), seen[-2000:]
    assert not NOISE.search(seen.decode(errors="replace")), seen[-2000:]


def _hub_env(run: dict[str, Any], hub: HubServer, token: str | None = None) -> dict[str, str]:
    # HF_HUB_DISABLE_XET: the stand-in speaks the LFS protocol, not Xet storage (the client's choice)
    return {
        **run["env"], "HF_ENDPOINT": hub.url, "HF_TOKEN": token or hub.token, "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(run["tmp"] / "hf-home"),
        "HF_HUB_OFFLINE": "0",  # the suite runs offline; the only endpoint here is the stand-in on 127.0.0.1
    }  # fmt: skip


def test_push_to_hub_uploads_the_export_as_one_commit(
    run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with HubServer() as hub:
        target = tmp_path / "pushed"
        done = ftorch(
            "export",
            run["job_id"],
            "--to",
            str(target),
            "--push-to-hub",
            "me/tiny-adapter",
            env=_hub_env(run, hub),
        )
        assert done.returncode == 0, done.stderr
        assert f"pushed to {hub.url}/me/tiny-adapter" in done.stdout
        assert hub.unknown == [] and all(hub.authorized), hub.requests
        repo = hub.repos["me/tiny-adapter"]
        assert repo.private and len(repo.commits) == 1
        local = {p.name: p.read_bytes() for p in target.iterdir() if not p.name.startswith(".ftorch")}
        assert repo.files == local  # every file, byte for byte (the adapter through LFS)
        assert {"README.md", "training_summary.json", "adapter_model.safetensors"} <= set(repo.files)
        assert hub.metadata[-1]["library_name"] == "peft" and "ftorch" in hub.metadata[-1]["tags"]

        # output.hub_model_id: every export of the job goes there, unless --no-push
        registry = _home(run, monkeypatch)
        spec = registry.get(run["job_id"]).spec
        spec["output"] = {**(spec.get("output") or {}), "hub_model_id": "team/from-the-job-file"}
        registry.update(run["job_id"], spec_json=json.dumps(spec))
        try:
            again = ftorch("export", run["job_id"], "--to", str(tmp_path / "again"), env=_hub_env(run, hub))
            assert again.returncode == 0 and "team/from-the-job-file" in hub.repos, again.stderr
            quiet = ftorch(
                "export", run["job_id"], "--to", str(tmp_path / "quiet"), "--no-push", env=_hub_env(run, hub)
            )
            assert quiet.returncode == 0 and "pushed" not in quiet.stdout and len(hub.repos) == 2
        finally:  # the other tests use the job as launched
            del spec["output"]["hub_model_id"]
            registry.update(run["job_id"], spec_json=json.dumps(spec))

        refused = ftorch(
            "export", run["job_id"], "--to", str(tmp_path / "refused"), "--push-to-hub", "me/other",
            env=_hub_env(run, hub, token="hf_wrong"),
        )  # fmt: skip
        assert refused.returncode == 1, refused.stderr
        assert (
            refused.stderr.strip()
            .splitlines()[-1]
            .startswith("error: --push-to-hub: the Hub refused me/other: HTTP 401")
        )
        assert "me/other" not in hub.repos
        assert (
            json.loads((tmp_path / "refused" / ".ftorch-export.json").read_text())["step"] == 20
        )  # export stands

    bad = ftorch("export", run["job_id"], "--push-to-hub", "not a repo", env=run["env"])
    assert bad.returncode == 2 and "--push-to-hub" in bad.stderr and "namespace/name" in bad.stderr


def test_a_hub_base_model_is_in_the_cards_metadata() -> None:
    summary = {"base_model": "Qwen/Qwen2.5-0.5B", "method": "lora", "export": {"step": 3, "merge": False}}
    assert model_card.card_metadata(summary).startswith("base_model: Qwen/Qwen2.5-0.5B\nlibrary_name: peft\n")
    assert "base_model" not in model_card.card_metadata({**summary, "base_model": "/data/models/qwen"})


GREEDY = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, prompt = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder).eval()
ids = tok("### Instruction:\\n" + prompt + "\\n\\n### Response:\\n", return_tensors="pt")["input_ids"]
out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                     pad_token_id=tok.pad_token_id)
print(tok.decode(out[0][ids.shape[1]:], skip_special_tokens=True))
"""


def _greedy(folder: Path, prompt: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", GREEDY, str(folder), prompt],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.rstrip("\n")


def test_generate_and_chat_answer_with_the_trained_model(run: dict[str, Any], tmp_path: Path) -> None:
    env = run["env"]
    said = ftorch("generate", run["job_id"], "--prompt", "first", "--max-new-tokens", "6", env=env)
    assert said.returncode == 0, said.stderr
    answer = said.stdout.rstrip("\n")
    merged = tmp_path / "merged"
    assert ftorch("export", run["job_id"], "--merge", "--to", str(merged), env=env).returncode == 0
    assert answer == _greedy(merged, "first")  # the trained model, framed as the training data
    assert answer != _greedy(run["model"], "first")  # not the base model's answer

    chat = subprocess.run(
        [str(Path(sys.executable).parent / "ftorch"), "chat", run["job_id"], "--max-new-tokens", "6"],
        input="first\nsecond\n",
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **env},
        timeout=300,
    )
    assert chat.returncode == 0, chat.stderr
    lines = chat.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == answer, chat.stdout
    missing = ftorch("generate", run["job_id"], "--prompt", "x", "--step", "7", env=env)
    assert missing.returncode == 2 and re.search(r"--step: no complete checkpoint at step 7", missing.stderr)

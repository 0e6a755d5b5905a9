"""Model shapes: the bundled table, config folders, hub ids; counts checked against transformers on meta."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.sizing.shapes import bundled_configs, bundled_names, bundled_shape, resolve_shape

REQUIRED = [
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "mistral-7b",
    "mixtral-8x7b",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-3b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "gemma-2-2b",
    "gemma-2-9b",
    "gemma-2-27b",
    "phi-3-mini",
    "phi-3-medium",
    "smollm2-135m",
    "smollm2-360m",
    "smollm2-1.7b",
    "gemma-2b",
    "gemma-7b",
    "phi-1.5",
    "phi-2",
    "falcon-7b",
    "falcon-40b",
    "pythia-6.9b",
    "gpt-neox-20b",
    "stablelm-3b",
    "stablelm-2-1.6b",
]
#: published parameter counts (model cards / safetensors metadata), as an independent check of the table
PUBLISHED = {
    "llama-2-7b": 6_738_415_616,
    "llama-3.1-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    "gemma-2-9b": 9_241_705_984,
    "phi-3-mini": 3_821_079_552,
    "smollm2-135m": 134_515_008,
    "llama-3.1-405b": 405_853_388_800,
    "falcon-7b": 6_921_720_704,
    "phi-2": 2_779_683_840,
    "pythia-6.9b": 6_857_302_016,
    "gemma-7b": 8_537_680_896,
}


def _hf_config(name: str, **changes):
    from transformers import AutoConfig

    cfg = {k: v for k, v in bundled_configs()[name].items() if k != "aliases"}
    model_type = cfg.pop("model_type")
    return AutoConfig.for_model(model_type, **{**cfg, **changes})


def test_bundled_table_has_the_required_architectures():
    assert set(REQUIRED) <= set(bundled_names())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_counts_match_published_figures(name):
    assert bundled_shape(name).params == PUBLISHED[name]


def test_counts_match_transformers_on_meta_device():
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    for name in bundled_names():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(_hf_config(name))
        shape = bundled_shape(name)
        total = sum(p.numel() for p in model.parameters())
        assert shape.params == total, name
        assert shape.embedding_params == model.get_input_embeddings().weight.numel(), name
        head = model.get_output_embeddings().weight
        tied = head is model.get_input_embeddings().weight
        bias = model.get_output_embeddings().bias
        expected = (0 if tied else head.numel()) + (bias.numel() if bias is not None else 0)
        assert shape.lm_head_params == expected, name


@pytest.mark.parametrize(
    ("name", "r", "targets"),
    [
        ("smollm2-135m", 8, "all-linear"),
        ("qwen2.5-0.5b", 16, "all-linear"),
        ("phi-3-mini", 4, "all-linear"),
        ("gemma-2-2b", 8, ["q_proj", "v_proj"]),
        ("mixtral-8x7b", 8, "all-linear"),
        ("llama-3.1-8b", 32, ["q_proj", "k_proj", "v_proj", "o_proj"]),
        ("falcon-7b", 8, "all-linear"),
        ("falcon-40b", 8, ["query_key_value"]),
        ("pythia-6.9b", 16, ["query_key_value", "dense_h_to_4h"]),
        ("phi-2", 8, "all-linear"),
        ("stablelm-2-1.6b", 8, "all-linear"),
        ("gemma-2b", 8, "all-linear"),
    ],
)
def test_lora_trainable_counts_match_peft(name, r, targets):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_hf_config(name, num_hidden_layers=2))
        model = peft.get_peft_model(model, peft.LoraConfig(r=r, target_modules=targets))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert replace(bundled_shape(name), layers=2).lora_params(r, targets) == trainable


def test_lora_params_grow_with_rank_and_targets():
    shape = bundled_shape("llama-3.1-8b")
    assert shape.lora_params(16, "all-linear") == 2 * shape.lora_params(8, "all-linear")
    assert shape.lora_params(16, ["q_proj", "v_proj"]) < shape.lora_params(16, "all-linear")
    assert shape.lora_params(16, "all-linear") == 41_943_040  # PEFT's count for Llama-3.1-8B r=16


def test_unknown_lora_target_is_a_spec_error():
    with pytest.raises(SpecError, match="lora.target_modules"):
        bundled_shape("llama-3.1-8b").lora_params(8, ["c_attn"])
    with pytest.raises(SpecError, match="query_key_value"):  # Falcon's names are its own, not Llama's
        bundled_shape("falcon-7b").lora_params(8, ["q_proj", "v_proj"])
    with pytest.raises(SpecError, match="c_attn is not a linear layer"):  # one of several: not ignored
        bundled_shape("llama-3.1-8b").lora_params(8, ["q_proj", "c_attn"])
    shape = bundled_shape("llama-3.1-8b")  # modules outside the layers and dotted suffixes are PEFT's too
    assert shape.lora_params(8, ["self_attn.q_proj", "lm_head"]) == shape.lora_params(8, ["q_proj"])


def test_fused_and_two_matrix_architectures_are_not_sized_as_llama():
    falcon = bundled_shape("falcon-7b")
    assert [lin.name for lin in falcon.linears] == [
        "query_key_value",
        "dense",
        "dense_h_to_4h",
        "dense_4h_to_h",
    ]
    assert falcon.kv_heads == 1 and falcon.norms_per_layer == 1 and falcon.norm_bias
    neox = bundled_shape("pythia-6.9b")
    assert neox.family == "gpt_neox" and all(lin.bias for lin in neox.linears)


def test_config_folder_gives_the_same_shape(tmp_path: Path):
    cfg = {k: v for k, v in bundled_configs()["qwen2.5-7b"].items() if k != "aliases"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = resolve_shape(str(tmp_path))
    assert shape.params == bundled_shape("qwen2.5-7b").params
    assert shape.source.startswith("config")


def test_aliases_and_hub_ids_resolve_offline(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("network used")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    assert resolve_shape("meta-llama/Llama-3.1-8B-Instruct").name == "llama-3.1-8b"
    assert resolve_shape("Qwen/Qwen2.5-72B-Instruct").name == "qwen2.5-72b"
    assert resolve_shape("SMOLLM2-135M").name == "smollm2-135m"
    with pytest.raises(SpecError, match="--online"):
        resolve_shape("some-org/unknown-model")


def hf_cache_entry(hub_cache: Path, repo_id: str, cfg: dict, revision: str = "a" * 40) -> Path:
    """config.json of `repo_id` in a Hugging Face cache, laid out by huggingface_hub's own conventions:
    models--org--name/snapshots/<revision>/config.json, and refs/main naming that revision."""
    from huggingface_hub.file_download import repo_folder_name

    folder = hub_cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    snapshot = folder / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(cfg))
    return snapshot / "config.json"


def test_a_model_in_the_standard_hugging_face_cache_resolves_offline(tmp_path: Path, monkeypatch):
    """Where users keep models: HF_HOME's hub cache, read by huggingface_hub, with nothing online."""
    from huggingface_hub import constants

    cfg = {k: v for k, v in bundled_configs()["mistral-7b"].items() if k != "aliases"}
    hf_cache_entry(tmp_path / "hf" / "hub", "acme/mistral-finetune", cfg)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    shape = resolve_shape("acme/mistral-finetune")
    assert shape.source == "hub (cached)" and shape.params == PUBLISHED["mistral-7b"]
    with pytest.raises(SpecError, match="not in the Hugging Face cache"):
        resolve_shape("acme/other-model")


def test_the_cli_sizes_a_model_from_hf_home_offline(tmp_path: Path):
    """Through the real CLI, in a fresh process: HF_HOME (a tmp folder) and HF_HUB_OFFLINE=1 as a user
    sets them; a qwen3-style config that is in no bundled table is sized from that cache."""
    from helpers import REPO, ftorch

    cfg = {k: v for k, v in bundled_configs()["qwen2.5-7b"].items() if k != "aliases"}
    hf_cache_entry(tmp_path / "hf-home" / "hub", "acme/qwen-private", cfg)
    env = {"HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1", "FTORCH_HOME": str(tmp_path / "f")}
    job = REPO / "examples" / "llama3-8b-qlora.yaml"
    done = ftorch("estimate", str(job), "--json", "--set", "model=acme/qwen-private", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["params"] == bundled_shape("qwen2.5-7b").params
    env["HF_HOME"] = str(tmp_path / "empty")
    done = ftorch("estimate", str(job), "--set", "model=acme/qwen-private", env=env)
    assert done.returncode == 2 and "not in the Hugging Face cache" in done.stderr


def test_online_fetch_goes_into_the_hugging_face_cache(tmp_path: Path, monkeypatch):
    """--online fetches config.json through huggingface_hub (HF_ENDPOINT: a stand-in Hub on 127.0.0.1)
    into the standard cache, where the next resolution finds it without the Hub."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from huggingface_hub import constants

    cfg = {k: v for k, v in bundled_configs()["smollm2-360m"].items() if k != "aliases"}
    body = json.dumps(cfg).encode()
    seen: list[str] = []

    class Hub(BaseHTTPRequestHandler):
        def _head(self) -> None:
            seen.append(f"{self.command} {self.path}")
            if not self.path.startswith("/acme/tiny-lm/resolve/main/config.json"):
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("X-Repo-Commit", "b" * 40)
            self.send_header("ETag", '"cfg-etag"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
            self._head()

        def do_GET(self) -> None:  # noqa: N802
            self._head()
            if self.path.startswith("/acme/tiny-lm/"):
                self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setattr(
            constants,
            "HUGGINGFACE_CO_URL_TEMPLATE",
            constants.ENDPOINT + "/{repo_id}/resolve/{revision}/{filename}",
        )
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        shape = resolve_shape("acme/tiny-lm", online=True)
        assert shape.params == bundled_shape("smollm2-360m").params and shape.source == "hub"
        assert any(
            s.startswith(("HEAD", "GET")) and "/acme/tiny-lm/resolve/main/config.json" in s for s in seen
        )
        assert list((tmp_path / "hub").glob("models--acme--tiny-lm/snapshots/*/config.json"))
        with pytest.raises(SpecError, match="nobody/nothing is gated, private or missing .* HF_TOKEN"):
            resolve_shape("nobody/nothing", online=True)
        server.shutdown()  # the Hub is gone: the cache answers
        server.server_close()
        assert resolve_shape("acme/tiny-lm").source == "hub (cached)"
    finally:
        server.shutdown()
        server.server_close()

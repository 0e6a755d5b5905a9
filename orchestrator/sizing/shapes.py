"""Model shapes: the architecture numbers the estimator and the time model need, without torch.
(Over 400 lines: one parameter-count function per architecture family, each with its real module
names; they are kept side by side so a new family is added next to the ones it resembles.)

A shape comes from a local folder with `config.json`, from the bundled table of popular architectures
(`orchestrator/data/shapes.json`, works offline), from the Hugging Face cache (huggingface_hub's: HF_HOME,
HF_HUB_CACHE), or from the Hub (config only, opt-in with `online=True`, into that cache; HF_TOKEN,
HF_ENDPOINT and HF_HUB_OFFLINE apply: orchestrator/jobfile/models.py). Parameter counts are computed from the architecture per
family with the architecture's real module names (llama, mistral, mixtral, qwen2, gemma, gemma2, phi,
phi3, falcon with its fused query_key_value and 2-matrix MLP, gpt_neox, stablelm);
`tests/orchestrator_tests/sizing/test_shapes.py` checks them against transformers models built on the meta device.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.jobfile.models import cached_config, download_config, looks_like_hub_id

#: families whose layer layout is modelled exactly; other llama-like configs are sized approximately
FAMILIES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "gemma",
    "gemma2",
    "phi",
    "phi3",
    "falcon",
    "gpt_neox",
    "stablelm",
)
#: families whose norms are LayerNorm with a bias (2 x hidden parameters each)
NORM_BIAS = ("phi", "falcon", "gpt_neox", "stablelm")


@dataclass(frozen=True)
class Linear:
    """A group of identical linear maps inside every decoder layer (`per_layer` copies each)."""

    name: str
    d_in: int
    d_out: int
    per_layer: int = 1
    bias: bool = False
    #: adapted by PEFT's 'all-linear' (every projection here; the output layer is never adapted)
    lora: bool = True
    #: fraction of the copies a token passes through (top-k of the experts for MoE, else 1)
    active: float = 1.0
    #: LoRA rank multiplier: PEFT gives fused MoE gate_up tensors rank 2r (the gate's and the up's)
    rank_mult: int = 1

    @property
    def weight_params(self) -> int:
        return self.d_in * self.d_out * self.per_layer

    @property
    def params(self) -> int:
        return self.weight_params + (self.d_out * self.per_layer if self.bias else 0)


#: modules outside the decoder layers that LoRA may adapt too (not counted by the estimate)
OUTSIDE_LAYERS = frozenset({"lm_head", "embed_tokens", "embed_out", "wte", "word_embeddings"})


def _same_module(name: str, target: str) -> bool:
    """PEFT's match of a target_modules entry (the module's name or a dotted suffix of it), either way
    round, since shapes name modules relative to the layer ('experts.down_proj')."""
    return name == target or name.endswith(f".{target}") or target.endswith(f".{name}")


@dataclass(frozen=True)
class ModelShape:
    name: str
    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    experts: int = 0
    experts_per_token: int = 0
    norms_per_layer: int = 2
    #: LayerNorm with a bias (weight + bias per norm) rather than RMSNorm
    norm_bias: bool = False
    #: the output layer has a bias (phi)
    head_bias: bool = False
    max_positions: int = 0
    source: str = "bundled"
    approximate: bool = False
    linears: tuple[Linear, ...] = field(default=(), compare=False)
    #: the config.json mapping it was built from (what `ftorch estimate --trace` builds the model from)
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ---- derived sizes -------------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        """Parameters of the output layer that are not shared with the embedding."""
        return (0 if self.tie_embeddings else self.vocab * self.hidden) + (
            self.vocab if self.head_bias else 0
        )

    @property
    def norm_params(self) -> int:
        return self.hidden * (self.norms_per_layer * self.layers + 1) * (2 if self.norm_bias else 1)

    @property
    def linear_params(self) -> int:
        """Parameters of all projections in the decoder layers (weights and biases, experts included)."""
        return sum(lin.params for lin in self.linears) * self.layers

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (what one FSDP unit gathers)."""
        return sum(lin.params for lin in self.linears) + self.hidden * self.norms_per_layer * (
            2 if self.norm_bias else 1
        )

    @property
    def params(self) -> int:
        return self.embedding_params + self.lm_head_params + self.linear_params + self.norm_params

    @property
    def quantizable_params(self) -> int:
        """What bitsandbytes stores in 4 bit: the decoder projections (not embeddings, head, norms)."""
        return sum(lin.weight_params for lin in self.linears) * self.layers

    @property
    def active_linear_params(self) -> int:
        """Projection weights a token passes through (for FLOPs): top-k experts only for MoE."""
        return int(sum(lin.weight_params * lin.active for lin in self.linears) * self.layers)

    def lora_targets(self, target_modules: str | list[str]) -> list[Linear]:
        """The adapted projections for `lora.target_modules` ('all-linear' or names, matched like PEFT)."""
        candidates = [lin for lin in self.linears if lin.lora]
        if target_modules == "all-linear":
            return candidates
        wanted = set(target_modules)
        chosen = [lin for lin in candidates if any(_same_module(lin.name, t) for t in wanted)]
        unknown = sorted(
            t
            for t in wanted
            if t not in OUTSIDE_LAYERS and not any(_same_module(n.name, t) for n in candidates)
        )
        if unknown and chosen and not self.approximate:  # PEFT would silently adapt fewer layers
            names = ", ".join(lin.name for lin in candidates)
            raise SpecError(
                "lora.target_modules",
                f"{', '.join(unknown)} is not a linear layer of {self.name} ({self.family}); valid: {names}",
            )
        if not chosen:
            names = ", ".join(lin.name for lin in candidates)
            raise SpecError(
                "lora.target_modules",
                f"none of {sorted(wanted)} is a linear layer of {self.name} ({self.family}); valid: {names}",
            )
        return chosen

    def lora_params(self, r: int, target_modules: str | list[str]) -> int:
        """Exact LoRA parameter count: r x (d_in + d_out) per adapted linear map (A and B, no bias)."""
        targets = self.lora_targets(target_modules)
        per_layer = sum(r * lin.rank_mult * (lin.d_in + lin.d_out) * lin.per_layer for lin in targets)
        return per_layer * self.layers

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "source": self.source,
            "params": self.params,
            "embedding_params": self.embedding_params,
            "lm_head_params": self.lm_head_params,
            "linear_params": self.linear_params,
            "hidden": self.hidden,
            "layers": self.layers,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "intermediate": self.intermediate,
            "vocab": self.vocab,
            "experts": self.experts,
            "approximate": self.approximate,
        }


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def shape_from_config(cfg: dict[str, Any], name: str, source: str) -> ModelShape:
    """Build a shape from a Hugging Face `config.json` mapping."""
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM under text_config
        cfg = {
            **cfg["text_config"],
            "model_type": cfg["text_config"].get("model_type", cfg.get("model_type")),
        }
    model_type = str(cfg.get("model_type", "")).lower()
    try:
        hidden = int(_get(cfg, "hidden_size", "n_embd", "d_model"))
        layers = int(_get(cfg, "num_hidden_layers", "n_layer", "num_layers"))
        heads = int(_get(cfg, "num_attention_heads", "n_head"))
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError):
        raise SpecError(
            "model",
            f"{name}: config.json lacks hidden_size/num_hidden_layers/"
            "num_attention_heads/vocab_size; cannot size this model",
        ) from None
    kv_heads = int(_get(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads))
    family = model_type if model_type in FAMILIES else "llama"
    if family == "falcon" and not cfg.get("new_decoder_architecture") and cfg.get("multi_query", True):
        kv_heads = 1
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    inter = int(_get(cfg, "intermediate_size", "ffn_hidden_size", "n_inner", default=4 * hidden))
    default_tie = family in ("gemma", "gemma2", "falcon")
    tie = bool(_get(cfg, "tie_word_embeddings", default=default_tie))
    experts = int(_get(cfg, "num_local_experts", "num_experts", default=0)) if family == "mixtral" else 0
    top_k = int(_get(cfg, "num_experts_per_tok", default=2)) if experts else 0
    linears, norms = _linears(family, cfg, hidden, heads, kv_heads, head_dim, inter, experts, top_k)
    return ModelShape(
        name=name,
        family=family,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=inter,
        vocab=vocab,
        tie_embeddings=tie,
        experts=experts,
        experts_per_token=top_k,
        norms_per_layer=norms,
        norm_bias=family in NORM_BIAS,
        head_bias=family == "phi",
        max_positions=int(_get(cfg, "max_position_embeddings", default=0)),
        source=source,
        approximate=model_type not in FAMILIES,
        linears=linears,
        config={k: v for k, v in cfg.items() if k != "aliases"},
    )


def _linears(
    family: str,
    cfg: dict[str, Any],
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    inter: int,
    experts: int,
    top_k: int,
) -> tuple[tuple[Linear, ...], int]:
    """The projections of one decoder layer, by their module names in transformers, and the norm count."""
    q, kv = heads * head_dim, kv_heads * head_dim
    if family == "falcon":  # fused query_key_value, dense, and a 2-matrix MLP (GELU)
        bias = bool(cfg.get("bias", False))
        new_arch = bool(cfg.get("new_decoder_architecture", False))
        parallel = bool(cfg.get("parallel_attn", True))
        norms = int(cfg.get("num_ln_in_parallel_attn") or 2) if new_arch else (1 if parallel else 2)
        qkv = q + 2 * kv if new_arch or cfg.get("multi_query", True) else 3 * hidden
        return (
            Linear("query_key_value", hidden, qkv, bias=bias),
            Linear("dense", q, hidden, bias=bias),
            Linear("dense_h_to_4h", hidden, inter, bias=bias),
            Linear("dense_4h_to_h", inter, hidden, bias=bias),
        ), norms
    if family == "gpt_neox":  # fused query_key_value with biases, 2-matrix MLP
        return (
            Linear("query_key_value", hidden, 3 * hidden, bias=True),
            Linear("dense", hidden, hidden, bias=True),
            Linear("dense_h_to_4h", hidden, inter, bias=True),
            Linear("dense_4h_to_h", inter, hidden, bias=True),
        ), 2
    if family == "phi":  # separate q/k/v with biases, 'dense' output, fc1/fc2 MLP; one norm (parallel)
        return (
            Linear("q_proj", hidden, q, bias=True),
            Linear("k_proj", hidden, kv, bias=True),
            Linear("v_proj", hidden, kv, bias=True),
            Linear("dense", q, hidden, bias=True),
            Linear("fc1", hidden, inter, bias=True),
            Linear("fc2", inter, hidden, bias=True),
        ), 1
    if family == "phi3":
        return (
            Linear("qkv_proj", hidden, q + 2 * kv),
            Linear("o_proj", q, hidden),
            Linear("gate_up_proj", hidden, 2 * inter),
            Linear("down_proj", inter, hidden),
        ), 2
    qkv_bias = (
        bool(cfg.get("attention_bias", False))
        or family == "qwen2"
        or (family == "stablelm" and bool(cfg.get("use_qkv_bias", False)))
    )
    attn = (
        Linear("q_proj", hidden, q, bias=qkv_bias),
        Linear("k_proj", hidden, kv, bias=qkv_bias),
        Linear("v_proj", hidden, kv, bias=qkv_bias),
        Linear("o_proj", q, hidden, bias=bool(cfg.get("attention_bias", False))),
    )
    if experts:
        # transformers >= 5 fuses the experts into 3-D tensors; PEFT's 'all-linear' adapts them (and
        # the router) with per-expert rank-r factors, which is r x (d_in + d_out) per expert as well
        active = top_k / experts
        mlp: tuple[Linear, ...] = (
            Linear("gate", hidden, experts),
            Linear("experts.gate_up_proj", hidden, 2 * inter, per_layer=experts, active=active, rank_mult=2),
            Linear("experts.down_proj", inter, hidden, per_layer=experts, active=active),
        )
    else:
        mlp_bias = bool(cfg.get("mlp_bias", False))
        mlp = (
            Linear("gate_proj", hidden, inter, bias=mlp_bias),
            Linear("up_proj", hidden, inter, bias=mlp_bias),
            Linear("down_proj", inter, hidden, bias=mlp_bias),
        )
    return attn + mlp, 4 if family == "gemma2" else 2


# ---- the bundled table -------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def bundled_configs() -> dict[str, dict[str, Any]]:
    """name -> HF-style config (with an 'aliases' list) of the bundled architectures."""
    text = resources.files("orchestrator").joinpath("data/shapes.json").read_text(encoding="utf-8")
    return json.loads(text)["shapes"]


def bundled_names() -> list[str]:
    return list(bundled_configs())


def _norm(name: str) -> str:
    return name.strip().lower()


@lru_cache(maxsize=1)
def _alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for name, cfg in bundled_configs().items():
        index[_norm(name)] = name
        for alias in cfg.get("aliases", []):
            index[_norm(alias)] = name
            index[_norm(alias.split("/")[-1])] = name
    return index


def bundled_shape(name: str) -> ModelShape | None:
    key = _alias_index().get(_norm(name))
    if key is None:
        return None
    cfg = {k: v for k, v in bundled_configs()[key].items() if k != "aliases"}
    return shape_from_config(cfg, key, "bundled")


# ---- resolution --------------------------------------------------------------------------------------
def resolve_shape(model: str, *, online: bool = False) -> ModelShape:
    """A local folder (or config.json) first, then the bundled table, the Hugging Face cache, and the Hub
    if online (into that cache)."""
    path = Path(os.path.expanduser(model))
    if path.is_dir() and (path / "config.json").is_file():
        return _from_file(path / "config.json", path.name)
    if path.is_file() and path.name.endswith(".json"):
        return _from_file(path, path.parent.name)
    shape = bundled_shape(model)
    if shape is not None:
        return shape
    if looks_like_hub_id(model):
        cached = cached_config(model)
        if cached is not None:
            return _from_file(cached, model, source="hub (cached)")
        if online:
            return _from_file(download_config(model), model, source="hub")
    examples = ", ".join(bundled_names()[:6])
    hint = (
        "it is not in the Hugging Face cache either (HF_HOME / HF_HUB_CACHE); pass --online to fetch its "
        "config.json from the Hub"
        if looks_like_hub_id(model)
        else ""
    )
    raise SpecError(
        "model",
        f"{model!r} is not a folder with config.json nor a bundled shape (e.g. {examples}, ...)"
        + (f"; {hint}" if hint else ""),
    )


def _from_file(path: Path, name: str, source: str | None = None) -> ModelShape:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError("model", f"cannot read {path}: {exc.__class__.__name__}") from None
    if not isinstance(cfg, dict):
        raise SpecError("model", f"{path} is not a JSON object")
    return shape_from_config(cfg, name, source or f"config {path}")

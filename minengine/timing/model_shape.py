"""Model shapes for the step cost model: the sizes that decide a step's FLOPs and bytes, from any HF config.

The modelled clock times a step as if it ran a *target* model (e.g. Llama-3-8B) while the tokens are computed
by the model actually loaded (the bundled tiny Llama by default). Only these numbers matter for the cost:
layers, hidden size, query / KV heads and head size (attention and the KV cache), the MLP width, the vocabulary
(embedding and LM head) and the bytes per weight. Presets are the published configs (``config.json`` on the
Hugging Face hub) of meta-llama/Meta-Llama-3-8B, Qwen/Qwen2.5-7B, meta-llama/Meta-Llama-3-70B,
meta-llama/Llama-2-7b-hf and meta-llama/Llama-2-70b-hf, the mixtures of experts mistralai/Mixtral-8x7B-v0.1 and
Qwen/Qwen3-30B-A3B, and the bundled model's own config.

A mixture-of-experts shape (``num_experts > 0``) replaces the MLP of its sparse layers with a router
(``hidden x num_experts``) and ``num_experts`` SwiGLU experts of ``expert_intermediate_size`` features, ``top_k``
of them per token: it *holds* every expert (``num_params``) but a token *computes* with k of them
(``num_active_params``). What a step reads depends on how many distinct experts its tokens hit
(``expected_experts_hit``); the step cost model prices that (``minengine.timing.cost_model``). No torch and no
transformers needed: a config is a dict, a ``PretrainedConfig`` or a path to a checkpoint directory /
``config.json``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1,
                "float8_e5m2": 1, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Llama / Qwen2 family: RMSNorm, rotary attention with GQA, gated MLP).

    Attributes:
        name: shown in figure titles ("Llama-3-8B").
        num_layers, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size, vocab_size: as in the
            HF config (``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``...).
        dtype_bytes: bytes per weight and per activation element moved (2 for BF16, 1 for FP8, 4 for FP32).
        kv_dtype_bytes: bytes per KV-cache element; ``None`` = ``dtype_bytes``.
        weight_dtype_bytes: bytes per weight of the decoder layers when only they are quantized (weight-only int8:
            1, while activations, embeddings and the LM head keep ``dtype_bytes``, as minengine's
            ``quantization="int8"`` does); ``None`` = ``dtype_bytes``.
        tie_word_embeddings: the LM head is the embedding matrix (counted once in ``num_params``).
        gated_mlp: SwiGLU (gate, up, down: 3 matrices) rather than 2.
        qkv_bias: q/k/v projections have biases (Qwen2).
        qk_norm: an RMSNorm of ``head_dim`` weights on q and on k (Qwen3, Qwen3-MoE).
        num_experts: experts per sparse layer (Mixtral's ``num_local_experts``, Qwen3-MoE's ``num_experts``); 0 =
            a dense model.
        top_k: experts per token (``num_experts_per_tok``), 1 <= top_k <= num_experts; 0 for a dense model.
        expert_intermediate_size: each expert's SwiGLU width (Mixtral: ``intermediate_size``; Qwen3-MoE:
            ``moe_intermediate_size``); ``None`` = ``intermediate_size``.
        num_sparse_layers: how many layers are sparse (the others have a dense MLP of ``intermediate_size``);
            ``None`` = every layer.

    Raises:
        ValueError: a size that is not a positive integer, ``num_heads`` not a multiple of ``num_kv_heads``,
            MoE fields out of range (each named).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2
    kv_dtype_bytes: int | None = None
    weight_dtype_bytes: int | None = None
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    num_experts: int = 0
    top_k: int = 0
    expert_intermediate_size: int | None = None
    num_sparse_layers: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "vocab_size", "dtype_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"ModelShape.{name} must be a positive integer, got {v!r}")
        for name in ("kv_dtype_bytes", "weight_dtype_bytes"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"ModelShape.{name} must be a positive integer or None, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        self._check_moe()

    def _check_moe(self) -> None:
        for name in ("num_experts", "top_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"ModelShape.{name} must be an integer >= 0, got {v!r}")
        if not self.num_experts:
            if self.top_k or self.expert_intermediate_size is not None or self.num_sparse_layers is not None:
                raise ValueError("ModelShape.top_k, expert_intermediate_size and num_sparse_layers need "
                                 "num_experts > 0")
            return
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"ModelShape.top_k must be between 1 and num_experts ({self.num_experts}), "
                             f"got {self.top_k!r}")
        v = self.expert_intermediate_size
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"ModelShape.expert_intermediate_size must be a positive integer or None, got {v!r}")
        v = self.num_sparse_layers
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= self.num_layers):
            raise ValueError(f"ModelShape.num_sparse_layers must be in [0, num_layers={self.num_layers}] or None, "
                             f"got {v!r}")

    # ---- parameter counts --------------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        """Width of the query projection output: ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (or value) projection output: ``num_kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim

    @property
    def attention_params_per_layer(self) -> int:
        """One layer's attention weights and norms: q, k, v, o (+ q/k/v biases, + q/k norms), two RMSNorms."""
        h = self.hidden_size
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            attn += 2 * self.head_dim
        return attn + 2 * h

    @property
    def params_per_layer(self) -> int:
        """Weights of one dense decoder layer: ``attention_params_per_layer`` plus the MLP."""
        mlp = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        return self.attention_params_per_layer + mlp

    # ---- mixture of experts ---------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        """A mixture of experts: ``num_experts > 0``."""
        return self.num_experts > 0

    @property
    def sparse_layers(self) -> int:
        """Layers whose MLP is a router and experts (0 for a dense model)."""
        if not self.is_moe:
            return 0
        return self.num_layers if self.num_sparse_layers is None else self.num_sparse_layers

    @property
    def expert_width(self) -> int:
        """One expert's SwiGLU width: ``expert_intermediate_size``, else ``intermediate_size``."""
        return self.expert_intermediate_size or self.intermediate_size

    @property
    def params_per_expert(self) -> int:
        """One expert's weights: gate, up (``hidden x width`` each) and down (``width x hidden``)."""
        return 3 * self.hidden_size * self.expert_width

    @property
    def router_params(self) -> int:
        """One sparse layer's router: ``hidden x num_experts``."""
        return self.hidden_size * self.num_experts

    @property
    def num_layer_params(self) -> int:
        """Non-embedding parameters: every layer (dense ones with their MLP, sparse ones with their router and all
        their experts) plus the final norm (the cost model counts only the GEMM weights, ``linear_shapes``, for
        its ``2 x weights x tokens`` FLOPs)."""
        sparse = self.sparse_layers
        experts = self.num_experts * self.params_per_expert
        moe = sparse * (self.router_params + experts + self.attention_params_per_layer)
        return moe + (self.num_layers - sparse) * self.params_per_layer + self.hidden_size

    @property
    def num_active_params(self) -> int:
        """Parameters one token computes with: ``num_params`` less the ``num_experts - top_k`` experts of each
        sparse layer it does not go to (Mixtral-8x7B: 12.9 B of 46.7 B). Equals ``num_params`` when dense."""
        return self.num_params - self.sparse_layers * (self.num_experts - self.top_k) * self.params_per_expert

    def expected_experts_hit(self, num_tokens: int) -> float:
        """Distinct experts ``num_tokens`` tokens reach in one sparse layer, expected under uniform routing:
        ``E (1 - (1 - k / E)^T)`` (each expert is missed by a token with probability ``1 - k / E``). 0 when dense
        or for no tokens; ``top_k`` for one token; tends to ``E`` as tokens grow.

        Raises:
            ValueError: a negative ``num_tokens``.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens!r}")
        if not self.is_moe:
            return 0.0
        e, k = self.num_experts, self.top_k
        return e * (1.0 - (1.0 - k / e) ** num_tokens)

    @property
    def lm_head_params(self) -> int:
        """The LM head matrix, ``vocab_size x hidden_size`` (the embedding itself when tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters: layers, embedding, and the LM head unless tied."""
        embed = self.vocab_size * self.hidden_size
        return self.num_layer_params + embed + (0 if self.tie_word_embeddings else self.lm_head_params)

    @property
    def layer_weight_dtype_bytes(self) -> int:
        """Bytes per decoder-layer weight: ``weight_dtype_bytes``, else ``dtype_bytes``."""
        return self.weight_dtype_bytes if self.weight_dtype_bytes is not None else self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights: the layers at ``layer_weight_dtype_bytes``, embedding and LM head at
        ``dtype_bytes``."""
        return self.num_layer_params * self.layer_weight_dtype_bytes + (self.num_params - self.num_layer_params) \
            * self.dtype_bytes

    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element (hidden states, all-reduce messages): the model's dtype, but at least 2
        (FP8 / int8 weights still compute and reduce activations in 16-bit)."""
        return max(2, self.dtype_bytes)

    def attention_linear_shapes(self, tp: int = 1) -> tuple[tuple[int, int], ...]:
        """The first two of ``linear_shapes``: fused QKV and the output projection (what a sparse layer keeps)."""
        return self.linear_shapes(tp)[:2]

    def expert_linear_shapes(self, tp: int = 1) -> tuple[tuple[int, int], ...]:
        """One expert's ``(K, N)`` matrices on one GPU when ``tp`` shards every expert's width (vLLM's default
        for a MoE under TP): fused gate+up ``(hidden, 2 x width / tp)``, down ``(width / tp, hidden)``."""
        w = self.expert_width // tp
        return ((self.hidden_size, 2 * w), (w, self.hidden_size))

    def linear_shapes(self, tp: int = 1) -> tuple[tuple[int, int], ...]:
        """The ``(K, N)`` weight matrices one GPU multiplies in one decoder layer with ``tp``-way tensor
        parallelism (Megatron-LM split): fused QKV ``(hidden, (q + 2 kv) / tp)``, output ``(q / tp, hidden)``,
        fused gate+up ``(hidden, 2 x intermediate / tp)`` (``intermediate / tp`` without a gate), down
        ``(intermediate / tp, hidden)``. KV heads are replicated when fewer than ``tp``. The step cost model and
        the kernel fit (``minengine.timing.profile_fit``) both count a layer's GEMMs from this list."""
        h = self.hidden_size
        kv_heads = -(-self.num_kv_heads // tp)
        q, kv = self.q_size // tp, kv_heads * self.head_dim
        up = (2 if self.gated_mlp else 1) * self.intermediate_size // tp
        return ((h, q + 2 * kv), (q, h), (h, up), (self.intermediate_size // tp, h))

    def elementwise_bytes_per_token(self, tp: int = 1) -> int:
        """Device-memory bytes one token moves per layer through the non-GEMM kernels the kernel profiles time
        (two RMSNorms: read and write ``hidden`` each; rotary embedding: read and write q and k; SiLU-and-mul:
        read ``2 x intermediate / tp``, write half; one residual add: read two, write one ``hidden``), in
        activation bytes."""
        h = self.hidden_size
        kv_heads = -(-self.num_kv_heads // tp)
        qk = self.q_size // tp + kv_heads * self.head_dim
        mlp = (3 if self.gated_mlp else 2) * self.intermediate_size // tp
        return (7 * h + 2 * qk + mlp) * self.activation_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies over all layers: K and V, ``num_kv_heads x head_dim`` each."""
        kv = self.kv_dtype_bytes if self.kv_dtype_bytes is not None else self.dtype_bytes
        return 2 * self.num_layers * self.kv_size * kv

    def with_(self, **changes) -> ModelShape:
        """A copy with some fields changed (e.g. ``LLAMA_3_8B.with_(dtype_bytes=1)`` for FP8 weights)."""
        return dataclasses.replace(self, **changes)

    # ---- from a Hugging Face config -----------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config, name: str | None = None, dtype_bytes: int | None = None) -> ModelShape:
        """The shape of a Hugging Face Llama / Qwen2 / Qwen3 / Mistral config.

        Args:
            config: a dict, a ``transformers.PretrainedConfig``, or a path to a checkpoint directory or its
                ``config.json``.
            name: the display name (default: the directory name, or the config's ``_name_or_path``).
            dtype_bytes: bytes per weight; default from the config's ``dtype`` / ``torch_dtype``, else 2.

        Raises:
            ValueError: a missing size field (named), or a path without a ``config.json``.
        """
        if isinstance(config, (str, Path)):
            path = Path(config)
            file = path / "config.json" if path.is_dir() else path
            if not file.is_file():
                raise ValueError(f"no config.json at {str(path)!r}")
            default_name = (path if path.is_dir() else path.parent).name
            config = json.loads(file.read_text())
        else:
            default_name = None
        get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
        default_name = default_name or str(get("_name_or_path", "") or "").rstrip("/").split("/")[-1] or "model"

        def need(key: str) -> int:
            v = get(key)
            if v is None:
                raise ValueError(f"the config has no {key!r}")
            return int(v)

        heads = need("num_attention_heads")
        hidden = need("hidden_size")
        kv_heads = get("num_key_value_heads") or heads
        head_dim = get("head_dim") or hidden // heads
        if dtype_bytes is None:
            dtype = get("dtype") or get("torch_dtype")
            dtype_bytes = _DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 2) if dtype is not None else 2
        model_type = str(get("model_type", "") or "")
        qkv_bias = bool(get("attention_bias", False)) or model_type == "qwen2"
        return cls(name=name or default_name, num_layers=need("num_hidden_layers"), hidden_size=hidden,
                   num_heads=heads, num_kv_heads=int(kv_heads), head_dim=int(head_dim),
                   intermediate_size=need("intermediate_size"), vocab_size=need("vocab_size"),
                   dtype_bytes=int(dtype_bytes), tie_word_embeddings=bool(get("tie_word_embeddings", False)),
                   qkv_bias=qkv_bias, qk_norm=model_type in ("qwen3", "qwen3_moe"),
                   **_moe_fields(model_type, get, need))


def _moe_fields(model_type: str, get, need) -> dict:
    """The MoE fields of a ``mixtral`` / ``qwen3_moe`` config (the same reading as ``minengine.models.moe``'s
    ``moe_settings``, without importing torch); ``{}`` for another model type."""
    layers = need("num_hidden_layers")
    if model_type == "mixtral":
        return dict(num_experts=need("num_local_experts"), top_k=need("num_experts_per_tok"))
    if model_type != "qwen3_moe":
        return {}
    step = int(get("decoder_sparse_step", 1) or 1)
    dense = set(get("mlp_only_layers", None) or ())
    sparse = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    # the hub's config.json says num_experts; transformers' to_dict() writes it as num_local_experts (attribute_map)
    experts = get("num_experts") or need("num_local_experts")
    return dict(num_experts=int(experts), top_k=need("num_experts_per_tok"),
                expert_intermediate_size=need("moe_intermediate_size"),
                num_sparse_layers=None if sparse == layers else sparse)


# Published configs (config.json on the Hugging Face hub), BF16.
LLAMA_3_8B = ModelShape("Llama-3-8B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                        intermediate_size=14336, vocab_size=128256)
QWEN_2_5_7B = ModelShape("Qwen2.5-7B", num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4, head_dim=128,
                         intermediate_size=18944, vocab_size=152064, qkv_bias=True)
LLAMA_3_70B = ModelShape("Llama-3-70B", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, head_dim=128,
                         intermediate_size=28672, vocab_size=128256)
# Llama 2 (the models of the Vidur kernel profiles and of many published benchmarks; 7B has no GQA).
LLAMA_2_7B = ModelShape("Llama-2-7B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32, head_dim=128,
                        intermediate_size=11008, vocab_size=32000)
LLAMA_2_70B = ModelShape("Llama-2-70B", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, head_dim=128,
                         intermediate_size=28672, vocab_size=32000)

# Mixtures of experts (published config.json): every layer sparse. Mixtral's experts are intermediate_size wide;
# Qwen3-30B-A3B's 128 experts are 768 wide (its dense intermediate_size, 6144, is used by no layer).
MIXTRAL_8X7B = ModelShape("Mixtral-8x7B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                          intermediate_size=14336, vocab_size=32000, num_experts=8, top_k=2)
QWEN3_30B_A3B = ModelShape("Qwen3-30B-A3B", num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4,
                           head_dim=128, intermediate_size=6144, vocab_size=151936, qk_norm=True, num_experts=128,
                           top_k=8, expert_intermediate_size=768)


def bundled_shape(dtype_bytes: int = 4) -> ModelShape:
    """The bundled tiny Shakespeare Llama, read from its ``config.json``; float32 by default (how the engine
    runs it on the CPU)."""
    from minengine.config import BUNDLED_MODEL  # config imports no torch

    return ModelShape.from_hf_config(BUNDLED_MODEL, name="bundled tiny Llama", dtype_bytes=dtype_bytes)


MODEL_SHAPES: dict[str, ModelShape] = {"llama-3-8b": LLAMA_3_8B, "qwen2.5-7b": QWEN_2_5_7B, "llama-3-70b": LLAMA_3_70B,
                                       "llama-2-7b": LLAMA_2_7B, "llama-2-70b": LLAMA_2_70B,
                                       "mixtral-8x7b": MIXTRAL_8X7B, "qwen3-30b-a3b": QWEN3_30B_A3B}
_ALIASES = {"llama3-8b": "llama-3-8b", "meta-llama-3-8b": "llama-3-8b", "llama-3.1-8b": "llama-3-8b",
            "qwen2.5-7b-instruct": "qwen2.5-7b", "qwen-2.5-7b": "qwen2.5-7b", "llama3-70b": "llama-3-70b",
            "meta-llama-3-70b": "llama-3-70b", "llama-3.1-70b": "llama-3-70b", "llama-3.3-70b": "llama-3-70b",
            "llama2-7b": "llama-2-7b", "llama-2-7b-hf": "llama-2-7b", "llama2-70b": "llama-2-70b",
            "llama-2-70b-hf": "llama-2-70b", "mixtral-8x7b-v0.1": "mixtral-8x7b", "mixtral": "mixtral-8x7b",
            "qwen3-30b-a3b-instruct": "qwen3-30b-a3b"}


def get_model_shape(name: str | ModelShape) -> ModelShape:
    """A preset by name ("llama-3-8b", "qwen2.5-7b", "llama-3-70b", "llama-2-7b", "llama-2-70b", "mixtral-8x7b",
    "qwen3-30b-a3b", "bundled"), a
    path to a checkpoint directory or ``config.json``, or a ``ModelShape`` as is.

    Raises:
        ValueError: neither a preset nor a readable config (the message lists the presets).
    """
    if isinstance(name, ModelShape):
        return name
    if not isinstance(name, str):
        raise ValueError(f"model shape must be a preset name, a config path or a ModelShape, got {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key == "bundled":
        return bundled_shape()
    if key in MODEL_SHAPES:
        return MODEL_SHAPES[key]
    if Path(name).exists():
        return ModelShape.from_hf_config(name)
    raise ValueError(f"unknown model shape {name!r}; presets: {', '.join([*MODEL_SHAPES, 'bundled'])}, "
                     "or a checkpoint directory / config.json")

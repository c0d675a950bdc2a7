"""An FP8 KV cache: K and V stored as float8 e4m3, one scale per layer for K and one for V, dequantized by attention.

``kv_cache_dtype="fp8"`` (vLLM's name; "fp8_e4m3" is the same) makes every layer's K and V cache a
``torch.float8_e4m3fn`` tensor of the usual shape [num_blocks, block_size, Hkv, D]: 1 byte per element, so the same
memory holds 4x the float32 blocks and 2x the bfloat16 ones. A key is written as ``saturate(k / k_scale)`` and read
as ``stored * k_scale`` (values likewise with ``v_scale``); every attention path (the torch reference, the C++ CPU
kernel, the Triton kernel) reads the float8 bytes and dequantizes them in float32, so the model's own dtype is kept
everywhere else.

Format: e4m3 (the OCP FP8 format, Micikevicius et al. 2022, "FP8 Formats for Deep Learning"): 4 exponent bits, 3
mantissa bits, largest value 448, no infinities. Its relative rounding error is at most 2^-4 for every normal
number (|x| >= 2^-6), whatever the scale; values below 2^-6 are subnormal (absolute error at most 2^-10), beyond
448 they saturate (``quantize_kv`` clamps rather than produce NaN).

Scale: per tensor, vLLM's ``k_scale`` / ``v_scale`` of each attention layer (a float, kept on the layer:
``models/llama.py``'s ``Attention.k_scale``). Not per head: for a floating-point format the scale only has to keep
the values between 2^-6 and 448, and heads would need magnitudes 2^15 apart for one scale to fail them. The
default is 1.0, vLLM's when the checkpoint carries no calibrated scales. On the bundled model calibrating buys
nothing measurable: over the 43,350 held-out Tiny Shakespeare tokens |K| <= 9.23 and |V| <= 6.26 (far inside 448)
and 1.1 % of the elements lie below 2^-6; perplexity is 55.968 with scales 1.0, 55.946 with scales calibrated on
the training split as ``amax / 448``, 55.916 with a float32 cache (``benchmarks/quantization.py``,
``benchmarks/results/quantization.md``). A model whose keys exceed 448 (some Qwen2 checkpoints have large key
biases) needs calibrated scales: ``set_kv_scales(model, calibrated_kv_scales(amax))``.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value
# kv_cache_dtype -> the cache's torch dtype (None = the model's dtype). vLLM's "fp8" means e4m3 on CUDA.
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {"auto": None, "fp8": FP8_DTYPE, "fp8_e4m3": FP8_DTYPE}


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of the KV cache tensors for ``EngineConfig.kv_cache_dtype`` ("auto": ``model_dtype``).

    Raises:
        ValueError: a name not in ``KV_CACHE_DTYPES`` (the message lists them).
    """
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {tuple(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    return KV_CACHE_DTYPES[kv_cache_dtype] or model_dtype


def is_fp8(cache: torch.Tensor) -> bool:
    """Whether a KV cache tensor holds float8 e4m3 (then it is read through ``dequantize_kv``)."""
    return cache.dtype == FP8_DTYPE


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x / scale`` as float8 e4m3 (round to nearest even), saturated at +-448. Same shape as ``x``."""
    if scale != 1.0:
        x = x / scale
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Stored float8 elements as ``dtype``: ``x * scale``. Same shape as ``x`` (the conversion is exact: every e4m3
    value is a float32 and a bfloat16)."""
    x = x.to(dtype)
    return x * scale if scale != 1.0 else x


def round_trip(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` as the cache will give it back: quantized to e4m3 and dequantized, in ``x``'s dtype. The torch path
    attends a prefill from position 0 to the step's own K/V rows instead of re-reading the cache; with an FP8 cache
    it must see these values, as the kernels do."""
    return dequantize_kv(quantize_kv(x, scale), scale, x.dtype)


def write_fp8_rows(rows: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor, scale: float) -> None:
    """Quantize ``rows`` [T, Hkv, D] and scatter them into the FP8 ``cache`` [num_blocks, block_size, Hkv, D] at
    ``slot_mapping`` [T] (``block_id * block_size + offset``). Through uint8 views: torch has no ``index_copy_``
    for float8 on the CPU, and a byte copy is the same copy."""
    flat = cache.view(torch.uint8).view(-1, rows.shape[1], rows.shape[2])
    flat.index_copy_(0, slot_mapping, quantize_kv(rows, scale).view(torch.uint8))


def calibrated_kv_scales(amax: list[tuple[float, float]], headroom: float = 1.0) -> list[tuple[float, float]]:
    """Per-layer (k_scale, v_scale) that map each tensor's largest magnitude ``amax`` (measured on calibration
    data) to ``448 / headroom``: ``amax * headroom / 448`` (1.0 for an all-zero tensor).

    Raises:
        ValueError: a negative or non-finite amax, or headroom < 1.
    """
    if not headroom >= 1.0:
        raise ValueError(f"headroom must be >= 1, got {headroom!r}")
    out = []
    for pair in amax:
        if not all(0.0 <= a < float("inf") for a in pair):
            raise ValueError(f"amax must be finite and >= 0, got {pair!r}")
        out.append(tuple(a * headroom / FP8_MAX if a > 0 else 1.0 for a in pair))
    return out


def set_kv_scales(model, scales: list[tuple[float, float]]) -> None:
    """Give each attention layer of ``model`` (``LlamaForCausalLM``) its (k_scale, v_scale), before the first step
    (K/V already in the cache were written with the old scales; CUDA graphs capture the scales at start-up).

    Raises:
        ValueError: not one pair per layer, or a scale that is not a positive finite number.
    """
    layers = model.model.layers
    if len(scales) != len(layers):
        raise ValueError(f"scales: one (k_scale, v_scale) per layer ({len(layers)}), got {len(scales)}")
    for layer, (k, v) in zip(layers, scales):
        for name, s in (("k_scale", k), ("v_scale", v)):
            if not (isinstance(s, (int, float)) and 0 < s < float("inf")):
                raise ValueError(f"{name} must be a positive finite number, got {s!r}")
        layer.self_attn.k_scale, layer.self_attn.v_scale = float(k), float(v)

"""Weight-only int8 (``quantization="int8"``): each linear layer's weight as int8 with one scale per output channel.

A weight W [out, in] is stored as ``qweight = round(W / scale[:, None])`` clamped to [-127, 127] (int8) and
``scale = max_j |W[i, j]| / 127`` (float32, [out]): symmetric "absmax" round-to-nearest quantization per output
channel (LLM.int8(), Dettmers et al. 2022, section 3, without its outlier decomposition; the W8A16 layout of
vLLM's and TensorRT-LLM's weight-only int8). Activations stay in the model's dtype, so a matmul is

    y = x @ W^T ~= (x @ qweight^T) * scale          (a per-output-channel scale factors out of the sum)

The int8 bytes are what a memory-bound decode reads: a quarter of float32, half of bfloat16 (the modelled clock
prices that through ``ModelShape.weight_dtype_bytes``). Embeddings and the LM head stay in the model's dtype (the
bundled model ties them; vLLM's weight-only methods also leave the LM head unquantized by default).

Kernels. ``int8_matmul`` is the readable reference: convert qweight to the activations' dtype, ``mm``, scale the
result. It builds a float copy of the whole weight on every call, so a float32 decode moves more bytes than the
float layer would. ``int8pack_matmul`` is the fast path: torch's ``torch._weight_int8pack_mm(x, qweight, scales)``
(an ATen CPU kernel: int8 weights [out, in] read as it multiplies, one scale per output channel, x and scales of one
dtype), which never materialises float weights. Its vectorised path is bfloat16's; in float32 it is slower than a
float matmul at every size, so float32 activations are cast to bfloat16 for it and its output cast back (the
rounding that adds is below the int8 weights' own error, see ``int8pack_matmul``). ``int8_linear``, what the layers
call, takes the fast path where ``uses_int8pack``: CPU, float32 or bfloat16, at most ``INT8PACK_MAX_ROWS`` rows
(decodes, small chunks), an ``in_features`` that is a multiple of 16; the reference otherwise (prefills, float16,
CUDA). Why those limits (``benchmarks/quantization.py`` measures them, ``benchmarks/results/quantization.md`` has
the numbers): on one thread the packed kernel (float32 through bfloat16) beats dequantize-then-matmul for a few
rows, is about even at 16 and loses beyond, as its per-row cost grows faster; called on float32 directly, or on
float16, it is slower than the reference at every size. It computes wrong sums for an ``in_features`` that is not a
multiple of 16 (24 and 40; 8 gave NaN) or kills the process (12 and 100: segfault). On a layer small enough to stay
in cache the float32 matmul is faster still; int8 pays off where weights stream from memory, as a real-shaped
model's decode does: a quarter of the decoder's bytes. The LM head (float32) and the rest of a step stay as they
are, so a whole decode step gains less than its decoder matmuls (the benchmark's section 6 splits the time).

vLLM's name: vLLM has no method called "int8". The one that computes this scheme is ``"experts_int8"``
(``ExpertsInt8Config``): online (applied at load time to an unquantized checkpoint, no calibration), int8 weights
with one scale per output channel, ``scale = max|W[i, :]| / 127``, round, clamp to [-127, 127], activations not
quantized (W8A16 there; here they keep the model's dtype): the same arithmetic as ``quantize_int8``. So minengine
takes ``quantization="experts_int8"`` as well, as ``"int8"``. What differs is where vLLM applies it: to the experts
of mixture-of-experts layers only, its dense linear layers stay unquantized; minengine's models are dense, so it
quantizes their decoder linear layers. The other candidates fit less: ``"fbgemm_fp8"`` and ``"fp8"`` store float8
weights, not int8; ``"compressed-tensors"`` (W8A16, channel strategy) has this storage layout but loads a checkpoint
quantized beforehand (its ``quantization_config``), which minengine does not read; ``"bitsandbytes"`` 8-bit is
LLM.int8() with its outlier decomposition.

Tensor parallelism: the scales belong to output channels, so ``shard_int8`` cuts a column-parallel layer's
(qweight, scale) along dim 0 together, and a row-parallel layer's qweight along dim 1 with the scales whole; each
rank's ``int8_matmul`` then gives its share (column: its outputs; row: a partial sum to all-reduce, the bias added
once after). Quantize the whole weight first, then shard: quantizing a row-parallel shard alone would give each
rank different scales than the unsharded model has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

QUANTIZATION_METHODS = ("int8", "experts_int8")  # the second: vLLM's name (see above)
INT8PACK_MAX_ROWS = 16  # above this, dequantize-then-matmul is faster (see above)
# Activations the packed kernel takes: bfloat16 as they are, float32 cast to bfloat16 for it (``int8pack_matmul``).
# float16 stays on the reference path: casting it to bfloat16 would drop 3 of its significand bits.
INT8PACK_DTYPES = (torch.float32, torch.bfloat16)
# torch 2.13's CPU kernel seems to step through in_features 16 at a time with no remainder loop: here widths 8, 24
# and 40 gave NaN or wrong sums and 12 and 100 crashed the process (segfault); multiples of 16 were right.
INT8PACK_WIDTH_MULTIPLE = 16
# The decoder's linear layers (nn.Linear children of each DecoderLayer's self_attn and mlp).
QUANTIZED_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_int8(weight: torch.Tensor, amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 quantization of ``weight`` [out, in] (any float dtype). ``amax`` [out]:
    each output channel's absolute maximum to scale by (default: ``weight``'s own; a row-parallel shard passes
    the whole layer's, ``layers/linear.py``, so its scales and int8 values are the unsharded layer's).

    Returns:
        (qweight int8 [out, in] in [-127, 127], scale float32 [out]) with ``qweight * scale[:, None] ~= weight``;
        an all-zero row gets scale 1.0.
    Raises:
        ValueError: ``weight`` not 2-D floating point, or not finite.
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a 2-D float tensor [out, in], got {tuple(weight.shape)} {weight.dtype}")
    w = weight.detach().float()
    if not torch.isfinite(w).all():
        raise ValueError("weight has inf or NaN entries: it cannot be quantized")
    if amax is None:
        amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    qweight = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return qweight, scale


def dequantize_int8(qweight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight [out, in] in ``dtype`` that (qweight int8 [out, in], scale [out]) stand for."""
    return (qweight.to(torch.float32) * scale.to(torch.float32)[:, None]).to(dtype)


def uses_int8pack(x: torch.Tensor) -> bool:
    """Whether ``int8_linear`` takes the packed kernel (``int8pack_matmul``) for input ``x`` [..., in]: CPU,
    float32 or bfloat16, at most ``INT8PACK_MAX_ROWS`` rows (decodes; see the module docstring for the
    measurements), ``in`` a multiple of ``INT8PACK_WIDTH_MULTIPLE`` (the only widths that kernel computes correctly),
    and a torch that has the op."""
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    return (x.device.type == "cpu" and x.dtype in INT8PACK_DTYPES and 0 < rows <= INT8PACK_MAX_ROWS
            and width % INT8PACK_WIDTH_MULTIPLE == 0 and hasattr(torch, "_weight_int8pack_mm"))


def int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (qweight * scale[:, None])^T + bias``: a linear layer with int8 weights, the readable reference
    (dequantize-then-matmul; any device and float dtype, any shape).

    Args:
        x: [..., in] float32 / bfloat16 / float16 activations.
        qweight: [out, in] int8; scale: [out] (any float dtype; float32 from ``quantize_int8``).
        bias: [out] or None (a row-parallel shard passes None and adds the bias after the all-reduce).

    Returns:
        [..., out] in ``x.dtype``, computed as ``(x @ qweight^T) * scale`` with qweight converted to ``x.dtype``
        (the scale applied to the [..., out] result rather than to the [out, in] weight: the same numbers up to
        rounding, fewer multiplies for small batches). The converted weight is a full float copy made on every
        call: this reads and writes more bytes than the float layer would, which ``int8pack_matmul`` avoids.
    """
    y = F.linear(x, qweight.to(x.dtype)) * scale.to(x.dtype)
    return y + bias if bias is not None else y


def int8pack_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """``int8_matmul``'s result from torch's packed CPU kernel, which reads the int8 weight as it multiplies and
    never builds a float copy of it (so a decode reads 1 byte per weight instead of 4 in float32).

    ``torch._weight_int8pack_mm(a, w, s)`` (ATen, CPU) computes ``(a @ w^T) * s`` for int8 ``w`` [out, in] and
    ``a``, ``s`` of one dtype; its vectorised path is the bfloat16 one (in float32 it was slower than a float
    matmul at every size, see the module docstring). So float32 activations are cast to bfloat16 for it and the
    result cast back: the int8 weights are exact in bfloat16 and the kernel sums in float32, so the rounding added is
    that of the activations and of the unscaled sums to bfloat16's 8 significant bits, well below the int8 weights'
    own error (half a step of ``max|W|/127``). The kernel gets unit scales and the float32 ``scale`` multiplies its
    output, so each channel's scale is not also rounded to bfloat16.

    Args:
        x: [..., in] float32 or bfloat16 on CPU, ``uses_int8pack(x)`` (``in`` a multiple of 16: other widths give
            wrong sums or crash the process in this kernel).
        qweight, scale, bias: as ``int8_matmul``.

    Returns:
        [..., out] in ``x.dtype``.
    Raises:
        ValueError: ``x`` is not an input ``uses_int8pack`` accepts.
    """
    if not uses_int8pack(x):
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} on {x.device} is not an input the packed int8 kernel "
                         f"takes (CPU float32/bfloat16, <= {INT8PACK_MAX_ROWS} rows, width a multiple of "
                         f"{INT8PACK_WIDTH_MULTIPLE}): use int8_matmul")
    shape = x.shape
    a = x.reshape(-1, shape[-1]).to(torch.bfloat16).contiguous()
    unit = torch.ones(qweight.shape[0], dtype=torch.bfloat16)
    y = (torch._weight_int8pack_mm(a, qweight, unit) * scale.float()).to(x.dtype)  # bfloat16 * float32 -> float32
    if bias is not None:
        y = y + bias
    return y.view(*shape[:-1], qweight.shape[0])


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """What ``Int8Linear`` (and a row-parallel shard's ``RowParallelInt8Linear``) computes: ``int8pack_matmul``
    where ``uses_int8pack(x)`` (CPU decodes), else the reference ``int8_matmul``. Shapes as ``int8_matmul``."""
    return (int8pack_matmul if uses_int8pack(x) else int8_matmul)(x, qweight, scale, bias)


def shard_int8(qweight: torch.Tensor, scale: torch.Tensor, dim: int, rank: int,
               world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s share of a quantized weight for tensor parallelism (Megatron-LM, Shoeybi et al. 2019).

    Args:
        dim: 0 for a column-parallel layer (output channels split: qweight rows and their scales together),
            1 for a row-parallel one (input features split: qweight columns; every rank keeps all the scales).

    Returns:
        (qweight shard, scale shard), contiguous.
    Raises:
        ValueError: ``dim`` not 0 or 1, the split size not divisible by ``world_size``, ``rank`` out of range.
    """
    if dim not in (0, 1):
        raise ValueError(f"dim must be 0 (column-parallel) or 1 (row-parallel), got {dim!r}")
    if not 0 <= rank < world_size or qweight.shape[dim] % world_size:
        raise ValueError(f"cannot give rank {rank} of {world_size} a share of dim {dim} (size {qweight.shape[dim]})")
    q = qweight.chunk(world_size, dim=dim)[rank].contiguous()
    s = scale.chunk(world_size)[rank].contiguous() if dim == 0 else scale
    return q, s


class Int8Linear(nn.Module):
    """A linear layer with int8 weights: ``int8_linear(x, qweight, scale, bias)`` (torch's packed kernel for CPU
    decodes, dequantize-then-matmul otherwise).

    Buffers: ``qweight`` int8 [out, in], ``scale`` float32 [out], ``bias`` [out] in the activations' dtype or None.
    """

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if qweight.dtype != torch.int8 or qweight.dim() != 2 or scale.shape != (qweight.shape[0],):
            raise ValueError(f"need qweight int8 [out, in] and scale [out], got {qweight.dtype} "
                             f"{tuple(qweight.shape)} and {tuple(scale.shape)}")
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """Quantize an ``nn.Linear`` (its weight per output channel; the bias kept as is)."""
        qweight, scale = quantize_int8(linear.weight)
        bias = linear.bias.detach() if linear.bias is not None else None
        return cls(qweight.to(linear.weight.device), scale.to(linear.weight.device), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.qweight, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def quantize_model(model: nn.Module, method: str = "int8") -> int:
    """Replace, in place, every decoder linear layer (``QUANTIZED_LAYERS`` of each ``model.model.layers[i]``'s
    ``self_attn`` and ``mlp``) by its ``Int8Linear``; embeddings, norms and the LM head are left as they are.
    Called by ``models.loader.load_model(..., quantization="int8")`` after the weights are loaded. A tensor-parallel
    layer (``layers/linear.py``) makes its own replacement (``quantize_int8()``), which keeps its collective.

    Returns:
        the number of layers quantized.
    Raises:
        ValueError: ``method`` not in ``QUANTIZATION_METHODS`` (the message lists them).
    """
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {(None, *QUANTIZATION_METHODS)}, got {method!r}")
    count = 0
    for layer in model.model.layers:
        for block in (layer.self_attn, layer.mlp):
            for name, child in list(block.named_children()):
                if name in QUANTIZED_LAYERS and isinstance(child, nn.Linear):
                    own = getattr(child, "quantize_int8", None)
                    setattr(block, name, own() if own is not None else Int8Linear.from_linear(child))
                    count += 1
    return count

"""Column- and row-parallel linear layers, and the vocabulary-parallel LM head (Megatron-LM tensor parallelism).

Idea: Megatron-LM (Shoeybi et al., 2019, section 3). A linear layer ``Y = X A^T`` with weight ``A [out, in]`` is
split over ``tp`` ranks one of two ways:

- column-parallel: each rank holds a slice of A's rows (output features) and computes its slice of Y from the
  whole X, with no communication. q/k/v (a rank's heads) and the MLP's gate/up (a slice of the intermediate
  features) are column-parallel: the attention of a rank's heads, and SwiGLU's elementwise product, need only
  that rank's slice.
- row-parallel: each rank holds a slice of A's columns (input features), multiplies its slice of X (what the
  column-parallel layer before it produced) and gets a partial sum of the whole Y; one all-reduce adds the
  partial sums. The attention's o_proj and the MLP's down_proj are row-parallel: one all-reduce each per layer.

The LM head is column-parallel over the vocabulary: each rank computes the logits of its slice of the vocabulary
(a tp-th of the largest matmul of a sampling step, and a tp-th of its weights in memory), and one all-gather
gives every rank all the logits (as vLLM's, half the bytes of an all-reduce of a zero-padded ``[rows, vocab]``;
``timing.StepCostModel`` prices the same all-gather). Every rank then runs the same sampler on the same logits.
The embedding stays replicated: a lookup of T rows has no FLOPs to split, and sharding it would cost one more
all-reduce of ``[T, hidden]`` per step.

Each layer loads its shard from the checkpoint's full tensor (``shard_weight``): slices follow the output
features for column-parallel layers (and their biases), the input features for row-parallel ones (whose bias
is added once, after the all-reduce). A weight-only quantized layer (int8 with per-output-channel scales)
shards the same way: its scales follow the output channels, so a column-parallel layer takes its rows' scales
and a row-parallel one keeps all of them. ``quantize_int8()`` (what ``layers/quantization.quantize_model`` calls)
gives each layer's int8 replacement: a column-parallel shard's per-row scales are already the whole layer's (an
``Int8Linear``); a row-parallel shard takes the whole rows' absolute maxima from one all-reduce (max) at load
time, so its int8 values and scales are exactly those of the unsharded int8 layer (``RowParallelInt8Linear``).
At world size 1 the model holds plain ``nn.Linear`` layers (the factories at the end of this file): nothing to split,
no collective, and the default step never enters this file.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minengine.distributed import TensorParallelGroup
from minengine.layers.quantization import Int8Linear, int8_linear, quantize_int8


class ColumnParallelLinear(nn.Linear):
    """``y = x A_r^T + b_r`` for this rank's rows ``A_r`` of the full ``A [out_features, in_features]``.

    Args:
        in_features, out_features: the full (unsharded) layer's sizes.
        bias: the layer has a bias (sharded like the rows).
        tp: the tensor-parallel group; None = world size 1.
        shard: ``(first output feature, number of output features)`` of this rank; None = an even split (rank
            r holds ``out_features / tp`` rows from ``r x out_features / tp``). Attention passes its own for
            K and V heads replicated over ranks.

    Shapes: x [T, in_features] -> [T, rows of this rank], in the weight's dtype.

    Raises:
        ValueError: ``out_features`` not divisible by the world size (with no explicit ``shard``).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallelGroup | None = None,
                 shard: tuple[int, int] | None = None):
        tp = tp or TensorParallelGroup()
        if shard is None:
            if out_features % tp.world_size:
                raise ValueError(f"out_features ({out_features}) must divide by the tensor-parallel size "
                                 f"({tp.world_size})")
            size = out_features // tp.world_size
            shard = (tp.rank * size, size)
        super().__init__(in_features, shard[1], bias=bias)
        self.tp = tp
        self.output_start = shard[0]
        self.full_out_features = out_features

    def shard_weight(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the checkpoint tensor ``name`` ("weight" [out, in] or "bias" [out]): its rows."""
        return full.narrow(0, self.output_start, self.out_features)

    def quantize_int8(self) -> nn.Module:
        """The weight-only int8 layer (``layers/quantization.py``): its rows' per-channel scales are the whole
        layer's, and a column-parallel layer needs no collective."""
        return Int8Linear.from_linear(self)


class RowParallelLinear(nn.Linear):
    """``y = all_reduce(x_r A_r^T) + b``: this rank holds the columns ``A_r`` of the full ``A [out, in]``
    that match its slice ``x_r`` of the input (the output of the column-parallel layer before it).

    Args:
        in_features, out_features: the full layer's sizes; ``in_features`` must divide by the world size.
        bias: the layer has a bias (full on every rank, added once after the all-reduce).
        tp: the tensor-parallel group; None = world size 1.

    Shapes: x [T, in_features / tp] -> [T, out_features], the same on every rank.

    Raises:
        ValueError: ``in_features`` not divisible by the world size.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallelGroup | None = None):
        tp = tp or TensorParallelGroup()
        if in_features % tp.world_size:
            raise ValueError(f"in_features ({in_features}) must divide by the tensor-parallel size ({tp.world_size})")
        super().__init__(in_features // tp.world_size, out_features, bias=bias)
        self.tp = tp
        self.input_start = tp.rank * self.in_features

    def shard_weight(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of the checkpoint tensor ``name``: the weight's columns; the bias whole."""
        return full.narrow(1, self.input_start, self.in_features) if name == "weight" else full

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return F.linear(x, self.weight, self.bias)
        y = self.tp.all_reduce(F.linear(x, self.weight))  # partial sums of the whole output -> the sum
        return y + self.bias if self.bias is not None else y

    def quantize_int8(self) -> nn.Module:
        """The weight-only int8 layer: ``Int8Linear`` at world size 1, else ``RowParallelInt8Linear``."""
        return Int8Linear.from_linear(self) if self.tp.world_size == 1 else RowParallelInt8Linear(self)


class RowParallelInt8Linear(nn.Module):
    """A row-parallel layer with weight-only int8 weights: ``all_reduce(int8_linear(x_r, qweight_r, scale)) + b``.

    ``qweight_r`` [out, in / tp] int8 are this rank's columns of the whole layer's int8 weight and ``scale``
    [out] its per-output-channel scales (from every rank's absolute maxima, one all-reduce of [out] at load
    time), so the partial sums add up to the unsharded int8 layer's.

    Args:
        layer: the loaded ``RowParallelLinear`` shard (tp > 1) to quantize.
    """

    def __init__(self, layer: RowParallelLinear):
        super().__init__()
        self.tp = layer.tp
        weight = layer.weight.detach()
        amax = self.tp.all_reduce_max(weight.float().abs().amax(dim=1))
        qweight, scale = quantize_int8(weight, amax=amax)
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.register_buffer("qweight", qweight.to(weight.device))
        self.register_buffer("scale", scale.to(weight.device))
        self.register_buffer("bias", layer.bias.detach() if layer.bias is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(int8_linear(x, self.qweight, self.scale))
        return y + self.bias if self.bias is not None else y


class VocabParallelLMHead(nn.Linear):
    """The LM head split over the vocabulary: this rank computes the logits of its vocabulary slice
    (``TensorParallelGroup.shard_range``: the vocabulary need not divide by tp), one all-gather assembles all
    (as vLLM's; each slice padded to the largest, since a collective moves equal shapes).

    Args:
        hidden_size, vocab_size: the full head's sizes (no bias).
        tp: the tensor-parallel group; None = world size 1.

    Shapes: hidden [R, hidden_size] -> logits [R, vocab_size], in the weight's dtype, the same on every rank.
    """

    def __init__(self, hidden_size: int, vocab_size: int, tp: TensorParallelGroup | None = None):
        tp = tp or TensorParallelGroup()
        self.vocab_start, vocab_end = tp.shard_range(vocab_size)
        super().__init__(hidden_size, vocab_end - self.vocab_start, bias=False)
        self.tp = tp
        self.vocab_size = vocab_size

    def shard_weight(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows (vocabulary entries) of the checkpoint's ``lm_head.weight`` [vocab, hidden]."""
        return full.narrow(0, self.vocab_start, self.out_features)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = F.linear(hidden, self.weight)
        if self.tp.world_size == 1:
            return local
        tp = self.tp.world_size
        base, extra = divmod(self.vocab_size, tp)
        sizes = [base + (r < extra) for r in range(tp)]  # shard_range's slices
        width = sizes[0]
        if self.out_features < width:
            local = F.pad(local, (0, width - self.out_features))
        parts = self.tp.all_gather(local)
        return torch.cat([part[:, :n] for part, n in zip(parts, sizes)], dim=1)


# ---- what the model builds: plain ``nn.Linear`` at world size 1, the parallel layers otherwise ------------------

def column_parallel_linear(in_features: int, out_features: int, bias: bool, tp: TensorParallelGroup,
                           shard: tuple[int, int] | None = None) -> nn.Linear:
    """A ``ColumnParallelLinear`` for ``tp`` ranks; at world size 1 the whole ``nn.Linear``."""
    if tp.world_size == 1:
        return nn.Linear(in_features, out_features, bias=bias)
    return ColumnParallelLinear(in_features, out_features, bias, tp, shard=shard)


def row_parallel_linear(in_features: int, out_features: int, bias: bool, tp: TensorParallelGroup) -> nn.Linear:
    """A ``RowParallelLinear`` for ``tp`` ranks; at world size 1 the whole ``nn.Linear``."""
    if tp.world_size == 1:
        return nn.Linear(in_features, out_features, bias=bias)
    return RowParallelLinear(in_features, out_features, bias, tp)


def lm_head(hidden_size: int, vocab_size: int, tp: TensorParallelGroup) -> nn.Linear:
    """A ``VocabParallelLMHead`` for ``tp`` ranks; at world size 1 the whole ``nn.Linear`` (no bias)."""
    if tp.world_size == 1:
        return nn.Linear(hidden_size, vocab_size, bias=False)
    return VocabParallelLMHead(hidden_size, vocab_size, tp)

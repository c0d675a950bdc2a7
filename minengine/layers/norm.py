"""RMSNorm (Zhang & Sennrich, 2019), computed in float32 exactly as transformers' LlamaRMSNorm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2) + eps) over the last dimension.

    Args:
        hidden_size: size of the last dimension.
        eps: added to the mean square.
    Shapes: x [..., hidden_size] -> same shape and dtype.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32 and self.weight.dtype == torch.float32:
            # The same arithmetic in one call (bitwise equal to the lines below; tests/worker/test_layers.py).
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

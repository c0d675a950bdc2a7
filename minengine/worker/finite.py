"""Float32 overflow in logits arithmetic, clamped (shared by the temperature and the penalties)."""

from __future__ import annotations

import torch


def finite_overflow(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``y`` (computed elementwise from ``x``) with float32 overflow clamped to the largest finite value where
    ``x`` was finite: a logit divided by a tiny repetition penalty or temperature, or multiplied by a huge
    penalty, would become +-inf, and softmax over +inf is NaN. Where ``x`` is -inf (a masked token) it stays
    -inf (-inf times a penalty that rounds to 0 in float32 would be NaN)."""
    if bool(torch.isfinite(y).all()):  # nothing overflowed (and x had no -inf): y as it is, one pass instead of four
        return y
    big = torch.finfo(y.dtype).max
    return torch.where(torch.isfinite(x), y.clamp(-big, big), x)

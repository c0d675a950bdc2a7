"""Top-k gating: which experts each token goes to, and with what weight.

A router is one linear layer, hidden -> one logit per expert. The architectures differ in how they turn the
logits into the weights of the k experts they keep:

- ``"topk_softmax"`` (Mixtral, Jiang et al. 2024): keep the k largest logits, softmax over those k only. The
  weights of a token sum to 1.
- ``"softmax_topk"`` (Qwen3-MoE, and Qwen2-MoE before it): softmax over all experts, keep the k largest
  probabilities; with ``renormalize`` (the config's ``norm_topk_prob``) divide them by their sum so they add to
  1, without it they keep their share of the whole softmax (they sum to less than 1).

Both keep the same k experts (softmax is monotone, so the k largest logits are the k largest probabilities);
only the weights differ. The weights are computed in float32 whatever the model dtype, as transformers does.
"""

from __future__ import annotations

import torch

ROUTINGS = ("topk_softmax", "softmax_topk")


def route(router_logits: torch.Tensor, top_k: int, routing: str,
          renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's k experts and their gate weights.

    Args:
        router_logits: [T, E], one row per token, one logit per expert (any float dtype).
        top_k: experts per token, 1 <= top_k <= E.
        routing: one of ``ROUTINGS`` (see the module docstring).
        renormalize: ``"softmax_topk"`` only: rescale the kept probabilities to sum to 1.

    Returns:
        (weights [T, top_k] float32, expert ids [T, top_k] int64), each row in descending weight order.
    Raises:
        ValueError: unknown ``routing``, or ``top_k`` outside [1, E].
    """
    num_experts = router_logits.shape[-1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be between 1 and the number of experts ({num_experts}), got {top_k}")
    logits = router_logits.float()
    if routing == "topk_softmax":
        top_logits, ids = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(top_logits, dim=-1), ids
    if routing == "softmax_topk":
        weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids
    raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")

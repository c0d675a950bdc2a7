"""Mixture-of-experts decoders: Mixtral and Qwen3-MoE, on the Llama-family model of ``models/llama.py``.

The attention, norms, rotary embedding and the paged KV cache are the same as a dense model's; only the
feed-forward differs: a decoder layer's MLP is a ``SparseMoeBlock`` (``layers/moe.py``: a router and E experts, k
per token). The architectures differ in what their configs call things and in the gating:

==============  ======================  =========================  ==============================================
architecture    experts, per token      expert size                gate weights (``layers/moe_routing.py``)
==============  ======================  =========================  ==============================================
``mixtral``     ``num_local_experts``,  ``intermediate_size``      softmax over the k largest logits
                ``num_experts_per_tok``
``qwen3_moe``   ``num_experts``,        ``moe_intermediate_size``  softmax over all E, the k largest kept,
                ``num_experts_per_tok``                            rescaled to sum 1 when ``norm_topk_prob``
==============  ======================  =========================  ==============================================

Qwen3-MoE can also keep dense layers: layer i is sparse when i is not in ``mlp_only_layers`` and (i + 1) is a
multiple of ``decoder_sparse_step``; a dense layer's MLP has ``intermediate_size`` features. Neither architecture
has shared experts (an expert every token goes through, as in Qwen2-MoE or DeepSeek-V2/V3), so none is built.
The checkpoints store each expert as three linear layers; ``models/moe_checkpoint.py`` stacks them. Over several
ranks (``expert_parallel``) a sparse layer is an ``ExpertParallelMoeBlock`` (``layers/expert_parallel.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from minengine.distributed import TensorParallelGroup
from minengine.layers.moe import MOE_IMPLEMENTATIONS, SparseMoeBlock
from minengine.models.llama import LlamaForCausalLM
from minengine.models.moe_checkpoint import stack_experts


@dataclass(frozen=True)
class MoeSettings:
    """One MoE architecture's feed-forward, read from its config (``moe_settings``).

    num_experts (E) and top_k (k) per sparse layer; expert_intermediate_size: each expert's I; routing,
    renormalize: as ``layers/moe_routing.route`` takes them; sparse_layers: the indices of the decoder layers
    whose MLP is a ``SparseMoeBlock`` (the others are dense).
    """

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    routing: str
    renormalize: bool
    sparse_layers: frozenset[int]


def _mixtral(cfg) -> MoeSettings:
    return MoeSettings(cfg.num_local_experts, cfg.num_experts_per_tok, cfg.intermediate_size, "topk_softmax", True,
                       frozenset(range(cfg.num_hidden_layers)))


def _qwen3_moe(cfg) -> MoeSettings:
    step = getattr(cfg, "decoder_sparse_step", 1)
    if not isinstance(step, int) or step < 1:
        raise ValueError(f"decoder_sparse_step must be an integer >= 1 (every step-th layer is sparse), got {step!r}")
    dense = set(getattr(cfg, "mlp_only_layers", None) or ())
    sparse = frozenset(i for i in range(cfg.num_hidden_layers) if i not in dense and (i + 1) % step == 0)
    return MoeSettings(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, "softmax_topk",
                       bool(cfg.norm_topk_prob), sparse)


MOE_ARCHITECTURES = {"mixtral": _mixtral, "qwen3_moe": _qwen3_moe}


def moe_settings(cfg) -> MoeSettings:
    """The ``MoeSettings`` of a ``mixtral`` or ``qwen3_moe`` transformers config.

    Raises:
        ValueError: another ``model_type``; an activation other than SiLU (the experts are SwiGLU); fewer than
            one expert, ``num_experts_per_tok`` outside [1, experts], a ``decoder_sparse_step`` below 1; each
            naming the config field.
    """
    read = MOE_ARCHITECTURES.get(getattr(cfg, "model_type", None))
    if read is None:
        raise ValueError(f"model_type {getattr(cfg, 'model_type', None)!r} is not a MoE architecture minengine "
                         f"runs ({sorted(MOE_ARCHITECTURES)})")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg.hidden_act!r}: minengine's experts are SwiGLU (hidden_act 'silu')")
    settings = read(cfg)
    if settings.num_experts < 1:
        raise ValueError(f"the number of experts must be at least 1, got {settings.num_experts}")
    if not 1 <= settings.top_k <= settings.num_experts:
        raise ValueError(f"num_experts_per_tok must be between 1 and the number of experts "
                         f"({settings.num_experts}), got {settings.top_k}")
    return settings


class MoeForCausalLM(LlamaForCausalLM):
    """A Mixtral or Qwen3-MoE causal LM on a paged KV cache: ``LlamaForCausalLM`` whose sparse layers' MLP is a
    ``SparseMoeBlock``. Arguments as ``LlamaForCausalLM``'s, plus ``expert_parallel``: with a ``tp`` group of more
    than one rank, attention and dense MLPs are tensor-parallel and each sparse layer is an
    ``ExpertParallelMoeBlock`` holding this rank's E / N experts (``layers/expert_parallel.py``). A group of more
    than one rank needs ``expert_parallel`` (the experts' own weights are not split tensor-parallel).

    Raises:
        ValueError: a config ``moe_settings`` rejects; a group of more than one rank without ``expert_parallel``,
            or with E not divisible by its size.
    """

    # A CUDA graph replays fixed launches, but each MoE layer sizes its experts' runs from the step's routing
    # (counted on the host, ``layers/moe.py``): the runner runs its decode steps eagerly.
    supports_cuda_graphs = False

    def __init__(self, hf_config, qkv_bias: bool = False, qk_norm: bool = False,
                 tp: TensorParallelGroup | None = None, expert_parallel: bool = False):
        if tp is not None and tp.world_size > 1 and not expert_parallel:
            raise ValueError("tensor_parallel_size > 1 on a mixture-of-experts model needs "
                             "enable_expert_parallel=True (minengine splits the experts across ranks, it does not "
                             "shard each expert's weights)")
        moe = moe_settings(hf_config)
        # Built dense, then each sparse layer's MLP replaced: the loader builds on the meta device, where the
        # dense MLPs cost nothing, and the default model keeps no hook for a MoE model.
        super().__init__(hf_config, qkv_bias, qk_norm, tp)
        sizes = (hf_config.hidden_size, moe.expert_intermediate_size, moe.num_experts, moe.top_k, moe.routing,
                 moe.renormalize)
        for index in moe.sparse_layers:  # Qwen3-MoE's other layers keep the dense MLP (``intermediate_size``)
            self.model.layers[index].mlp = self.moe_block(sizes)

    def moe_block(self, sizes: tuple) -> nn.Module:
        """A sparse layer's feed-forward: all E experts, or with a group of more than one rank its E / N."""
        if self.tp.world_size == 1:
            return SparseMoeBlock(*sizes)
        from minengine.layers.expert_parallel import ExpertParallelMoeBlock

        return ExpertParallelMoeBlock(*sizes, self.tp)


def set_moe_implementation(model, name: str) -> int:
    """Make every ``SparseMoeBlock`` of ``model`` run ``name`` ("reference" or "grouped", ``layers/moe.py``'s
    ``MOE_IMPLEMENTATIONS``); returns how many blocks were set.

    Raises:
        ValueError: an unknown ``name`` (the message lists the known ones).
    """
    if name not in MOE_IMPLEMENTATIONS:
        raise ValueError(f"MoE implementation must be one of {sorted(MOE_IMPLEMENTATIONS)}, got {name!r}")
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    for block in blocks:
        block.implementation = name
    return len(blocks)


def checkpoint_to_model(state: dict, hf_config) -> dict:
    """A Mixtral / Qwen3-MoE checkpoint's tensors under ``MoeForCausalLM``'s names: each layer's experts
    stacked (``models/moe_checkpoint.stack_experts``). Raises ``ValueError`` as ``stack_experts`` does."""
    return stack_experts(state, moe_settings(hf_config).num_experts)

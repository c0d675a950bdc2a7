"""A token-free engine: the real ``LLMEngine`` (scheduler, KV cache manager, metrics, traces) on a stand-in for the
model that computes nothing and returns a token for every request that samples.

Serving experiments with traces need no tokens: a trace gives lengths, ``ignore_eos=True`` with ``max_tokens`` =
the output length makes every request generate exactly that many, and a ``ModelledClock`` times each step from
what it schedules (``minengine.timing.StepCostModel``). What is left of a model is its sizes: the vocabulary (to
validate prompt ids), the context length and the KV bytes per token (to size the KV pool). So the engine built
here IS the engine: ``LLMEngine(config, clock, runner=TokenFreeRunner(shape))``; only the forward pass is gone.
Vidur (Agrawal et al., MLSys 2024) simulates serving with a separate re-implementation of the scheduler; here
every scheduling policy, preemption mode and prefix-cache rule of ``minengine.core`` runs unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from minengine.config import EngineConfig
from minengine.core.scheduler_output import SchedulerOutput
from minengine.engine.llm_engine import LLMEngine
from minengine.timing.clocks import Clock, ModelledClock
from minengine.timing.model_shape import ModelShape, get_model_shape

# Llama-3.1's context (128k tokens): long enough for every request of the Azure and Mooncake traces but the few
# longest Mooncake prompts (which the fleet clips, and counts).
DEFAULT_MAX_POSITION_EMBEDDINGS = 131_072
STAND_IN_TOKEN = 0  # what the stand-in "samples"; with ignore_eos nothing depends on its value


@dataclass(frozen=True)
class TokenFreeModelConfig:
    """The model sizes the engine reads where it would read the Hugging Face config (``engine.hf_config``).

    Attributes:
        vocab_size: prompt token ids must be in ``[0, vocab_size)``.
        max_position_embeddings: the longest request (tokens); the default ``max_model_len``.
        eos_token_id: None: a stand-in never stops on its own (requests end by ``max_tokens``).
    """

    vocab_size: int
    max_position_embeddings: int = DEFAULT_MAX_POSITION_EMBEDDINGS
    eos_token_id: int | None = None


class TokenFreeRunner:
    """Stand-in for ``ModelRunner``: ``execute`` returns ``STAND_IN_TOKEN`` for every scheduled request that
    samples, and touches no tensor. Swaps are bookkeeping only (a modelled clock costs them over PCIe).

    Args:
        shape: the model shape (a ``ModelShape`` or preset name): vocabulary and KV bytes per token.
        max_position_embeddings: the context length, tokens.
        tp: tensor-parallel degree: the KV of one token is split over ``tp`` GPUs, so one block of the replica's
            pool (all its GPUs together) holds ``block_size x shape.kv_bytes_per_token`` bytes, ``1 / tp`` per GPU.

    Raises:
        ValueError: an unknown shape, a context length or ``tp`` that is not a positive integer.
    """

    last_swap_time_s = 0.0  # seconds of real copying (the engine's trace field); none here

    def __init__(self, shape: ModelShape | str, max_position_embeddings: int = DEFAULT_MAX_POSITION_EMBEDDINGS,
                 tp: int = 1):
        self.last_logprobs: dict = {}  # no logits, so no logprobs (the engine reads these after every step)
        self.last_prompt_logprobs: dict = {}
        for name, v in (("max_position_embeddings", max_position_embeddings), ("tp", tp)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.shape = get_model_shape(shape)
        self.tp = tp
        self.model_config = TokenFreeModelConfig(self.shape.vocab_size, max_position_embeddings)

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes of one KV block over all layers and all ``tp`` GPUs: ``block_size x kv_bytes_per_token``."""
        return block_size * self.shape.kv_bytes_per_token

    def execute(self, scheduler_output: SchedulerOutput) -> dict[str, list[int]]:
        """{request_id: [STAND_IN_TOKEN]} for every scheduled request whose step samples (``ModelRunner``'s
        contract: the tokens each one gets; a speculative decode gets no accepted proposal here)."""
        return {s.request_id: [STAND_IN_TOKEN] for s in scheduler_output.scheduled if s.sample}


def token_free_engine(config: EngineConfig, shape: ModelShape | str, clock: Clock | None = None, *,
                      hardware: str = "h100", tp: int = 1,
                      max_position_embeddings: int = DEFAULT_MAX_POSITION_EMBEDDINGS) -> LLMEngine:
    """An ``LLMEngine`` on a ``TokenFreeRunner`` for ``shape``, timed by ``clock`` (default: a fresh
    ``ModelledClock`` of ``hardware``, ``shape``, ``tp`` and ``config.block_size``).

    Raises:
        ValueError: as ``LLMEngine`` and ``TokenFreeRunner``.
    """
    from minengine.timing.cost_model import StepCostModel

    runner = TokenFreeRunner(shape, max_position_embeddings, tp)
    if clock is None:
        clock = ModelledClock(StepCostModel(hardware, runner.shape, tp=tp, block_size=config.block_size))
    return LLMEngine(config, clock=clock, runner=runner)

"""Doors: the scheduler's optional features, opened once at construction.

The default ``Scheduler`` and ``StepBuilder`` hold the default step only. Each optional feature is a mixin in
its own file that overrides one or two named methods of those classes and calls ``super()`` for the rest:

===========================  =======================================  ===============================================
feature (what opens it)      scheduler mixin                          step-builder mixin (methods overridden)
===========================  =======================================  ===============================================
async scheduling             ``AsyncScheduling``                      ``AsyncSteps`` (run, first_chunk, known_end,
(``async_scheduling``)       (open_step, commit_*, rollback)          scheduled_request)
swap preemption              ``SwapScheduling``                       ``SwapPreemption`` (evict, first_chunk)
(``preemption_mode="swap"``)
speculative decoding         ``SpeculativeScheduling``                ``Speculation`` (run, known_end,
(``speculative_config``)     (commit_sampled)                         scheduled_request)
predicted lengths (a policy  ``PredictedLengths`` (add_request)       ``PredictedAdmission`` (first_chunk, admit_next)
that needs them, a predictor
or ``reserve_predicted_kv``)
two KV cache groups (a       (none)                                   ``KVCacheGroupSteps`` (build)
``HybridKVCacheManager``)
===========================  =======================================  ===============================================

Structured outputs open theirs with the first constrained request (``core/structured_commit.py``).
``make_scheduler`` composes the classes the configuration asks for, so a default engine's scheduler is exactly
``Scheduler`` with ``StepBuilder``.
"""

from __future__ import annotations

from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.policies import PolicySettings, SchedulingPolicy, make_policy
from minengine.core.scheduler import Scheduler
from minengine.core.scheduler_config import SchedulerConfig
from minengine.core.step_builder import StepBuilder


def compose(base: type, mixins: list[type], name: str) -> type:
    """``base`` with ``mixins`` in front (the first mixin's methods win), or ``base`` itself without any."""
    return type(name, (*mixins, base), {}) if mixins else base


def make_scheduler(kv_cache_manager: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int,
                   max_model_len: int, enable_chunked_prefill: bool = True, long_prefill_token_threshold: int = 0,
                   *, policy: SchedulingPolicy | str = "decode-first", policy_settings: PolicySettings | None = None,
                   preemption_mode: str = "recompute", swap_space_blocks: int = 0,
                   shrink_prefill_chunks: bool = False, speculative_config=None, predictor=None,
                   reserve_predicted_kv: bool = False, async_scheduling: bool = False) -> Scheduler:
    """A ``Scheduler`` with the doors these settings open (``SchedulerConfig`` documents the limits).

    Args:
        policy: a ``SchedulingPolicy`` or a name in ``POLICIES`` (built with ``policy_settings``).
        speculative_config: prompt-lookup speculative decoding (a ``SpeculativeConfig``, a dict with vLLM's
            keys, or None = off).
        predictor: an ``OutputLengthPredictor`` (``core/predictors.py``) that sets each added request's
            ``predicted_output_len``; a policy that needs one without it predicts ``max_tokens``.

    Raises:
        ValueError: unknown policy or preemption mode, negative swap space, a bad ``speculative_config``,
            ``async_scheduling`` with speculative decoding.
    """
    config = SchedulerConfig(max_num_batched_tokens, max_num_seqs, max_model_len, enable_chunked_prefill,
                             long_prefill_token_threshold, preemption_mode,
                             swap_space_blocks if preemption_mode == "swap" else 0, shrink_prefill_chunks,
                             reserve_predicted_kv, async_scheduling)
    policy = make_policy(policy, policy_settings) if isinstance(policy, str) else policy
    return build_scheduler(kv_cache_manager, config, policy, speculative_config, predictor)


def scheduler_for_engine(config, kv_cache_manager: KVCacheManager, num_swap_blocks: int,
                         schedules_ahead: bool = False) -> Scheduler:
    """The scheduler an ``EngineConfig`` asks for, over ``kv_cache_manager`` (``LLMEngine`` builds it once).

    Args:
        num_swap_blocks: the host swap pool's size in blocks (0 without swap preemption).
        schedules_ahead: the engine schedules step N+1 before step N's tokens are known (async scheduling).
    """
    settings = PolicySettings(prefill_decode_ratio=config.prefill_decode_ratio,
                              splitfuse_target_tokens=config.splitfuse_target_tokens,
                              priority_aging_steps=config.priority_aging_steps,
                              predicted_length_aging_steps=config.predicted_length_aging_steps)
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
        max_model_len=config.max_model_len, enable_chunked_prefill=config.enable_chunked_prefill,
        long_prefill_token_threshold=config.long_prefill_token_threshold, preemption_mode=config.preemption_mode,
        swap_space_blocks=num_swap_blocks, shrink_prefill_chunks=config.shrink_prefill_chunks,
        reserve_predicted_kv=config.reserve_predicted_kv, async_scheduling=schedules_ahead)
    return build_scheduler(kv_cache_manager, scheduler_config, make_policy(config.scheduling_policy, settings),
                           config.speculative_config, config.output_length_predictor)


def kv_cache_group_steps(kv_cache_manager: KVCacheManager) -> list[type]:
    """The step-builder door of a manager with two KV cache groups (``core/hybrid_kv_cache_manager.py``): each
    step carries the second group's block tables too. Empty for one group."""
    from minengine.core.hybrid_kv_cache_manager import HybridKVCacheManager, KVCacheGroupSteps

    return [KVCacheGroupSteps] if isinstance(kv_cache_manager, HybridKVCacheManager) else []


def build_scheduler(kv_cache_manager: KVCacheManager, config: SchedulerConfig, policy: SchedulingPolicy,
                    speculative_config=None, predictor=None) -> Scheduler:
    """The scheduler class composed from the doors ``config`` (and the other arguments) open, constructed."""
    from minengine.core.spec_decode import SpeculativeConfig

    speculative_config = SpeculativeConfig.from_any(speculative_config)
    if config.async_scheduling and speculative_config is not None:
        raise ValueError("async_scheduling does not support speculative decoding")
    doors = []  # (scheduler mixin, step-builder mixin), outermost first
    if config.async_scheduling:
        from minengine.core.async_scheduler import AsyncScheduling, AsyncSteps
        doors.append((AsyncScheduling, AsyncSteps))
    if speculative_config is not None:
        from minengine.core.spec_scheduling import Speculation, SpeculativeScheduling
        doors.append((SpeculativeScheduling, Speculation))
    if config.preemption_mode == "swap":
        from minengine.core.swap_preemption import SwapPreemption, SwapScheduling
        doors.append((SwapScheduling, SwapPreemption))
    if predictor is not None or policy.needs_predictor or config.reserve_predicted_kv:
        from minengine.core.predicted_admission import PredictedAdmission, PredictedLengths
        doors.append((PredictedLengths, PredictedAdmission))
    names = "".join(s.__name__ for s, _ in doors)
    scheduler_class = compose(Scheduler, [s for s, _ in doors], f"Scheduler[{names}]")
    scheduler = scheduler_class(kv_cache_manager, config, policy)
    builders = [b for _, b in doors] + kv_cache_group_steps(kv_cache_manager)
    scheduler.step_builder_class = compose(StepBuilder, builders, f"StepBuilder[{names}]")
    for door, _ in doors:
        door.open_door(scheduler, speculative_config=speculative_config, predictor=predictor)
    return scheduler

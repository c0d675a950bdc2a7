"""The dashboard's workload presets, engine-agnostic: (a) the textbook head-of-line blocking case, (b) chat
with a shared system prompt, (c) memory pressure, (d) a replay of a real trace, (e) custom, (f) speculative
decoding (prompts that repeat themselves, so prompt lookup proposes tokens the model accepts). Each builder
returns a ``Workload``; ``PRESET_ENGINE_DEFAULTS`` suggests engine settings under which the preset shows its
point. Prompt token ids are synthetic (deterministic, seeded): what matters to the scheduler is their count
and, for prefix caching, which of them are equal.

Sizes are scaled to run in seconds on a 2-core CPU with the bundled tiny model; the scale is in
``Workload.scale_note`` and the page shows it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from minengine.viz.workload import Workload, WorkloadRequest

BUNDLED_VOCAB_SIZE = 2048  # the bundled tiny Shakespeare model's vocabulary (minengine/assets)
TEXTBOOK_LONG_PROMPT = 8000  # tokens of the long prompt in the textbook example
PRESETS = ("a", "b", "c", "d", "e", "f")

# Engine settings each preset is meant for (the page starts its controls from these). Every preset runs
# ``scheduling_policy`` "decode-first" and no speculation (``num_speculative_tokens`` 0) unless it says otherwise.
PRESET_ENGINE_DEFAULTS: dict[str, dict] = {
    "a": {"max_num_batched_tokens": 256, "num_kv_blocks": 640, "block_size": 16, "max_num_seqs": 16,
          "enable_chunked_prefill": True, "enable_prefix_caching": True, "long_prefill_token_threshold": 0},
    "b": {"max_num_batched_tokens": 256, "num_kv_blocks": 128, "block_size": 16, "max_num_seqs": 16,
          "enable_chunked_prefill": True, "enable_prefix_caching": True, "long_prefill_token_threshold": 0},
    "c": {"max_num_batched_tokens": 256, "num_kv_blocks": 24, "block_size": 16, "max_num_seqs": 8,
          "enable_chunked_prefill": True, "enable_prefix_caching": False, "long_prefill_token_threshold": 0},
    "d": {"max_num_batched_tokens": 256, "num_kv_blocks": 256, "block_size": 16, "max_num_seqs": 16,
          "enable_chunked_prefill": True, "enable_prefix_caching": True, "long_prefill_token_threshold": 0},
    "e": {"max_num_batched_tokens": 256, "num_kv_blocks": 256, "block_size": 16, "max_num_seqs": 16,
          "enable_chunked_prefill": True, "enable_prefix_caching": True, "long_prefill_token_threshold": 0},
    "f": {"max_num_batched_tokens": 256, "num_kv_blocks": 256, "block_size": 16, "max_num_seqs": 16,
          "enable_chunked_prefill": True, "enable_prefix_caching": True, "long_prefill_token_threshold": 0,
          "num_speculative_tokens": 4},
}


@dataclass(frozen=True)
class Comparison:
    """An A/B comparison of the dashboard: the same workload with ``DashboardConfig.<field>`` = ``a`` (run A) and
    = ``b`` (run B), every other setting as the sidebar has it. ``name`` keys its label ("ab_<name>_a", "_b")."""

    name: str
    field: str
    a: object
    b: object

    def configs(self, config):
        """(config A, config B): ``config`` with the field set to ``a`` and to ``b``."""
        return replace(config, **{self.field: self.a}), replace(config, **{self.field: self.b})


# Every comparison the A/B tab offers; each preset opens on the one that shows its lesson (PRESET_COMPARISON).
# What each moves on its preset (default settings, modelled H100 / Llama-3-8B clock) is checked by
# tests/viz/test_presets.py as relations (A below or above B), never as modelled times.
COMPARISONS: dict[str, Comparison] = {c.name: c for c in (
    Comparison("chunked_prefill", "enable_chunked_prefill", True, False),  # (a): the decodes' P99 TBT
    Comparison("prefix_caching", "enable_prefix_caching", True, False),  # (b): TTFT, fewer tokens computed
    Comparison("preemption_mode", "preemption_mode", "recompute", "swap"),  # (c): tokens recomputed vs blocks copied
    Comparison("max_num_seqs", "max_num_seqs", 16, 4),  # (d): sequence slots: queueing (TTFT), throughput
    Comparison("token_budget", "max_num_batched_tokens", 256, 64),  # (e): TTFT down, TBT up with the budget
    Comparison("speculation", "num_speculative_tokens", 4, 0),  # (f): steps and TPOT
)}
PRESET_COMPARISON = {"a": "chunked_prefill", "b": "prefix_caching", "c": "preemption_mode", "d": "max_num_seqs",
                     "e": "token_budget", "f": "speculation"}
TRACE_SPEEDUPS = (1, 8, 32, 64, 128, 256, 512)  # preset (d): arrival times divided by this
TRACE_SPEEDUP = 128  # the default: 40 requests of the Azure trace (24 s recorded) in 0.19 s; on the default clock
# (H100, Llama-3-8B shapes) all 16 sequence slots fill and up to 14 requests wait; at 1x at most 2 ran at once
# (checked 2026-12-02).


def _ids(rng: random.Random, n: int, vocab_size: int) -> tuple[int, ...]:
    # Skip ids 0-2 (the bundled tokenizer's special tokens) so prompts look like text to the model.
    return tuple(rng.randrange(3, vocab_size) for _ in range(n))


def _positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def textbook_long_prompt(long_prompt_scale: float = 0.25, num_decoding: int = 10, decode_prompt_len: int = 32,
                         decode_output_len: int = 64, long_output_len: int = 8, arrival_step: int = 4,
                         vocab_size: int = BUNDLED_VOCAB_SIZE, seed: int = 0) -> Workload:
    """Preset (a): ``num_decoding`` short requests are decoding when one long prompt (8,000 tokens x
    ``long_prompt_scale``) arrives, right before step ``arrival_step``. Without chunked prefill that prompt
    takes one huge step and every decode stalls (head-of-line blocking); with it, the prompt is split into
    chunks under the token budget (Sarathi-Serve, Agrawal et al., OSDI 2024, figure 1).

    Raises:
        ValueError: a non-positive size or a scale outside (0, 1].
    """
    if not 0 < long_prompt_scale <= 1:
        raise ValueError(f"long_prompt_scale must be in (0, 1], got {long_prompt_scale!r}")
    for name, v in (("num_decoding", num_decoding), ("decode_prompt_len", decode_prompt_len),
                    ("decode_output_len", decode_output_len), ("long_output_len", long_output_len)):
        _positive(name, v)
    rng = random.Random(seed)
    long_len = max(1, round(TEXTBOOK_LONG_PROMPT * long_prompt_scale))
    reqs = [WorkloadRequest(f"r{i}", _ids(rng, decode_prompt_len, vocab_size), decode_output_len)
            for i in range(num_decoding)]
    reqs.append(WorkloadRequest(f"r{num_decoding}", _ids(rng, long_len, vocab_size), long_output_len,
                                arrival_step=arrival_step))
    return Workload("a", tuple(reqs), ("scale_note_a", (("scale", long_prompt_scale), ("tokens", long_len))))


def shared_system_prompt(num_requests: int = 8, system_prompt_len: int = 256, user_len_range=(16, 48),
                         output_len: int = 16, arrival_every_steps: int = 2, vocab_size: int = BUNDLED_VOCAB_SIZE,
                         seed: int = 0) -> Workload:
    """Preset (b): chat requests that all start with the same ``system_prompt_len``-token system prompt,
    then a different user turn; request i arrives right before engine step ``i * arrival_every_steps``.

    Arrivals are counted in steps, not seconds, so the sharing is a property of the workload, not of the
    machine or the clock: each request runs for at least ``output_len`` steps (one token per step), so while
    ``arrival_every_steps < output_len`` every new request arrives while the previous one still holds the
    system prompt's full blocks, hits them in the prefix cache, and they are shared (ref count > 1). With
    arrivals in seconds a fast machine (or a modelled GPU) finished each request before the next came.

    Raises:
        ValueError: non-positive sizes, a bad range, or ``arrival_every_steps >= output_len`` (the requests
            would not overlap).
    """
    for name, v in (("num_requests", num_requests), ("system_prompt_len", system_prompt_len),
                    ("output_len", output_len), ("arrival_every_steps", arrival_every_steps)):
        _positive(name, v)
    lo, hi = user_len_range
    if not 1 <= lo <= hi:
        raise ValueError(f"user_len_range must be (lo, hi) with 1 <= lo <= hi, got {user_len_range!r}")
    if arrival_every_steps >= output_len:
        raise ValueError(f"arrival_every_steps ({arrival_every_steps}) must be < output_len ({output_len} tokens, "
                         "one step each) so that each request arrives while the previous one runs")
    rng = random.Random(seed)
    system = _ids(rng, system_prompt_len, vocab_size)
    reqs = tuple(WorkloadRequest(f"r{i}", system + _ids(rng, rng.randint(lo, hi), vocab_size), output_len,
                                 arrival_step=i * arrival_every_steps) for i in range(num_requests))
    return Workload("b", reqs)


def memory_pressure(num_requests: int = 8, prompt_len: int = 48, output_len: int = 64,
                    vocab_size: int = BUNDLED_VOCAB_SIZE, seed: int = 0) -> Workload:
    """Preset (c): ``num_requests`` requests at once, each growing to ``prompt_len + output_len`` tokens;
    with a small KV pool (``PRESET_ENGINE_DEFAULTS["c"]``: 24 blocks of 16 tokens for 8 x 112 tokens) the
    decodes run out of blocks and the scheduler preempts the most recently admitted request (recompute).

    Raises:
        ValueError: non-positive sizes.
    """
    for name, v in (("num_requests", num_requests), ("prompt_len", prompt_len), ("output_len", output_len)):
        _positive(name, v)
    rng = random.Random(seed)
    return Workload("c", tuple(WorkloadRequest(f"r{i}", _ids(rng, prompt_len, vocab_size), output_len)
                               for i in range(num_requests)))


def from_trace(trace: Sequence, length_scale: float, vocab_size: int = BUNDLED_VOCAB_SIZE, seed: int = 0,
               name: str = "d", speedup: float = 1.0) -> Workload:
    """Preset (d): a trace (``minengine.workloads.TraceRequest``-like: ``arrival_time``, ``prompt_len``,
    ``output_len``, ``prompt_token_ids``, ``request_id``) as a workload, its arrival times (s) divided by
    ``speedup`` (as ``bench-serve --speedup``: the same pattern, ``speedup`` times the rate; a real trace's
    rate leaves a modelled GPU idle); prompts without ids get seeded synthetic ids (the Azure trace has no
    text). ``length_scale`` is only recorded for the scale note: the trace's lengths are taken as already scaled.

    Raises:
        ValueError: an empty trace, a speed-up not > 0.
    """
    if not trace:
        raise ValueError("the trace has no requests")
    if not (isinstance(speedup, (int, float)) and speedup > 0 and speedup < float("inf")):
        raise ValueError(f"speedup must be a finite number > 0, got {speedup!r}")
    rng = random.Random(seed)
    reqs = []
    for i, r in enumerate(trace):
        ids = r.prompt_token_ids
        ids = tuple(ids) if ids is not None else _ids(rng, r.prompt_len, vocab_size)
        reqs.append(WorkloadRequest(getattr(r, "request_id", None) or f"t{i}", ids, r.output_len,
                                    arrival_time=float(r.arrival_time) / speedup))
    first = min(float(r.arrival_time) for r in trace)
    span = max(float(r.arrival_time) for r in trace) - first
    return Workload(name, tuple(reqs), ("scale_note_d", (("n", len(reqs)), ("scale", length_scale),
                                                         ("speedup", speedup), ("span_s", span),
                                                         ("span_fast_s", span / speedup))))


def custom(num_requests: int = 32, prompt_len_range=(16, 512), output_len_range=(8, 64), arrival_rate: float = 40.0,
           vocab_size: int = BUNDLED_VOCAB_SIZE, seed: int = 0) -> Workload:
    """Preset (e): ``num_requests`` requests with uniform prompt and output lengths (tokens) in the given
    inclusive ranges, Poisson arrivals at ``arrival_rate`` requests/s (0 = all at time 0).

    Raises:
        ValueError: non-positive count, bad ranges, negative rate.
    """
    _positive("num_requests", num_requests)
    for name, (lo, hi) in (("prompt_len_range", prompt_len_range), ("output_len_range", output_len_range)):
        if not 1 <= lo <= hi:
            raise ValueError(f"{name} must be (lo, hi) with 1 <= lo <= hi tokens, got {(lo, hi)!r}")
    if arrival_rate < 0:
        raise ValueError(f"arrival_rate must be >= 0 requests/s, got {arrival_rate!r}")
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(num_requests):
        if i and arrival_rate > 0:
            t += rng.expovariate(arrival_rate)
        reqs.append(WorkloadRequest(f"r{i}", _ids(rng, rng.randint(*prompt_len_range), vocab_size),
                                    rng.randint(*output_len_range), arrival_time=t))
    return Workload("e", tuple(reqs))


def speculative_decoding(num_requests: int = 4, phrase_len: int = 12, repeats: int = 8, output_len: int = 64,
                         arrival_every_steps: int = 2, vocab_size: int = BUNDLED_VOCAB_SIZE,
                         seed: int = 0) -> Workload:
    """Preset (f): ``num_requests`` prompts, each a random phrase of ``phrase_len`` tokens said ``repeats``
    times, arriving every ``arrival_every_steps`` steps. A model continues such a prompt by repeating the phrase
    (an induction head does it; the bundled model does it for part of the phrase), so prompt lookup (n-gram
    speculative decoding, ``PRESET_ENGINE_DEFAULTS["f"]``: 4 proposals per decode) finds proposals the model
    accepts: the batch bars show 1 + k tokens per decode, part accepted, part rejected, and fewer steps. (A
    short phrase said often: the bundled model repeats it better than a long one said a few times, 56 % of 140
    proposals accepted against 38 % of 79 for 24 tokens x 4, and 55 steps instead of 70 without speculation.)

    Raises:
        ValueError: non-positive sizes.
    """
    for name, v in (("num_requests", num_requests), ("phrase_len", phrase_len), ("repeats", repeats),
                    ("output_len", output_len), ("arrival_every_steps", arrival_every_steps)):
        _positive(name, v)
    rng = random.Random(seed)
    reqs = tuple(WorkloadRequest(f"r{i}", _ids(rng, phrase_len, vocab_size) * repeats, output_len,
                                 arrival_step=i * arrival_every_steps) for i in range(num_requests))
    return Workload("f", reqs)

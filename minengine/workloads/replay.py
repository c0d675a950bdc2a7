"""Replay a trace online: each request is added when its arrival time comes, on the wall clock or a virtual one.

An offline run (all requests queued at time 0) hides what a serving system is judged by: queueing. A replay
adds each request at its arrival time while the engine keeps stepping, so requests arrive into a busy engine,
wait, and get their first token late when the engine is overloaded.

On a CPU with a tiny model the engine is much slower (or faster) than the system the trace came from, and
waiting in real time for a trace's idle gaps wastes hours. The ``VirtualClock`` runs only while the engine
steps (so time advances by each step's measured duration) and jumps straight over idle gaps to the next
arrival. Queueing, TTFT and TBT then follow from the engine's real step times and the trace's arrival pattern,
at whatever speed the replay itself runs, and the driver's own bookkeeping between steps costs no time.
On a busy CPU, pass ``timer=time.process_time`` (or ``clock="cpu"``) so a step is measured in this process's
CPU time and other processes do not inflate it (not on a GPU, where the CPU waits for the device). With
``clock="modelled"`` (``minengine.timing``) each step lasts what the roofline cost model says it would on a
named GPU for a named model shape: deterministic, the same on every machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from minengine.config import EngineConfig
from minengine.engine.llm_engine import LLMEngine
from minengine.metrics.stats import ServingSummary, summarize
from minengine.metrics.trace import StepTrace
from minengine.outputs import RequestMetrics
from minengine.sampling_params import SamplingParams
from minengine.timing.clocks import ClockChoice, MeasuredClock, clock_factory
from minengine.workloads.traces import Trace, TraceRequest, synthetic_prompt_ids

TOO_LONG_MODES = ("clip", "skip", "error")


# The measured virtual clock moved to ``minengine.timing.clocks`` (with the modelled and wall clocks); the old
# name stays importable from here.
VirtualClock = MeasuredClock


@dataclass
class ReplayResult:
    """What a replay measured. Times are on the engine clock; ``start_time`` is the trace's time 0 there.

    Attributes:
        trace: the replayed trace (after skipping, before clipping).
        request_metrics: per request id, the engine's ``RequestMetrics`` (TTFT, ITLs, ...).
        steps: the ``StepTrace`` of every step of this replay.
        output_token_ids: per request id, the generated token ids.
        finish_reasons: per request id, "length", "stop", ... (None if unfinished).
        virtual_clock: True when the replay ran on a virtual clock (measured or modelled: idle gaps skipped).
        start_time: engine-clock time of the trace's time 0.
        num_clipped: requests whose prompt / output was cut to fit ``max_model_len`` or the KV pool.
        skipped_ids: requests left out because they could not fit (``too_long="skip"``).
        num_kv_blocks: the engine's KV pool size (for the summary).
        wall_time_s: real seconds the replay took.
        clock_label: the clock's label, for figure titles ("modelled: H100 SXM, Llama-3-8B shapes").
    """

    trace: Trace
    request_metrics: dict[str, RequestMetrics]
    steps: list[StepTrace]
    output_token_ids: dict[str, list[int]]
    finish_reasons: dict[str, str | None]
    virtual_clock: bool
    start_time: float
    num_clipped: int = 0
    skipped_ids: list[str] = field(default_factory=list)
    num_kv_blocks: int = 0
    wall_time_s: float = 0.0
    clock_label: str = ""

    def summary(self) -> ServingSummary:
        """TTFT/TPOT/ITL percentiles, throughput, preemptions and prefix hits of this replay."""
        return summarize(list(self.request_metrics.values()), self.steps, self.num_kv_blocks)

    @property
    def all_finished(self) -> bool:
        """True when every replayed request finished."""
        return all(m.finished_time is not None for m in self.request_metrics.values())


def _fit(prompt_len: int, output_len: int, limit: int) -> tuple[int, int]:
    """Cut a (prompt, output) pair to ``limit`` tokens in total: the prompt first (keeping its start, so
    shared prefixes stay shared), keeping at least 1 prompt token and 1 output token."""
    prompt = max(1, min(prompt_len, limit - output_len))
    return prompt, max(1, min(output_len, limit - prompt))


def prepare_requests(engine: LLMEngine, trace: Sequence[TraceRequest], seed: int = 0,
                     too_long: str = "clip") -> tuple[list[tuple[TraceRequest, list[int], int]], int, list[str]]:
    """Turn trace requests into ``(request, prompt token ids, max_tokens)`` the engine accepts.

    Requests without ``prompt_token_ids`` get ``synthetic_prompt_ids`` within the model's vocabulary.
    Requests longer than the engine can hold (``max_model_len``, or the whole KV pool) are cut (``"clip"``),
    left out (``"skip"``) or rejected (``"error"``). Returns (prepared, number clipped, skipped ids).

    Raises:
        ValueError: bad ``too_long``; token ids outside the model's vocabulary (load the trace with the
            model's ``vocab_size``); with ``too_long="error"``, a request that does not fit.
    """
    if too_long not in TOO_LONG_MODES:
        raise ValueError(f"too_long must be one of {TOO_LONG_MODES}, got {too_long!r}")
    cfg = engine.config
    vocab = engine.hf_config.vocab_size
    limit = min(cfg.max_model_len, engine.num_kv_blocks * cfg.block_size)
    prepared, num_clipped, skipped = [], 0, []
    for r in trace:
        prompt_len, output_len = r.prompt_len, r.output_len
        if prompt_len + output_len > limit:
            if too_long == "error":
                raise ValueError(f"request {r.request_id}: prompt {prompt_len} + output {output_len} tokens exceed "
                                 f"the engine's limit of {limit} tokens (max_model_len, KV pool)")
            if too_long == "skip":
                skipped.append(r.request_id)
                continue
            prompt_len, output_len = _fit(prompt_len, output_len, limit)
            num_clipped += 1
        if r.prompt_token_ids is None:
            ids = synthetic_prompt_ids(r.request_id, prompt_len, vocab, seed)
        else:
            ids = r.prompt_token_ids[:prompt_len]
            if any(not 0 <= t < vocab for t in ids):
                raise ValueError(f"request {r.request_id}: prompt_token_ids outside the model's vocabulary "
                                 f"[0, {vocab}): load the trace with vocab_size={vocab}")
        prepared.append((r, ids, output_len))
    return prepared, num_clipped, skipped


def replay(engine: LLMEngine, trace: Sequence[TraceRequest], *, seed: int = 0, too_long: str = "clip",
           max_steps: int | None = None, on_step: Callable[[StepTrace], None] | None = None) -> ReplayResult:
    """Replay ``trace`` through ``engine`` online: add each request when its arrival time comes, step meanwhile.

    The clock decides the mode. On a virtual clock (``MeasuredClock``, ``ModelledClock``: ``is_virtual``) time
    advances by each step's measured or modelled duration and jumps over idle gaps (no waiting); with a real
    clock (the default ``time.perf_counter``, ``WallClock``) the driver sleeps through idle gaps and the replay
    takes the trace's real time.
    A request arriving during a step is added after it, with its true arrival time, so its TTFT includes
    the wait for the step in progress.

    Generation is greedy with ``max_tokens = output_len`` and ``ignore_eos=True`` so output lengths follow
    the trace. Requests are added in arrival order (ties keep the trace's order).

    Args:
        engine: the engine; its clock is virtual (``is_virtual``) or tracks real seconds.
        trace: the requests (``TraceRequest``), arrival times in seconds from 0.
        seed: seed for synthetic prompt ids.
        too_long: what to do with a request the engine cannot hold: "clip", "skip" or "error".
        max_steps: stop with ``RuntimeError`` after this many steps (a guard for experiments).
        on_step: called with each step's ``StepTrace`` (e.g. to draw progress).

    Raises:
        ValueError: as ``prepare_requests``; duplicate request ids; ``engine.add_request`` errors.
        RuntimeError: more than ``max_steps`` steps.
    """
    prepared, num_clipped, skipped = prepare_requests(engine, trace, seed, too_long)
    prepared.sort(key=lambda p: p[0].arrival_time)  # stable: ties keep the trace's order
    ids = [p[0].request_id for p in prepared]
    if len(set(ids)) != len(ids):
        raise ValueError("trace has duplicate request_id values")
    clock = engine.clock
    virtual = bool(getattr(clock, "is_virtual", False))
    if isinstance(clock, MeasuredClock):
        clock.pause()
    wall_start = time.perf_counter()
    start = clock()
    first_step = len(engine.traces)
    outputs: dict[str, list[int]] = {}
    reasons: dict[str, str | None] = dict.fromkeys(ids)
    next_i, num_steps = 0, 0

    def add(i: int) -> None:
        r, prompt_ids, max_tokens = prepared[i]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(r.request_id, {"prompt_token_ids": prompt_ids}, params,
                           arrival_time=start + r.arrival_time)

    while next_i < len(prepared) or engine.has_unfinished_requests():
        now = clock()
        while next_i < len(prepared) and start + prepared[next_i][0].arrival_time <= now:
            add(next_i)
            next_i += 1
        if not engine.has_unfinished_requests():
            # idle until the next arrival: jump (virtual) or sleep (wall clock), then add it for sure, so a
            # clock that is not quite in step with time.sleep cannot make the loop spin
            clock.advance_to(start + prepared[next_i][0].arrival_time)  # a jump, or a sleep on a wall clock
            add(next_i)
            next_i += 1
            continue
        if max_steps is not None and num_steps >= max_steps:
            raise RuntimeError(f"replay did not finish within max_steps={max_steps} steps")
        step_outputs = engine.step()  # the step tells the clock where it begins and ends
        num_steps += 1
        for out in step_outputs:
            if out.request_id in reasons:
                outputs[out.request_id] = out.outputs[0].token_ids
                reasons[out.request_id] = out.outputs[0].finish_reason
        if on_step is not None and len(engine.traces) > first_step:
            on_step(engine.traces[-1])

    return ReplayResult(
        trace=trace if isinstance(trace, Trace) else Trace(trace),
        request_metrics={rid: engine.request_metrics[rid] for rid in ids},
        steps=engine.traces[first_step:], output_token_ids=outputs, finish_reasons=reasons,
        virtual_clock=virtual, start_time=start, num_clipped=num_clipped, skipped_ids=skipped,
        num_kv_blocks=engine.num_kv_blocks, wall_time_s=time.perf_counter() - wall_start,
        clock_label=getattr(clock, "label", ""))


def replay_trace(trace: Sequence[TraceRequest], config: EngineConfig | None = None, *, virtual: bool = True,
                 timer: Callable[[], float] = time.perf_counter, step_time_scale: float = 1.0, seed: int = 0,
                 too_long: str = "clip", max_steps: int | None = None, clock: ClockChoice | None = None,
                 **config_fields) -> ReplayResult:
    """Build an engine (``config`` or ``EngineConfig(**config_fields)``) on a fresh clock and ``replay`` the trace.

    Args:
        clock: the clock: a kind ("modelled", "cpu", "perf", "wall"), a ``minengine.timing.ClockSpec``, a
            function returning a fresh clock, or a clock instance (used as is). ``None`` keeps the older
            arguments: a ``MeasuredClock(timer=timer, step_time_scale=step_time_scale)`` when ``virtual``,
            else the wall clock.
        virtual, timer, step_time_scale: the clock when ``clock`` is None.

    Raises:
        ValueError: as ``replay`` / ``EngineConfig``; an unknown clock kind.
    """
    if config is not None and config_fields:
        raise ValueError("pass either config or EngineConfig fields, not both")
    config = config if config is not None else EngineConfig(**config_fields)
    if clock is None:
        engine_clock = MeasuredClock(timer=timer, step_time_scale=step_time_scale) if virtual else time.perf_counter
    elif hasattr(clock, "begin_step"):
        engine_clock = clock
    else:
        engine_clock = clock_factory(clock)()
    engine = LLMEngine(config, clock=engine_clock)
    return replay(engine, trace, seed=seed, too_long=too_long, max_steps=max_steps)

"""Run a ``Workload`` on the real engine for the dashboard: validate the settings, replay the arrivals on the
chosen clock (``minengine.timing``: by default a ``ModelledClock``, each step lasting what a roofline model says
it would on a named GPU for a named model shape, so the pictures are the same on every machine; or measured CPU
time; idle gaps cost nothing either way), step by step so a page can draw the run while it runs, and keep only
plain data (step traces, request metrics, summary) so the result can be cached."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from minengine.config import EngineConfig
from minengine.core.policies import POLICIES
from minengine.core.spec_decode import MAX_SPECULATIVE_TOKENS
from minengine.engine.llm_engine import LLMEngine
from minengine.labs.door import describe_parts
from minengine.metrics.stats import ServingSummary
from minengine.metrics.trace import StepTrace
from minengine.outputs import RequestMetrics
from minengine.sampling_params import SamplingParams
from minengine.timing import ClockSpec
from minengine.viz.clock_label import DEFAULT_CLOCK
from minengine.viz.workload import Workload


@dataclass(frozen=True)
class DashboardConfig:
    """The engine knobs the page exposes (vLLM's names; see ``EngineConfig``), the sampling temperature and the
    clock.

    ``scheduling_policy`` is one of ``minengine.core.policies.POLICIES`` (``"shortest-predicted-first"``
    predicts each request's ``max_tokens``, exact here: the dashboard ignores EOS). ``num_speculative_tokens``
    k > 0 turns on n-gram speculative decoding (prompt lookup, ``prompt_lookup_min`` 2, ``prompt_lookup_max``
    4); 0 = off.

    ``model=None`` is the bundled model (it computes the tokens; a modelled clock times them as the target model
    shape would run). ``clock`` is a ``minengine.timing.ClockSpec`` (hashable, so it keys the cache): default
    modelled, H100 SXM, Llama-3-8B shapes. ``kv_cache_dtype`` ("auto", "fp8") and ``quantization`` (None,
    "int8") are the engine's (``EngineConfig``) and the modelled clock prices them on the target shape.
    ``preemption_mode`` "recompute" or "swap" (a CPU swap space as large as the KV pool; the modelled clock
    prices each swap as a transfer over the hardware's host link). ``max_model_len`` is not a knob: the runner
    sets it to the workload's longest request.
    """

    max_num_batched_tokens: int = 256
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    block_size: int = 16
    num_kv_blocks: int = 256
    max_num_seqs: int = 16
    enable_prefix_caching: bool = True
    scheduling_policy: str = "decode-first"
    num_speculative_tokens: int = 0
    temperature: float = 0.0
    seed: int = 0
    model: str | None = None
    clock: ClockSpec = field(default=DEFAULT_CLOCK)
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    preemption_mode: str = "recompute"
    labs: tuple[tuple[str, str], ...] = ()  # (lab, the learner's file) pairs: ``EngineConfig.labs`` (hashable)

    def make_clock(self):
        """A fresh clock for one run (a modelled one costs KV swaps with this config's ``block_size``, and KV and
        weight bytes with its ``kv_cache_dtype`` and ``quantization``)."""
        spec = self.clock
        if spec.kind == "modelled":
            spec = dataclasses.replace(spec, block_size=self.block_size, kv_cache_dtype=self.kv_cache_dtype,
                                       quantization=self.quantization)
        return spec.make()

    def validate(self) -> None:
        """Reject settings the page must not run, with a message naming the field.

        Raises:
            ValueError: ``num_kv_blocks`` < 1, ``block_size`` < 1, ``max_num_batched_tokens`` smaller than
                ``block_size`` (a step could not even fill one KV block: almost surely a typo), negative
                ``long_prefill_token_threshold`` or ``temperature``, ``max_num_seqs`` < 1, an unknown
                ``scheduling_policy``, ``num_speculative_tokens`` outside [0, 64].
        """
        ints = ("max_num_batched_tokens", "long_prefill_token_threshold", "block_size", "num_kv_blocks",
                "max_num_seqs", "num_speculative_tokens")
        for name in ints:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{name} must be an integer, got {v!r}")
        if self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be at least 1 block, got {self.num_kv_blocks}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1 token, got {self.block_size}")
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens} tokens) is smaller than "
                             f"block_size ({self.block_size} tokens): a step could not fill one KV block")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1 sequence slot, got {self.max_num_seqs}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0 tokens (0 = no cap), got "
                             f"{self.long_prefill_token_threshold}")
        if self.scheduling_policy not in POLICIES:
            raise ValueError(f"scheduling_policy must be one of {list(POLICIES)}, got {self.scheduling_policy!r}")
        if not 0 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in [0, {MAX_SPECULATIVE_TOKENS}] (0 = off), got "
                             f"{self.num_speculative_tokens}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.clock, ClockSpec) or self.clock.kind not in ("modelled", "cpu", "perf"):
            raise ValueError(f"clock must be a ClockSpec of kind 'modelled', 'cpu' or 'perf' (a virtual clock), "
                             f"got {self.clock!r}")

    def engine_config(self, max_model_len: int) -> EngineConfig:
        """The ``EngineConfig`` for a workload whose longest request has ``max_model_len`` tokens.

        Without chunked prefill a whole prompt must fit in one step, so the token budget is raised to
        ``max_model_len + max_num_seqs`` when smaller: the longest prompt plus one decode token for every
        other sequence slot, so a long prompt is admitted beside running decodes (the head-of-line blocking
        the dashboard shows) instead of waiting for them all to finish. vLLM likewise raises
        ``max_num_batched_tokens`` to at least ``max_model_len`` when chunked prefill is off.
        Raises ``ValueError`` as ``validate`` and ``EngineConfig``."""
        self.validate()
        budget = self.max_num_batched_tokens
        if not self.enable_chunked_prefill:
            budget = max(budget, max_model_len + self.max_num_seqs)
        return EngineConfig(model=self.model, block_size=self.block_size, num_kv_blocks=self.num_kv_blocks,
                            max_num_batched_tokens=budget, max_num_seqs=self.max_num_seqs,
                            max_model_len=max_model_len, enable_chunked_prefill=self.enable_chunked_prefill,
                            long_prefill_token_threshold=self.long_prefill_token_threshold
                            if self.enable_chunked_prefill else 0,  # the cap needs chunking (EngineConfig)
                            enable_prefix_caching=self.enable_prefix_caching, seed=self.seed,
                            scheduling_policy=self.scheduling_policy,
                            speculative_config=self.speculative_config(), trace_block_tables=True,
                            kv_cache_dtype=self.kv_cache_dtype, quantization=self.quantization,
                            preemption_mode=self.preemption_mode, labs=dict(self.labs) or None)

    def speculative_config(self) -> dict | None:
        """vLLM's ``speculative_config`` dict for ``num_speculative_tokens`` (None when 0: off)."""
        if not self.num_speculative_tokens:
            return None
        return {"method": "ngram", "num_speculative_tokens": self.num_speculative_tokens, "prompt_lookup_min": 2,
                "prompt_lookup_max": 4}


def parse_labs(text: str | None) -> tuple[tuple[str, str], ...]:
    """``DashboardConfig.labs`` from "lab=path,lab=path" (the dashboard's ``MINENGINE_LABS``); None or "" = none.

    Raises:
        ValueError: an entry that is not NAME=PATH.
    """
    pairs = []
    for entry in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, path = entry.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"MINENGINE_LABS entries are NAME=PATH (a lab and the learner's file), got {entry!r}")
        pairs.append((name.strip(), path.strip()))
    return tuple(pairs)


@dataclass
class RunResult:
    """What one dashboard run produced: the engine's own records, nothing computed by the page.

    Attributes:
        traces: ``engine.traces``.
        request_metrics: ``engine.request_metrics``.
        summary: ``engine.summary()``.
        token_budget: the budget the engine ran with (raised when chunked prefill was off).
        budget_raised: True when the budget was raised to ``max_model_len``.
        max_model_len: tokens of the longest request.
        wall_time_s: real seconds spent building the engine (model loading included) and stepping it; a
            live view's pauses and drawing are not counted.
        clock_label: the clock the times are on ("modelled: H100 SXM, Llama-3-8B shapes").
        parts: which parts of the engine a learner wrote (``minengine.labs.door.describe_parts``; "" without labs).
    """

    traces: list[StepTrace]
    request_metrics: dict[str, RequestMetrics]
    summary: ServingSummary
    token_budget: int
    budget_raised: bool
    max_model_len: int
    wall_time_s: float
    clock_label: str = ""
    parts: str = ""


class WorkloadRun:
    """A dashboard run in progress: one fresh engine replaying ``workload``, advanced step by step, so a page can
    draw it while it runs. A ``TraceStream`` (``minengine.viz.live``): ``poll`` returns the new ``StepTrace``s.

    Requests arrive at ``arrival_time`` seconds on the run's clock (``config.clock``: virtual, so time moves
    only inside ``engine.step()``, by the step's modelled or measured duration, and an idle engine jumps to
    the next arrival) or, with ``arrival_step``, right before that step. Sampling uses ``config.temperature``
    with ``ignore_eos=True`` so each request produces exactly its ``max_tokens``.

    Raises (from the constructor, before any step):
        ValueError: bad settings, or a request the engine refuses (e.g. longer than the whole KV pool).
    """

    def __init__(self, config: DashboardConfig, workload: Workload, max_steps: int = 20_000):
        wall_start = time.perf_counter()
        self.config = config
        self.workload = workload
        self.max_steps = max_steps
        self.max_model_len = workload.max_request_len
        self.engine_config = config.engine_config(self.max_model_len)
        self.clock = config.make_clock()
        self.engine = LLMEngine(self.engine_config, clock=self.clock)
        self._params = {r.request_id: SamplingParams(temperature=config.temperature, max_tokens=r.max_tokens,
                                                     ignore_eos=True) for r in workload.requests}
        # Validate every request before stepping, so a bad one fails the run at once with the engine's message.
        for r in workload.requests:
            self.engine.make_request(r.request_id, self._prompt(r), self._params[r.request_id], 0.0)
        self._by_time = sorted((r for r in workload.requests if r.arrival_step is None),
                               key=lambda r: r.arrival_time)
        self._by_step = sorted((r for r in workload.requests if r.arrival_step is not None),
                               key=lambda r: r.arrival_step)
        self._i_time = self._i_step = 0
        self._start = self.clock()
        self.done = False
        self._wall_s = time.perf_counter() - wall_start  # building the engine (model loading) counts

    @staticmethod
    def _prompt(r) -> dict:
        return {"prompt_token_ids": list(r.prompt_token_ids)}

    @property
    def traces(self) -> list[StepTrace]:
        """Every step so far (``engine.traces``)."""
        return self.engine.traces

    @property
    def num_requests(self) -> int:
        return len(self.workload.requests)

    @property
    def num_finished(self) -> int:
        """Requests finished so far."""
        return sum(1 for m in self.engine.request_metrics.values() if m.finished_time is not None)

    def _add(self, r, arrival: float) -> None:
        self.engine.add_request(r.request_id, self._prompt(r), self._params[r.request_id], arrival_time=arrival)

    def step(self) -> StepTrace | None:
        """Add the requests that have arrived, run one engine step and return its trace; None (and ``done``)
        when every request has finished.

        Raises:
            RuntimeError: more than ``max_steps`` steps (a guard; the workloads here need a few hundred).
        """
        wall = time.perf_counter()
        try:
            return self._step()
        finally:
            self._wall_s += time.perf_counter() - wall

    def _step(self) -> StepTrace | None:
        engine, clock, start = self.engine, self.clock, self._start
        by_time, by_step = self._by_time, self._by_step
        while not self.done:
            step = len(engine.traces)
            while self._i_time < len(by_time) and start + by_time[self._i_time].arrival_time <= clock():
                self._add(by_time[self._i_time], start + by_time[self._i_time].arrival_time)
                self._i_time += 1
            while self._i_step < len(by_step) and by_step[self._i_step].arrival_step <= step:
                self._add(by_step[self._i_step], clock())
                self._i_step += 1
            if not engine.has_unfinished_requests():
                if self._i_time < len(by_time):  # idle until the next timed arrival: jump over the gap
                    clock.advance_to(start + by_time[self._i_time].arrival_time)
                    continue
                if self._i_step < len(by_step):  # nothing left to step before a step-timed arrival: it is now
                    self._add(by_step[self._i_step], clock())
                    self._i_step += 1
                    continue
                self.done = True
                return None
            if step >= self.max_steps:
                raise RuntimeError(f"run did not finish within max_steps={self.max_steps} steps")
            engine.step()  # the engine tells the clock where the step begins and ends
            if len(engine.traces) > step:
                return engine.traces[-1]
        return None

    def poll(self, max_steps: int, budget_s: float = float("inf")) -> list[StepTrace]:
        """Run up to ``max_steps`` steps, stopping early once ``budget_s`` real seconds have passed (at least
        one step runs when ``max_steps`` >= 1); returns their traces, oldest first. Raises as ``step``."""
        deadline = time.perf_counter() + budget_s
        new: list[StepTrace] = []
        while len(new) < max_steps and not self.done:
            tr = self.step()
            if tr is not None:
                new.append(tr)
            if time.perf_counter() >= deadline:
                break
        return new

    def result(self) -> RunResult:
        """The finished run's records.

        Raises:
            RuntimeError: the run has not finished.
        """
        if not self.done:
            raise RuntimeError("the run has not finished: keep calling step()")
        engine = self.engine
        return RunResult(traces=engine.traces, request_metrics=engine.request_metrics, summary=engine.summary(),
                         token_budget=self.engine_config.max_num_batched_tokens,
                         budget_raised=self.engine_config.max_num_batched_tokens != self.config.max_num_batched_tokens,
                         max_model_len=self.max_model_len, wall_time_s=self._wall_s,
                         clock_label=self.clock.label, parts=describe_parts(engine) if self.config.labs else "")


def run_workload(config: DashboardConfig, workload: Workload, max_steps: int = 20_000) -> RunResult:
    """Build a fresh engine for ``config`` and replay ``workload`` on it to the end (``WorkloadRun``, stepped
    until done).

    Raises:
        ValueError: bad settings, or a request the engine refuses (e.g. longer than the whole KV pool).
        RuntimeError: more than ``max_steps`` steps (a guard; the workloads here need a few hundred).
    """
    run = WorkloadRun(config, workload, max_steps=max_steps)
    while not run.done:
        run.step()
    return run.result()

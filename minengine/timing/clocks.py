"""The clocks an engine can run on: one protocol, three kinds of time.

``LLMEngine(config, clock=...)`` reads time only from its clock (arrival, scheduling, token and finish times)
and tells the clock where each step begins and ends:

    clock.begin_step()                 # start of LLMEngine.step()
    now = clock()                      # seconds, any time
    clock.end_step(scheduler_output)   # after the step's forward and update, before its end time is read
    clock.advance_to(t)                # a driver (replay) skips an idle gap to time t

- ``WallClock``: real time; ``advance_to`` sleeps. What a server lives on. It, the ``Clock`` protocol and
  ``as_clock`` live in ``minengine.timing.wall_clock`` (the engine imports only that module, not the cost model)
  and are importable from here too.
- ``MeasuredClock`` (was ``workloads.replay.VirtualClock``, still importable under that name): runs only inside
  steps and advances by each step's *measured* duration (``time.process_time``: this process's CPU time, which
  other processes on a shared machine do not inflate; or ``time.perf_counter`` on a GPU, where the CPU waits for
  the device); idle gaps are skipped.
- ``ModelledClock``: advances by the step cost model's duration of each step on a named GPU for a named model
  shape (``StepCostModel``), whatever machine runs the engine: the same workload gives the same times on every
  laptop, every run. The tokens are still computed by the loaded model.

A plain callable (``clock=time.perf_counter``) keeps working: ``as_clock`` wraps it with no-op hooks.
``ClockSpec`` / ``make_clock`` choose a clock by name for everything that reports time (``replay_trace``,
``find_capacity``, ``bench-serve``, the dashboard): a spec is a frozen, hashable recipe, and each run makes
its own fresh clock from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from minengine.timing.cost_model import StepCost, StepCostModel
from minengine.timing.engine_profile import EngineProfile, get_engine
from minengine.timing.hardware import Hardware, get_hardware
from minengine.timing.model_shape import ModelShape, get_model_shape
from minengine.timing.wall_clock import CallableClock, Clock, WallClock, as_clock  # noqa: F401  (re-exported)

_TIMER_LABELS = {time.process_time: "measured: CPU time", time.perf_counter: "measured: wall time per step"}


class MeasuredClock:
    """A clock (seconds) that advances only while an engine step runs, by the ``timer``'s elapsed seconds.

    ``LLMEngine.step()`` calls ``begin_step()`` / ``end_step()``; a driver may also bracket steps itself with
    ``resume()`` / ``pause()`` or ``with clock.running():`` (nested calls are no-ops). Between steps time
    stands still, and ``advance_to(t)`` jumps over an idle gap, so queueing, TTFT and TBT follow from the
    engine's measured step times and the arrival pattern at whatever speed the replay itself runs.

    Args:
        start: the time at construction, seconds.
        timer: the real time source: ``time.process_time`` (CPU time of this process: robust to other load, CPU
            only) or ``time.perf_counter`` (the default, kept from ``VirtualClock``; use it on a GPU); a test
            may pass a deterministic one.
        step_time_scale: factor on measured durations, > 0 (e.g. 0.1 to pretend the hardware is 10x faster).
        label: the name in figure titles (default from the timer: "measured: CPU time").

    Raises:
        ValueError: ``step_time_scale`` not > 0; ``advance_to`` while running.
    """

    is_virtual = True

    def __init__(self, start: float = 0.0, timer: Callable[[], float] = time.perf_counter,
                 step_time_scale: float = 1.0, label: str | None = None):
        if not isinstance(step_time_scale, (int, float)) or not step_time_scale > 0:
            raise ValueError(f"step_time_scale must be > 0, got {step_time_scale!r}")
        self._now = float(start)
        self._timer = timer
        self._scale = step_time_scale
        self._resumed_at: float | None = None  # timer value at resume(); None while paused
        self.label = label or _TIMER_LABELS.get(timer, "measured")

    def __call__(self) -> float:
        if self._resumed_at is None:
            return self._now
        return self._now + (self._timer() - self._resumed_at) * self._scale

    @property
    def is_running(self) -> bool:
        """True between ``resume()`` and ``pause()``."""
        return self._resumed_at is not None

    def resume(self) -> None:
        """Let time run (from now on it follows the timer); no-op if already running."""
        if self._resumed_at is None:
            self._resumed_at = self._timer()

    def pause(self) -> None:
        """Freeze time at its current value; no-op if already paused."""
        if self._resumed_at is not None:
            self._now = self()
            self._resumed_at = None

    @contextmanager
    def running(self) -> Iterator[None]:
        """Let time run for the duration of the ``with`` block (one engine step)."""
        self.resume()
        try:
            yield
        finally:
            self.pause()

    def begin_step(self) -> None:
        self.resume()

    def end_step(self, scheduler_output=None) -> None:
        self.pause()

    def advance_to(self, t: float) -> None:
        """Jump forward to time ``t`` (no-op if ``t`` is in the past): an idle gap costs no real time."""
        if self._resumed_at is not None:
            raise ValueError("advance_to needs a paused clock: time is running (inside a step)")
        self._now = max(self._now, float(t))


class ModelledClock:
    """A clock that advances by the modelled duration of each step (``StepCostModel``); deterministic.

    Time moves only in ``end_step`` (by ``cost_model.cost_of(scheduler_output).time_s``) and ``advance_to``;
    reading it never changes it. ``costs`` keeps the ``StepCost`` of every non-empty step in order, so for an
    engine built with a fresh clock ``clock.costs[i]`` explains ``engine.traces[i]`` (compute- or memory-bound,
    FLOPs, bytes); ``last_cost`` is the latest.

    Args:
        cost_model: the ``StepCostModel`` (hardware, model shape, tp).
        start: the time at construction, seconds.
        keep_costs: record ``costs`` (turn off for very long simulations).
    """

    is_virtual = True

    def __init__(self, cost_model: StepCostModel, start: float = 0.0, keep_costs: bool = True):
        if not isinstance(cost_model, StepCostModel):
            raise ValueError(f"cost_model must be a StepCostModel, got {type(cost_model).__name__}")
        self.cost_model = cost_model
        self._now = float(start)
        self.keep_costs = keep_costs
        self.costs: list[StepCost] = []
        self.last_cost: StepCost | None = None

    @property
    def label(self) -> str:
        return self.cost_model.label

    def __call__(self) -> float:
        return self._now

    def begin_step(self) -> None:
        pass

    def end_step(self, scheduler_output) -> None:
        """Advance by the modelled duration of the step ``scheduler_output`` describes (0 for an empty one)."""
        if not (scheduler_output.scheduled or scheduler_output.blocks_to_swap_out
                or scheduler_output.blocks_to_swap_in):
            return
        cost = self.cost_model.cost_of(scheduler_output)
        self._now += cost.time_s
        self.last_cost = cost
        if self.keep_costs:
            self.costs.append(cost)

    def advance_to(self, t: float) -> None:
        """Jump forward to time ``t`` (no-op if ``t`` is in the past)."""
        self._now = max(self._now, float(t))


# ---- choosing a clock by name ------------------------------------------------------------------------------
CLOCK_KINDS = ("modelled", "cpu", "perf", "wall")
# EngineConfig.kv_cache_dtype / .quantization -> bytes per KV element / per decoder-layer weight (None: the shape's)
KV_CACHE_DTYPE_BYTES = {"auto": None, "fp8": 1, "fp8_e4m3": 1}
QUANTIZATION_WEIGHT_BYTES = {None: None, "int8": 1, "experts_int8": 1}  # the second: vLLM's name


def shape_for_engine(shape: str | ModelShape, kv_cache_dtype: str = "auto",
                     quantization: str | None = None) -> ModelShape:
    """The model shape as an engine with these ``EngineConfig`` settings stores it: ``kv_cache_dtype="fp8"`` sets
    ``kv_dtype_bytes=1``, ``quantization="int8"`` sets ``weight_dtype_bytes=1`` (activations keep ``dtype_bytes``);
    "auto" / None leave the shape's own. The name says what changed ("Llama-3-8B, fp8 KV, int8 weights").

    Raises:
        ValueError: an unknown shape, ``kv_cache_dtype`` or ``quantization`` (the accepted values listed).
    """
    if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise ValueError(f"kv_cache_dtype must be one of {tuple(KV_CACHE_DTYPE_BYTES)}, got {kv_cache_dtype!r}")
    if quantization not in QUANTIZATION_WEIGHT_BYTES:
        raise ValueError(f"quantization must be one of {tuple(QUANTIZATION_WEIGHT_BYTES)}, got {quantization!r}")
    shape = get_model_shape(shape)
    changes, notes = {}, []
    if KV_CACHE_DTYPE_BYTES[kv_cache_dtype] is not None:
        changes["kv_dtype_bytes"], notes = KV_CACHE_DTYPE_BYTES[kv_cache_dtype], ["fp8 KV"]
    if QUANTIZATION_WEIGHT_BYTES[quantization] is not None:
        changes["weight_dtype_bytes"] = QUANTIZATION_WEIGHT_BYTES[quantization]
        notes.append(f"{quantization} weights")
    return shape.with_(name=", ".join([shape.name, *notes]), **changes) if changes else shape


@dataclass(frozen=True)
class ClockSpec:
    """A recipe for a fresh clock, chosen by name; hashable, so it can key a cache.

    Attributes:
        kind: "modelled" (``ModelledClock``), "cpu" (``MeasuredClock`` on process CPU time), "perf"
            (``MeasuredClock`` on ``time.perf_counter``: per-step wall time, idle gaps skipped; for GPUs) or
            "wall" (``WallClock``: real time, idle gaps slept through).
        hardware, model, tp: the modelled target (preset names or ``Hardware`` / ``ModelShape``); "modelled" only.
        block_size: tokens per KV block, to cost swaps; "modelled" only.
        kv_cache_dtype, quantization: the engine's ``EngineConfig`` settings of the same names, priced on the
            target shape (``shape_for_engine``: fp8 KV is 1 byte per element, int8 weights 1 byte per weight);
            "modelled" only.
        step_time_scale: factor on measured durations; "cpu" / "perf" only.
        engine: the engine whose host overhead the modelled clock charges ("vllm", "cuda-graph", "none" or an
            ``EngineProfile``); ``None`` = the hardware's default ("vllm" on the GPU presets); "modelled" only.
        expert_parallel: a MoE target's experts placed whole on the ``tp`` ranks, reached by all-to-alls
            (``StepCostModel``'s argument of the same name); "modelled" only.

    Raises:
        ValueError: unknown ``kind``, hardware, model shape or engine; ``expert_parallel`` on a dense model.
    """

    kind: str = "modelled"
    hardware: str | Hardware = "h100"
    model: str | ModelShape = "llama-3-8b"
    tp: int = 1
    block_size: int = 16
    step_time_scale: float = 1.0
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    engine: str | EngineProfile | None = None
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        if self.kind not in CLOCK_KINDS:
            raise ValueError(f"clock kind must be one of {CLOCK_KINDS}, got {self.kind!r}")
        if self.kind == "modelled":  # fail early on unknown names
            get_hardware(self.hardware), shape_for_engine(self.model, self.kv_cache_dtype, self.quantization)
            if self.engine is not None:
                get_engine(self.engine)
            if self.expert_parallel:
                self.cost_model()  # a dense model or experts that do not divide over tp: the cost model says so

    def cost_model(self) -> StepCostModel:
        """The ``StepCostModel`` of a "modelled" spec."""
        shape = shape_for_engine(self.model, self.kv_cache_dtype, self.quantization)
        return StepCostModel(self.hardware, shape, tp=self.tp, block_size=self.block_size, engine=self.engine,
                             expert_parallel=self.expert_parallel)

    def make(self) -> Clock:
        """A new clock of this kind, at time 0."""
        if self.kind == "modelled":
            return ModelledClock(self.cost_model())
        if self.kind == "cpu":
            return MeasuredClock(timer=time.process_time, step_time_scale=self.step_time_scale)
        if self.kind == "perf":
            return MeasuredClock(timer=time.perf_counter, step_time_scale=self.step_time_scale)
        return WallClock()

    @property
    def label(self) -> str:
        """The label the clock will carry ("modelled: H100 SXM, Llama-3-8B shapes", "measured: CPU time")."""
        if self.kind == "modelled":
            return self.cost_model().label
        return {"cpu": "measured: CPU time", "perf": "measured: wall time per step", "wall": "wall"}[self.kind]


def make_clock(kind: str | ClockSpec = "modelled", **spec_fields) -> Clock:
    """A fresh clock by name: ``make_clock("modelled", hardware="h100", model="llama-3-8b")``, ``make_clock("cpu")``,
    ``make_clock("wall")``; or from a ``ClockSpec``. Raises ``ValueError`` as ``ClockSpec``."""
    spec = kind if isinstance(kind, ClockSpec) else ClockSpec(kind, **spec_fields)
    if isinstance(kind, ClockSpec) and spec_fields:
        raise ValueError("pass either a ClockSpec or its fields, not both")
    return spec.make()


ClockChoice = str | ClockSpec | Callable[[], Clock]


def clock_factory(choice: ClockChoice) -> Callable[[], Clock]:
    """A zero-argument function that makes a fresh clock for each run, from a kind name, a ``ClockSpec`` or
    such a function itself (what ``find_capacity`` needs: one clock per probe).

    Raises:
        ValueError: an unknown kind name; something else.
    """
    if isinstance(choice, str):
        return ClockSpec(choice).make
    if isinstance(choice, ClockSpec):
        return choice.make
    if callable(choice) and not isinstance(choice, (MeasuredClock, ModelledClock, WallClock)):
        def make() -> Clock:
            clock = choice()
            if isinstance(clock, (int, float)):
                raise ValueError(f"the clock factory {choice!r} returned a number, not a clock: pass a kind "
                                 f"({', '.join(CLOCK_KINDS)}), a ClockSpec or a function returning a fresh clock")
            return as_clock(clock)
        return make
    raise ValueError(f"clock must be a kind ({', '.join(CLOCK_KINDS)}), a ClockSpec or a function returning a "
                     f"fresh clock, got {choice!r}")

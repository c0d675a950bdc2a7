"""The course's clocks: teaching figures on the modelled clock, measurements on this CPU done carefully.

A figure or sentence that *teaches* with time uses the modelled clock (``minengine.timing``): every step lasts
what the roofline cost model gives for it on an H100 SXM with Llama-3-8B shapes, so a run gives the same
numbers on every laptop, every time, at GPU magnitudes, while the tokens are still computed by the loaded
model. A cell that *measures* this CPU on purpose uses ``make_clock("cpu")`` (the step's process CPU time,
which other processes do not inflate), one torch thread, a warm-up and medians (``median_of``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from minengine.config import EngineConfig
from minengine.course.settings import COURSE_MODEL
from minengine.timing import ClockSpec, StepCostModel, make_clock

TEACHING_HARDWARE = "h100"
TEACHING_MODEL_SHAPE = "llama-3-8b"
TEACHING_CLOCK = ClockSpec("modelled", hardware=TEACHING_HARDWARE, model=TEACHING_MODEL_SHAPE)
CLOCK_LABEL: str = TEACHING_CLOCK.label  # "modelled: H100 SXM, Llama-3-8B shapes"


def teaching_clock():
    """A fresh modelled clock (H100 SXM, Llama-3-8B shapes) at time 0: one per engine."""
    return TEACHING_CLOCK.make()


def teaching_cost_model() -> StepCostModel:
    """The ``StepCostModel`` behind ``teaching_clock`` (to cost a step by hand: ``.cost(StepWork.of(...))``)."""
    return TEACHING_CLOCK.cost_model()


def modelled_engine(clock=None, **fields):
    """``LLMEngine(EngineConfig(model=COURSE_MODEL, **fields), clock=clock or teaching_clock())``.

    Raises:
        ValueError: as ``EngineConfig`` / ``LLMEngine``.
    """
    from minengine.engine.llm_engine import LLMEngine  # torch is imported only when an engine is built

    fields.setdefault("model", COURSE_MODEL)
    return LLMEngine(EngineConfig(**fields), clock=clock if clock is not None else teaching_clock())


def cpu_engine(**fields):
    """An engine that measures this CPU: each step's duration is its process CPU time (``make_clock("cpu")``),
    with one torch thread (``num_cpu_threads=1``, the default) so another process cannot slow its ops."""
    fields.setdefault("num_cpu_threads", 1)
    return modelled_engine(clock=make_clock("cpu"), **fields)


def titled(fig, title: str, clock_label: str = CLOCK_LABEL):
    """``fig`` with ``title`` and, as its subtitle, the clock its times come from (every time figure names it; the
    same subtitle as the dashboard's figures, ``minengine.viz.clock_label``)."""
    from minengine.viz.clock_label import TOP_MARGIN
    from minengine.viz.clock_label import titled as subtitled

    fig.update_layout(title=subtitled(title, clock_label), margin={"t": max(TOP_MARGIN, fig.layout.margin.t or 0)})
    return fig


def median_of(fn: Callable[[], float], repeats: int = 5, warmup: int = 1) -> float:
    """Median of ``repeats`` calls of ``fn`` (each returns a duration), after ``warmup`` calls whose result is
    thrown away (first-call costs: allocations, caches).

    Raises:
        ValueError: ``repeats`` < 1 or ``warmup`` < 0.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    for _ in range(warmup):
        fn()
    return statistics.median(fn() for _ in range(repeats))


def percentile_of(values: Sequence[float], q: float) -> float:
    """``q``-th percentile (0-100) with linear interpolation (numpy's default), as the engine's summaries."""
    from minengine.metrics.stats import percentile

    return percentile(list(values), q)

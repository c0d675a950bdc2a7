"""The clocks: modelled time (a roofline cost model of each step on a named GPU for a named model shape),
measured time (per-step CPU or wall time, idle gaps skipped) and wall time, behind one clock protocol.

    from minengine.timing import make_clock, StepCostModel, StepWork
    engine = LLMEngine(config, clock=make_clock("modelled", hardware="h100", model="llama-3-8b"))
    StepCostModel("h100", "llama-3-8b").cost(StepWork.of([(8000, 0, 1)] + [(1, 1000, 1)] * 10)).time_s

The cost model, the presets and the clocks import no torch (``calibrate`` needs an engine, so torch).
"""

from minengine.timing.calibrate import CalibrationPoint, CalibrationResult, calibrate, engine_shape, fit_hardware
from minengine.timing.clocks import (
    CLOCK_KINDS,
    CallableClock,
    Clock,
    ClockSpec,
    MeasuredClock,
    ModelledClock,
    WallClock,
    as_clock,
    clock_factory,
    make_clock,
)
from minengine.timing.cost_model import RequestWork, StepCost, StepCostModel, StepWork
from minengine.timing.hardware import HARDWARE, Hardware, get_hardware
from minengine.timing.model_shape import (
    LLAMA_3_8B,
    LLAMA_3_70B,
    MODEL_SHAPES,
    QWEN_2_5_7B,
    ModelShape,
    bundled_shape,
    get_model_shape,
)

__all__ = [
    "CLOCK_KINDS", "HARDWARE", "LLAMA_3_70B", "LLAMA_3_8B", "MODEL_SHAPES", "QWEN_2_5_7B", "CalibrationPoint",
    "CalibrationResult", "CallableClock", "Clock", "ClockSpec", "Hardware", "MeasuredClock", "ModelShape",
    "ModelledClock", "RequestWork", "StepCost", "StepCostModel", "StepWork", "WallClock", "as_clock",
    "bundled_shape", "calibrate", "clock_factory", "engine_shape", "fit_hardware", "get_hardware",
    "get_model_shape", "make_clock",
]

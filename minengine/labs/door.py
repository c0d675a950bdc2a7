"""The lab door: ``EngineConfig.labs`` names the learner's parts, and the engine is built on them.

``EngineConfig(labs={"block_pool": "labs/block_pool/block_pool.py"})`` maps a lab's name to the learner's file (or
an importable module name). ``LLMEngine(config)`` then builds ``LabLLMEngine``, a subclass chosen at construction
like every engine door (``engine/engine_doors.py``). Its ``__init__`` loads the learner's modules first (a bad name
or a file that does not import is an error before any weights load), builds the engine as usual, then lets each
lab's ``install`` put the learner's part in place of the engine's own. With ``labs`` unset the engine is exactly the
default one: the default step's only trace of labs is one row of the engine doors' table.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from minengine.engine.llm_engine import LLMEngine
from minengine.exceptions import VLLMValidationError, show
from minengine.labs.grading import LabFailure
from minengine.labs.loading import load_submission
from minengine.labs.registry import LABS


@dataclass(frozen=True)
class LabPart:
    """One part of a running engine that a learner wrote: the lab, the engine part it replaces, its source."""

    lab: str
    part: str
    source: str


def check_labs(labs) -> dict[str, str]:
    """``labs`` as given to ``EngineConfig.labs``, validated: a dict of lab names to non-empty strings.

    Raises:
        VLLMValidationError: naming ``labs``: not a dict, an unknown lab (the message lists the labs), a source
            that is not a non-empty string.
    """
    if not isinstance(labs, dict):
        raise VLLMValidationError(f"labs must be a dict of lab name -> file path or module name, got {show(labs)}",
                                  parameter="labs")
    for name, source in labs.items():
        if name not in LABS:
            raise VLLMValidationError(f"labs has unknown lab {show(name)}; the labs are {', '.join(LABS)}",
                                      parameter="labs")
        if not isinstance(source, str) or not source:
            raise VLLMValidationError(f"labs[{name!r}] must be a file path or module name (a non-empty string), "
                                      f"got {show(source)}", parameter="labs")
    return dict(labs)


def load_labs(labs) -> dict[str, ModuleType]:
    """The learner's modules of ``labs`` (``check_labs`` first), in course order.

    Raises:
        VLLMValidationError: naming ``labs``: as ``check_labs``, or a file that is missing or does not import.
    """
    labs = check_labs(labs)
    modules = {}
    for name in sorted(labs, key=lambda n: LABS[n].order):
        try:
            modules[name] = load_submission(labs[name])
        except LabFailure as error:
            raise VLLMValidationError(f"labs[{name!r}]: {error}", parameter="labs") from None
    return modules


class LabEngine:
    """The mixin of ``LabLLMEngine``: an engine whose parts named by ``config.labs`` are the learner's.

    Attributes:
        lab_parts: the learner's parts in this engine (``LabPart``), in course order.

    Raises:
        VLLMValidationError: naming ``labs``: as ``load_labs``; with ``async_scheduling`` (the labs run on the
            synchronous engine); a lab's ``install`` refusing the configuration.
    """

    def __init__(self, config, *args, **kwargs):
        modules = load_labs(config.labs)
        if config.async_scheduling:
            raise VLLMValidationError("labs run on the synchronous engine: leave async_scheduling off",
                                      parameter="labs")
        super().__init__(config, *args, **kwargs)
        self.lab_parts = []
        for name, module in modules.items():
            LABS[name].install(self, module)
            self.lab_parts.append(LabPart(name, LABS[name].part, config.labs[name]))


class LabLLMEngine(LabEngine, LLMEngine):
    """``LLMEngine`` on the learner's parts (``EngineConfig.labs``); everything else is the engine's own."""


def learner_parts(engine) -> list[LabPart]:
    """The learner's parts in ``engine`` (empty for an engine built without ``labs``)."""
    return list(getattr(engine, "lab_parts", ()))


def describe_parts(engine) -> str:
    """One line for a dashboard or a log: which parts of ``engine`` the learner wrote."""
    parts = learner_parts(engine)
    if not parts:
        return "every part is the engine's own (no lab installed)"
    return "learner's parts: " + "; ".join(f"{p.part} <- {p.source}" for p in parts)


def mix_into(obj, mixin: type) -> None:
    """Give ``obj`` the class ``mixin`` + its own class, in place (a lab's methods override the engine part's,
    ``super()`` reaches the engine's own). How an ``install`` changes an object other parts already hold."""
    obj.__class__ = type(f"{mixin.__name__}[{type(obj).__name__}]", (mixin, type(obj)), {})

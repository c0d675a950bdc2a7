"""Engine doors: the ``LLMEngine`` subclass a configuration builds, chosen once at construction.

``LLMEngine(config)`` calls ``engine_class`` from ``LLMEngine.__new__``; the default configuration gets
``LLMEngine`` itself, so the default step is exactly the one ``llm_engine.py`` holds. Each door is a subclass in
its own file, named here by module path and imported only when its feature is asked for (by name, like vLLM's
model registry, so that the base engine never imports its subclasses):

==========================  ==============================================================
feature (what opens it)     engine class
==========================  ==============================================================
``labs``                    ``LabLLMEngine`` (``labs/door.py``: the engine on parts a learner wrote)
``async_scheduling``        ``AsyncSchedulingEngine`` (``engine/async_scheduling_engine.py``)
==========================  ==============================================================
"""

from __future__ import annotations

import importlib

# (the EngineConfig field that opens the door, "module:class"), the first whose field is set wins
ENGINE_DOORS = [
    ("labs", "minengine.labs.door:LabLLMEngine"),
    ("async_scheduling", "minengine.engine.async_scheduling_engine:AsyncSchedulingEngine"),
]


def engine_class(config, default: type) -> type:
    """The engine class ``config`` asks for: the subclass of the first door whose field is set, else ``default``
    (``LLMEngine``)."""
    for field, target in ENGINE_DOORS:
        if getattr(config, field, None):
            module, _, name = target.partition(":")
            return getattr(importlib.import_module(module), name)
    return default

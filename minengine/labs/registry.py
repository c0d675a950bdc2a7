"""The labs: ``LABS`` maps each lab's name to its ``LabSpec``, read from ``minengine/labs/<lab>_lab.py``.

Every ``<lab>_lab.py`` module defines ``SPEC``; the modules are imported the first time ``LABS`` is read, so a
new lab is one new file (and importing ``minengine.labs`` loads none of them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from minengine.labs.check import Check

LABS_PACKAGE = Path(__file__).resolve().parent
SKELETONS = LABS_PACKAGE.parents[1] / "labs"  # the learners' files: labs/<lab>/<lab>.py at the repository root


@dataclass
class LabSpec:
    """One lab.

    Attributes:
        name: the lab's name (``EngineConfig.labs`` key, ``labs/<name>/``).
        title: a short title for tables.
        order: its place in the course (1 = first).
        minutes: the time a learner needs, about.
        teaches: one sentence: what writing the part teaches.
        part: which part of the engine the learner's module replaces (shown by the dashboard).
        skeleton: the learner's starting file.
        solution: module name of the reference solution.
        checks: the grader's checks (``Check``), any order; ``grade`` runs them stage by stage.
        install: ``install(engine, module)``: makes a just-built ``LLMEngine`` run on the learner's module.
    """

    name: str
    title: str
    order: int
    minutes: int
    teaches: str
    part: str
    skeleton: Path
    solution: str
    checks: list[Check] = field(default_factory=list)
    install: Callable = None


class _Labs(dict):
    """A dict that fills itself from the ``*_lab.py`` modules the first time it is read."""

    _loaded = False

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        found = {}
        for path in sorted(LABS_PACKAGE.glob("*_lab.py")):
            spec = importlib.import_module(f"minengine.labs.{path.stem}").SPEC
            found[spec.name] = spec
        for name in sorted(found, key=lambda n: found[n].order):
            dict.__setitem__(self, name, found[name])

    def __getitem__(self, key):
        self._load()
        return dict.__getitem__(self, key)

    def __iter__(self):
        self._load()
        return dict.__iter__(self)

    def __len__(self):
        self._load()
        return dict.__len__(self)

    def __contains__(self, key):
        self._load()
        return dict.__contains__(self, key)

    def keys(self):
        self._load()
        return dict.keys(self)

    def values(self):
        self._load()
        return dict.values(self)

    def items(self):
        self._load()
        return dict.items(self)

    def get(self, key, default=None):
        self._load()
        return dict.get(self, key, default)


LABS: dict[str, LabSpec] = _Labs()


def get_lab(name: str) -> LabSpec:
    """The lab called ``name``. Raises ``KeyError`` naming the labs there are."""
    if name not in LABS:
        raise KeyError(f"no lab called {name!r}; the labs are {', '.join(LABS)}")
    return LABS[name]

"""What a lab's check is made of: ``Check`` (a named function of the learner's module, in a stage), ``LabFailure``
(the words of what broke) and helpers that phrase a failure as "what: expected X, got Y"."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

STAGES = ("unit", "property", "end_to_end")


class LabFailure(AssertionError):
    """A check found the learner's part breaking its contract; the message says how, in words."""


@dataclass
class Check:
    """One check of a lab: ``run(module)`` raises ``LabFailure`` (or anything else) when the part fails it.

    Attributes:
        name: a few words naming what is checked ("get_new_blocks takes the least recently freed block").
        stage: "unit", "property" or "end_to_end".
        run: the check, called with the learner's module.
    """

    name: str
    stage: str
    run: Callable[[ModuleType], None]

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"Check.stage must be one of {STAGES}, got {self.stage!r}")


def expect_equal(what: str, expected, got) -> None:
    """Raise ``LabFailure`` "<what>: expected <expected>, got <got>" unless they are equal."""
    if expected != got:
        raise LabFailure(f"{what}: expected {expected!r}, got {got!r}")


def expect_raises(error_type: type[BaseException], what: str, call: Callable[[], object]) -> None:
    """Raise ``LabFailure`` unless ``call()`` raises ``error_type`` ("<what> must raise <error_type>")."""
    try:
        result = call()
    except error_type:
        return
    except NotImplementedError:
        raise
    except Exception as error:
        raise LabFailure(f"{what} must raise {error_type.__name__}, but raised {type(error).__name__}: {error} (at "
                         f"{where_raised(error)})") from None
    raise LabFailure(f"{what} must raise {error_type.__name__}, but returned {result!r}")


def hypothesis_settings(max_examples: int = 60):
    """Hypothesis settings of the property checks: repeatable (derandomized), no example database written in the
    learner's folder, no deadline (a slow machine is not a wrong part)."""
    from hypothesis import HealthCheck, settings

    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))


def learner_files(*sources) -> set[str]:
    """The resolved paths of the learner's files among ``sources`` (modules, module names already imported, file
    paths); sources without a file are left out."""
    import sys

    files = set()
    for source in sources:
        if isinstance(source, str) and source in sys.modules:
            source = sys.modules[source]
        path = getattr(source, "__file__", None) if isinstance(source, ModuleType) else source
        if isinstance(path, (str, Path)) and str(path).endswith(".py"):
            files.add(str(Path(path).expanduser().resolve()))
    return files


def where_raised(error: BaseException, files: Iterable[str] = ()) -> str:
    """"file:line in function: code" of the line of the learner's code that ``error`` came through: the innermost
    traceback frame in one of ``files`` (``learner_files``); without one, the innermost frame outside the
    minengine package (a library the learner called shows the learner's call, not its own internals, only when
    the learner's file is known); else the innermost frame."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "?"
    files = set(files)
    mine = [f for f in frames if str(Path(f.filename).resolve()) in files]
    outside = [f for f in frames if "minengine" not in Path(f.filename).parts]
    frame = (mine or outside or frames)[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}" + (f": {frame.line}" if frame.line else "")

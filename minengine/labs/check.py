"""What a lab's check is made of: ``Check`` (a named function of the learner's module, in a stage), ``LabFailure``
(the words of what broke) and helpers that phrase a failure as "what: expected X, got Y"."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
        raise LabFailure(f"{what} must raise {error_type.__name__}, but raised {type(error).__name__}: {error}") \
            from None
    raise LabFailure(f"{what} must raise {error_type.__name__}, but returned {result!r}")


def hypothesis_settings(max_examples: int = 60):
    """Hypothesis settings of the property checks: repeatable (derandomized), no example database written in the
    learner's folder, no deadline (a slow machine is not a wrong part)."""
    from hypothesis import HealthCheck, settings

    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))

"""Exercise checks: compare a learner's answer with the value the notebook computed, print PASS or FAIL.

The expected value always comes from a cell that ran the engine or a formula (never typed in), so a check
fails when the engine, the data or the answer changes.
"""

from __future__ import annotations

import math


class Verdict:
    """What a check returns: true for PASS, false for FAIL (``bool(verdict)``). It displays nothing in a notebook
    (the check already printed PASS or FAIL), so a check as a cell's last line adds no stray ``True``."""

    def __init__(self, passed: bool):
        self.passed = bool(passed)

    def __bool__(self) -> bool:
        return self.passed

    def __eq__(self, other) -> bool:
        return bool(self) == bool(other)

    def __hash__(self) -> int:
        return hash(self.passed)

    def __repr__(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def _ipython_display_(self) -> None:
        pass


def _percent(fraction: float) -> str:
    """A tolerance as a percentage with up to 3 significant digits: 0.02 -> "2%", 1e-6 -> "0.0001%"."""
    return f"{fraction * 100:.3g}%"


def _tolerance(rel_tol: float, abs_tol: float) -> str:
    """How close an answer must be, in words: "within 2%", "within 0.0001% or 0.5"."""
    parts = ([_percent(rel_tol)] if rel_tol > 0 else []) + ([f"{abs_tol:g}"] if abs_tol > 0 else [])
    return "equal to" if not parts else "within " + " or ".join(parts) + " of"


def _unanswered(name: str) -> Verdict:
    """The placeholder is still there: say so, without the hint (the learner has not tried yet, and a hint can
    name the formula)."""
    print(f"FAIL  {name}: not answered yet (replace None with your answer)")
    return Verdict(False)


def _fail(name: str, reason: str, hint: str | None) -> Verdict:
    print(f"FAIL  {name}: {reason}" + (f"\n      hint: {hint}" if hint else ""))
    return Verdict(False)


def _pass(name: str, detail: str = "") -> Verdict:
    print(f"PASS  {name}{detail}")
    return Verdict(True)


def check(name: str, answer, expected, hint: str | None = None) -> Verdict:
    """Exact check (``answer == expected``); prints ``PASS  name`` or ``FAIL  name: ...`` and returns the result.

    An answer left as ``None`` (the exercise placeholder) fails with "not answered yet" and no hint (it has not
    been tried; ``hint`` is shown from the first wrong answer on). Strings are compared
    stripped and case-insensitively, so ``"Max_Num_Batched_Tokens "`` matches ``"max_num_batched_tokens"``.
    The expected value is not printed on failure, so the check does not give the answer away.
    """
    if answer is None:
        return _unanswered(name)
    if isinstance(expected, str) and isinstance(answer, str):
        ok = answer.strip().lower() == expected.strip().lower()
    else:
        ok = answer == expected
    if ok:
        return _pass(name)
    return _fail(name, f"got {answer!r}", hint)


def check_close(name: str, answer, expected: float, rel_tol: float = 0.02, abs_tol: float = 0.0,
                hint: str | None = None) -> Verdict:
    """Numeric check within ``rel_tol`` (fraction, default 2 %) or ``abs_tol`` (same unit as the answer).

    Raises:
        ValueError: ``rel_tol`` or ``abs_tol`` negative, or ``expected`` not a finite number.
    """
    if rel_tol < 0 or abs_tol < 0:
        raise ValueError(f"rel_tol and abs_tol must be >= 0, got {rel_tol}, {abs_tol}")
    if not isinstance(expected, (int, float)) or not math.isfinite(expected):
        raise ValueError(f"expected must be a finite number, got {expected!r}")
    if answer is None:
        return _unanswered(name)
    try:
        value = float(answer)
    except (TypeError, ValueError):
        return _fail(name, f"got {answer!r}, which is not a number", hint)
    if math.isclose(value, expected, rel_tol=rel_tol, abs_tol=abs_tol):
        return _pass(name)
    return _fail(name, f"got {value:g}, not {_tolerance(rel_tol, abs_tol)} the measured value", hint)


def check_function(name: str, fn, cases, hint: str | None = None, rel_tol: float | None = None) -> Verdict:
    """Call the learner's function ``fn`` on every ``(args, expected)`` of ``cases`` and compare.

    One exercise instance can hide a wrong formula (floor and ceiling agree when a length divides; two mistakes can
    cancel on one GPU and not on another), so a formula answered as a function is checked on several inputs, each
    with its expected value computed by the notebook (from the engine or a trace). Exact comparison, or with
    ``rel_tol`` (a fraction) every result must be a number within that relative tolerance. Prints PASS, or FAIL
    naming the first failing input (not its expected value) and returns the result.

    Raises:
        ValueError: ``cases`` is empty; ``rel_tol`` negative.
    """
    cases = list(cases)
    if not cases:
        raise ValueError("check_function needs at least one (args, expected) case")
    if rel_tol is not None and not rel_tol >= 0:
        raise ValueError(f"rel_tol must be >= 0, got {rel_tol!r}")
    if fn is None:
        return _unanswered(name)
    if not callable(fn):
        return _fail(name, f"got {fn!r}, which is not a function", hint)
    for args, expected in cases:
        args = args if isinstance(args, tuple) else (args,)
        try:
            got = fn(*args)
        except Exception as err:  # the learner's code: report, do not crash the check
            return _fail(name, f"calling it with {_short(args)} raised {type(err).__name__}: {err}", hint)
        if rel_tol is None:
            ok = got == expected
        else:
            ok = isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(got, expected,
                                                                                             rel_tol=rel_tol)
        if not ok:
            return _fail(name, f"wrong for {_short(args)}: got {got!r}", hint)
    return _pass(name, f" ({len(cases)} cases)")


def _short(args: tuple) -> str:
    """The arguments as a learner reads them: objects with a ``name`` (a model shape, a GPU, a link) by name, a long
    collection (a run's ``request_metrics``) by its type and size instead of pages of repr."""
    return "(" + ", ".join(map(_short_one, args)) + (",)" if len(args) == 1 else ")")


def _short_one(arg) -> str:
    if hasattr(arg, "name") and not isinstance(arg, (int, float, str)):
        return repr(arg.name)
    text = repr(arg)
    if len(text) > 120 and hasattr(arg, "__len__"):
        return f"<{type(arg).__name__} of {len(arg)} items>"
    return text

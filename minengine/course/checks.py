"""Exercise checks: compare a learner's answer with the value the notebook computed, print PASS or FAIL.

The expected value always comes from a cell that ran the engine or a formula (never typed in), so a check
fails when the engine, the data or the answer changes.
"""

from __future__ import annotations

import math


def _fail(name: str, reason: str, hint: str | None) -> bool:
    print(f"FAIL  {name}: {reason}" + (f"\n      hint: {hint}" if hint else ""))
    return False


def check(name: str, answer, expected, hint: str | None = None) -> bool:
    """Exact check (``answer == expected``); prints ``PASS  name`` or ``FAIL  name: ...`` and returns the result.

    An answer left as ``None`` (the exercise placeholder) fails with "not answered yet". Strings are compared
    stripped and case-insensitively, so ``"Max_Num_Batched_Tokens "`` matches ``"max_num_batched_tokens"``.
    The expected value is not printed on failure, so the check does not give the answer away.
    """
    if answer is None:
        return _fail(name, "not answered yet (replace None with your answer)", hint)
    if isinstance(expected, str) and isinstance(answer, str):
        ok = answer.strip().lower() == expected.strip().lower()
    else:
        ok = answer == expected
    if ok:
        print(f"PASS  {name}")
        return True
    return _fail(name, f"got {answer!r}", hint)


def check_close(name: str, answer, expected: float, rel_tol: float = 0.02, abs_tol: float = 0.0,
                hint: str | None = None) -> bool:
    """Numeric check within ``rel_tol`` (fraction, default 2 %) or ``abs_tol`` (same unit as the answer).

    Raises:
        ValueError: ``rel_tol`` or ``abs_tol`` negative, or ``expected`` not a finite number.
    """
    if rel_tol < 0 or abs_tol < 0:
        raise ValueError(f"rel_tol and abs_tol must be >= 0, got {rel_tol}, {abs_tol}")
    if not isinstance(expected, (int, float)) or not math.isfinite(expected):
        raise ValueError(f"expected must be a finite number, got {expected!r}")
    if answer is None:
        return _fail(name, "not answered yet (replace None with your answer)", hint)
    try:
        value = float(answer)
    except (TypeError, ValueError):
        return _fail(name, f"got {answer!r}, which is not a number", hint)
    if math.isclose(value, expected, rel_tol=rel_tol, abs_tol=abs_tol):
        print(f"PASS  {name}")
        return True
    return _fail(name, f"got {value:g}, not within {rel_tol:.0%} of the measured value", hint)

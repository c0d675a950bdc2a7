"""What the page says about the CPU attention kernel (``minengine/layers/cpu_attention.py``): while the engine
builds it or waits for another process's build, and when it fell back to the torch attention path.

``kernel_state()`` reads this process's kernel from ``cpu_attention.status()`` (the background build: states not
started / loading / waiting / building / ready / fallback) or "off" when ``MINENGINE_CPU_KERNEL=0``. The page passes
it to ``kernel_note``, which gives the sentence, or None when there is nothing to say (ready, not started).
"""
from __future__ import annotations

from dataclasses import dataclass

from minengine.layers import cpu_attention
from minengine.viz.i18n import t

STATES = ("not_started", "loading", "waiting", "building", "ready", "fallback", "off")
IN_PROGRESS = ("loading", "waiting", "building")  # states that change by themselves: a page redraws the note


@dataclass(frozen=True)
class KernelState:
    """One look at the kernel: ``state`` in ``STATES`` ("off": switched off by ``MINENGINE_CPU_KERNEL=0``),
    ``reason`` (why it fell back, when known), ``seconds`` (since its start, when known)."""

    state: str
    reason: str = ""
    seconds: float = 0.0


def kernel_state() -> KernelState:
    """Where this process's CPU attention kernel stands (``cpu_attention.status()``, or "off"). Never raises."""
    if cpu_attention.is_disabled():
        return KernelState("off")
    s = cpu_attention.status()
    return KernelState(s.state.name.lower(), s.reason, s.seconds)


def kernel_note(state: KernelState, lang: str) -> tuple[str, str] | None:
    """(kind, text) for the page, kind "info" or "warning"; None when the kernel is ready or not started.

    Raises:
        ValueError: an unknown state or language.
    """
    if state.state not in STATES:
        raise ValueError(f"state must be one of {STATES}, got {state.state!r}")
    if state.state in ("ready", "not_started"):
        t("kernel_building", lang)  # the language is checked either way
        return None
    if state.state == "fallback":
        reason = state.reason or t("kernel_reason_in_log", lang)
        return "warning", t("kernel_fallback", lang).format(reason=reason)
    key = "kernel_loading" if state.state == "loading" else f"kernel_{state.state}"
    return "info", t(key, lang).format(seconds=state.seconds)

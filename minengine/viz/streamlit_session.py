"""The browser session behind a dashboard page, for a feed's thread to ask whether anyone still watches it (a
closed tab ends its feeds). Only the Streamlit pages import this module."""

from __future__ import annotations

from collections.abc import Callable

from streamlit import runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx


def session_alive_check() -> Callable[[], bool] | None:
    """A callable that says whether this browser session is still open (the feed's thread asks it, so a closed
    tab ends its feed); None where there is no Streamlit server (``AppTest``)."""
    ctx = get_script_run_ctx()
    if ctx is None or not runtime.exists():
        return None
    rt, session_id = runtime.get_instance(), ctx.session_id
    return lambda: rt.is_active_session(session_id)

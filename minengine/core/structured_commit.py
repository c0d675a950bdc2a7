"""The structured-outputs door in the scheduler: committed tokens move a constrained request's grammar.

Opened by ``Scheduler.add_request`` with the first request that has a grammar (``Request.structured_output``,
built by ``worker/structured_output.py``): the scheduler's ``append_token`` is wrapped by ``GrammarCommit``. The
grammar state moves only here, with committed tokens, in order. The request stops ("stop") once the grammar has
accepted its stop token, as vLLM's requests stop at the EOS a complete grammar leaves as the only choice, also with
``ignore_eos``. A token the grammar rejects (the sampler's answer to a grammar with no allowed token left in this
vocabulary) is not appended: the request finishes with "abort".
"""

from __future__ import annotations

from collections.abc import Callable

from minengine.request import Request, RequestStatus


class GrammarCommit:
    """``append_token`` for a scheduler with structured outputs: requests without a grammar go to ``plain``."""

    def __init__(self, plain: Callable[[Request, int], RequestStatus | None]):
        self.plain = plain

    def __call__(self, request: Request, token: int) -> RequestStatus | None:
        grammar = request.structured_output
        if grammar is None:
            return self.plain(request, token)
        if not grammar.accept_token(token):
            return RequestStatus.FINISHED_ABORTED
        status = self.plain(request, token)
        if status is None and grammar.is_terminated():
            return RequestStatus.FINISHED_STOPPED
        return status


def open_structured_outputs_door(scheduler) -> None:
    """Wrap ``scheduler.append_token`` with ``GrammarCommit`` (once)."""
    if not isinstance(scheduler.append_token, GrammarCommit):
        scheduler.append_token = GrammarCommit(scheduler.append_token)

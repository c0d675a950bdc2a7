"""Drive an ``LLMEngine`` the way the chapters need: to completion, or with requests joining at given steps.
(Timed arrivals on a virtual clock are ``minengine.workloads.replay``'s job.)"""

from __future__ import annotations

from collections.abc import Iterable


def run_to_completion(engine, max_steps: int = 100_000) -> dict:
    """Step ``engine`` until no request is unfinished; returns {request_id: final RequestOutput}.

    Raises:
        ValueError: ``max_steps`` < 1.
        RuntimeError: requests still unfinished after ``max_steps`` steps (a stuck run, not a slow one).
    """
    return run_with_arrivals(engine, [], max_steps)


def run_with_arrivals(engine, arrivals: Iterable[tuple[int, str, object, object]], max_steps: int = 100_000) -> dict:
    """Add each request just before step ``k`` (0 = before the first step), step until all finish.

    Args:
        engine: an ``LLMEngine`` (anything with ``add_request``, ``step``, ``has_unfinished_requests``).
        arrivals: ``(step_index, request_id, prompt, SamplingParams)`` tuples, in any order.
        max_steps: safety limit on the number of steps.

    Returns:
        {request_id: the last RequestOutput of that request}, for every request that finished.

    Raises:
        ValueError: ``max_steps`` < 1 or a negative step index.
        RuntimeError: still unfinished after ``max_steps`` steps.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    pending = sorted(arrivals, key=lambda a: a[0])
    if pending and pending[0][0] < 0:
        raise ValueError(f"arrival step indices must be >= 0, got {pending[0][0]}")
    finished: dict = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        if step >= max_steps:
            raise RuntimeError(f"requests still unfinished after max_steps={max_steps} steps")
        while pending and pending[0][0] <= step:
            _, request_id, prompt, params = pending.pop(0)
            engine.add_request(request_id, prompt, params)
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        step += 1
    return finished


"""Chapter 9's helpers: run ``python -m minengine serve`` as a real process (``ServerProcess``, from
``minengine.entrypoints.server_process``), read its ``/metrics`` and its step feed.

Nothing here serves requests: the server is the project's own CLI in a subprocess (the same command a user runs),
the requests go through the official ``openai`` client or ``httpx``, and ``/metrics`` is parsed with
``prometheus_client``'s text parser.
"""

from __future__ import annotations

import json
import time

import httpx

# re-exported: chapter 9 starts its server with these (they live with the other entry points)
from minengine.entrypoints.server_process import ServerProcess, ServerStartError, child_env, free_port
from minengine.metrics.trace import StepTrace
from minengine.viz.live import trace_from_dict

__all__ = ["ServerProcess", "ServerStartError", "child_env", "free_port", "metric", "read_metrics", "read_steps"]

def read_metrics(url: str) -> dict:
    """``GET url/metrics`` parsed with ``prometheus_client``: {family name: family} (names without ``_total``)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def metric(families: dict, name: str, sample: str | None = None, **labels) -> float:
    """The value of one sample: family ``name`` (e.g. "vllm:generation_tokens"), sample name ``sample`` (default:
    the family's ``_total`` for counters, else the family name), whose labels include ``labels``; 0.0 when the
    family has no such sample yet (a labelled counter that never moved).

    Raises:
        KeyError: no family ``name``.
    """
    family = families[name]
    wanted = sample or (name + "_total" if family.type == "counter" else name)
    for s in family.samples:
        if s.name == wanted and all(s.labels.get(k) == str(v) for k, v in labels.items()):
            return s.value
    return 0.0


def _trace_from_event(data: dict) -> StepTrace:
    """A step event's ``StepTrace`` (the event adds ``duration`` and ``num_dropped`` to ``StepTrace.to_dict()``)."""
    return trace_from_dict({k: v for k, v in data.items() if k in StepTrace.__dataclass_fields__})


def read_steps(url: str, history: int, timeout_s: float = 30.0) -> tuple[dict, list[StepTrace]]:
    """The server's last ``history`` steps from ``GET url/v1/engine/steps?history=N`` (server-sent events): the
    ``engine`` event (a dict) and the replayed steps as ``StepTrace``s. Returns once the replay reaches the step the
    server had done when the feed opened (or nothing was to replay).

    Raises:
        TimeoutError: the replay did not arrive within ``timeout_s``.
    """
    engine, steps, event = None, [], None
    with httpx.stream("GET", url + "/v1/engine/steps", params={"history": history, "block_tables": "false"},
                      timeout=timeout_s) as response:
        deadline = time.monotonic() + timeout_s
        for line in response.iter_lines():
            if time.monotonic() > deadline:
                raise TimeoutError("the step feed did not replay its history in time")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if event == "engine":
                    engine = data
                    if engine["num_steps"] == 0 or history == 0:
                        return engine, steps
                elif event == "step":
                    steps.append(_trace_from_event(data))
                    if data["step"] >= engine["num_steps"] - 1:
                        return engine, steps
    return engine, steps

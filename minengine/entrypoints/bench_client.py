"""``bench-serve --base-url``: replay a trace against any OpenAI-compatible server (minengine's, vLLM's, ...).

The client side of vLLM's ``benchmark_serving.py``: each trace request is sent at its arrival time (wall
clock, after ``--speedup``) as a streaming ``/v1/completions`` request with the prompt as token ids,
``max_tokens`` = its output length, greedy, ``ignore_eos`` (a vLLM extension, also SGLang's), and usage in
the last chunk. Times are measured on the client: TTFT = first chunk with text - send time; ITL = gaps
between later chunks. The result is a ``RequestMetrics`` per request, so the same ``ServingBenchmark`` table
as the in-process replay is printed, and one client measures both engines.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from minengine.outputs import RequestMetrics
from minengine.workloads.replay import _fit
from minengine.workloads.traces import TraceRequest, synthetic_prompt_ids


@dataclass
class HttpReplayResult:
    """What the client measured. Times in seconds on the client's ``time.perf_counter`` clock.

    Attributes:
        request_metrics: per request id (successful requests only).
        errors: per failed request id, the error message.
        model: the model name the requests used; max_model_len: the server's (from ``/v1/models``), or None.
        num_clipped: requests cut to fit ``max_model_len``.
        wall_time_s: real seconds the replay took.
    """

    request_metrics: dict[str, RequestMetrics] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    model: str = ""
    max_model_len: int | None = None
    num_clipped: int = 0
    wall_time_s: float = 0.0


async def _server_model(client: httpx.AsyncClient, model: str | None) -> tuple[str, int | None]:
    """The model to use (``model`` or the server's first) and its ``max_model_len`` if the server says."""
    r = await client.get("/v1/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    if model is None:
        if not data:
            raise ValueError("the server lists no model: pass --served-model-name")
        model = data[0]["id"]
    entry = next((m for m in data if m.get("id") == model), {})
    return model, entry.get("max_model_len")


async def _one(client: httpx.AsyncClient, model: str, rid: str, prompt: list[int], max_tokens: int,
               result: HttpReplayResult) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    m = RequestMetrics(arrival_time=time.perf_counter(), num_prompt_tokens=len(prompt))
    chunks, last = 0, None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                raise ValueError(f"HTTP {r.status_code}: {r.text[:200]}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    raise ValueError(data["error"].get("message", "error"))
                if data.get("usage"):
                    m.num_output_tokens = data["usage"]["completion_tokens"]
                if not any(c.get("text") for c in data.get("choices", ())):
                    continue
                t = time.perf_counter()
                if m.first_token_time is None:
                    m.first_token_time = t
                else:
                    m.itls.append(t - last)
                last, chunks = t, chunks + 1
    except (httpx.HTTPError, ValueError) as exc:
        result.errors[rid] = str(exc)
        return
    m.finished_time = time.perf_counter()
    m.num_output_tokens = m.num_output_tokens or chunks
    m.finish_reason = "length"
    result.request_metrics[rid] = m


async def replay_http(base_url: str, trace: Sequence[TraceRequest], *, model: str | None = None,
                      vocab_size: int = 2048, seed: int = 0, max_concurrency: int | None = None,
                      timeout_s: float = 600.0) -> HttpReplayResult:
    """Send every trace request at its arrival time to ``base_url`` and measure it.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` (``/v1`` is appended by the routes).
        trace: the requests (arrival times in seconds from 0, real time).
        model: the model name to send; None = the first of the server's ``/v1/models``.
        vocab_size: synthetic prompt ids are drawn below this (the server's model must have at least this
            many tokens; the default is the bundled model's).
        seed: seed of the synthetic prompt ids (as the in-process replay's).
        max_concurrency: most requests in flight (vLLM's ``--max-concurrency``); None = no limit.
        timeout_s: per-request timeout.

    Raises:
        ValueError: no model; httpx.HTTPError: the server cannot be reached.
    """
    base = base_url.rstrip("/")
    base = base[:-3] if base.endswith("/v1") else base
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    result = HttpReplayResult()
    async with httpx.AsyncClient(base_url=base, timeout=timeout_s, limits=limits) as client:
        result.model, result.max_model_len = await _server_model(client, model)
        limit = result.max_model_len
        gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        start = time.perf_counter()

        async def send(r: TraceRequest) -> None:
            prompt_len, output_len = r.prompt_len, r.output_len
            if limit is not None and prompt_len + output_len > limit:
                prompt_len, output_len = _fit(prompt_len, output_len, limit)
                result.num_clipped += 1
            ids = (r.prompt_token_ids[:prompt_len] if r.prompt_token_ids is not None
                   else synthetic_prompt_ids(r.request_id, prompt_len, vocab_size, seed))
            await asyncio.sleep(max(0.0, start + r.arrival_time - time.perf_counter()))
            if gate is None:
                await _one(client, result.model, r.request_id, ids, output_len, result)
            else:
                async with gate:
                    await _one(client, result.model, r.request_id, ids, output_len, result)

        await asyncio.gather(*(send(r) for r in sorted(trace, key=lambda r: r.arrival_time)))
        result.wall_time_s = time.perf_counter() - start
    return result

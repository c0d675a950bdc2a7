"""Check the fleet simulator against a real fleet: replay one trace window through vllm-router in front of real
``minengine serve`` replicas, and the same window through ``FleetSimulator`` configured as that fleet.

The real side (``replay_through_router``): every request of the window is sent at its (time-scaled) arrival with the
official ``openai`` client, streaming, so the time to first token is measured where a user sees it. Which replica
served it and how many of its prompt tokens that replica's prefix cache held come from the replicas' own steps (their
step feed's history, ``minengine.viz.router_feed.route_requests``): a request's admission step schedules it from
``start_pos`` = its cached tokens (the engine starts a prefix hit there).

The twin (``twin_config`` + ``simulate_window``): the same replica count, the replicas' own engine settings (read from
their step feed), the served model's shape, and a clock fitted to the replicas' measured steps
(``measure_step_costs``: a few requests sent straight to one replica, each step's ``StepWork`` against its measured
seconds, ``minengine.timing.calibration.fit_hardware``), so the simulator's ``ModelledClock`` runs at the
replicas' speed.

Prompts must be text: vllm-router routes ``/v1/completions`` on the prompt's text (``extract_text_for_routing``).
``text_window`` decodes each trace prompt's token ids to text and tokenizes that text again, as the server will, so
both sides run the same token ids and prompts that share leading tokens in the trace share leading text.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from minengine.fleet.config import FleetConfig, ReplicaSpec
from minengine.fleet.simulator import simulate
from minengine.metrics.trace import StepTrace
from minengine.timing.calibration import CalibrationPoint, fit_hardware
from minengine.timing.cost_model import StepWork
from minengine.timing.hardware import Hardware
from minengine.timing.model_shape import ModelShape
from minengine.viz.router_feed import route_requests
from minengine.viz.server_feed import ServerFeed
from minengine.workloads.traces import TraceRequest

# the real router's policy names (vllm-router --policy) and the simulator's routers that implement their rules
POLICY_ROUTERS = {"round_robin": "round-robin", "power_of_two": "power-of-two", "cache_aware": "cache-aware"}


def shared_prefix_requests(trace: Sequence[TraceRequest], num_prefixes: int, prefix_tokens: int,
                           max_requests: int | None = None) -> list[TraceRequest]:
    """The requests of ``trace`` that start with one of its ``num_prefixes`` most common leading ``prefix_tokens``
    token ids (ties: the prefix seen first), in arrival order, at most ``max_requests``: conversations that re-send
    their history, where a router's placement decides the prefix hits. For a Mooncake trace, ``prefix_tokens`` =
    ``Trace.tokens_per_hash_block`` groups requests by their first hash block.

    Raises:
        ValueError: ``num_prefixes`` or ``prefix_tokens`` < 1; a request without ``prompt_token_ids``.
    """
    if num_prefixes < 1 or prefix_tokens < 1:
        raise ValueError(f"num_prefixes and prefix_tokens must be >= 1, got {num_prefixes!r}, {prefix_tokens!r}")
    if any(r.prompt_token_ids is None for r in trace):
        raise ValueError("shared_prefix_requests needs prompt_token_ids on every request")
    ordered = sorted(trace, key=lambda r: r.arrival_time)
    counts = Counter(tuple(r.prompt_token_ids[:prefix_tokens]) for r in ordered)  # insertion order: first seen
    top = {p for p, _ in counts.most_common(num_prefixes)}
    chosen = [r for r in ordered if tuple(r.prompt_token_ids[:prefix_tokens]) in top]
    return chosen if max_requests is None else chosen[:max_requests]


@dataclass(frozen=True)
class WindowRequest:
    """One request of a replay: ``arrival_s`` seconds after the replay starts, its ``prompt`` text, the token ids the
    server makes of it, and ``max_tokens`` (sent with ``ignore_eos``: exactly that many tokens come back)."""

    request_id: str
    arrival_s: float
    prompt: str
    prompt_token_ids: list[int]
    max_tokens: int


def text_window(trace: Sequence[TraceRequest], tokenizer, time_scale: float = 1.0,
                max_tokens: int | None = None) -> list[WindowRequest]:
    """Text requests for a trace window (requests with ``prompt_token_ids``, e.g. ``load_mooncake_trace``).

    Args:
        trace: the window, any order; arrivals are counted from its first one.
        tokenizer: the served model's tokenizer (``decode`` and ``encode``, Hugging Face's API).
        time_scale: arrival gaps are multiplied by this (> 1 slows the window down for CPU replicas).
        max_tokens: at most this many output tokens per request (None: the trace's output lengths); at least 1.

    Raises:
        ValueError: a request without ``prompt_token_ids``, ``time_scale`` <= 0 or ``max_tokens`` < 1.
    """
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens!r}")
    if not trace:
        return []
    first = min(r.arrival_time for r in trace)
    out = []
    for r in sorted(trace, key=lambda r: r.arrival_time):
        if r.prompt_token_ids is None:
            raise ValueError(f"request {r.request_id!r} has no prompt_token_ids: a text window needs them")
        text = tokenizer.decode(r.prompt_token_ids, skip_special_tokens=True)
        ids = tokenizer.encode(text)
        n = max(1, r.output_len if max_tokens is None else min(r.output_len, max_tokens))
        out.append(WindowRequest(r.request_id, (r.arrival_time - first) * time_scale, text, ids, n))
    return out


@dataclass(frozen=True)
class RequestRecord:
    """One request as served: the ``replica`` index (the fleet's workers sorted by host and port), its arrival and
    time to first token (seconds), its prompt, prefix-cache-hit and output tokens, and ``prefill_s``: seconds from the
    start of the first engine step that scheduled it to the end of the step that sampled its first token (the
    replica's step clock; the twin's modelled one), the part of its TTFT spent in engine steps after it was admitted."""

    request_id: str
    replica: int
    arrival_s: float
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    prefill_s: float


@dataclass(frozen=True)
class ReplayResult:
    """A window's records (arrival order) on a fleet of ``num_replicas``."""

    records: list[RequestRecord]
    num_replicas: int

    def requests_per_replica(self) -> list[int]:
        """Requests each replica served, by replica index."""
        counts = [0] * self.num_replicas
        for r in self.records:
            counts[r.replica] += 1
        return counts

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens served from a prefix cache over all prompt tokens (0 without requests)."""
        prompt = sum(r.prompt_tokens for r in self.records)
        return sum(r.cached_tokens for r in self.records) / prompt if prompt else 0.0

    def ttft_percentile(self, q: float, field: str = "ttft_s") -> float:
        """The ``q``-th percentile (0-100, linear interpolation) of the time to first token (or of another
        ``RequestRecord`` field in seconds, e.g. "prefill_s"), seconds."""
        values = sorted(getattr(r, field) for r in self.records)
        if not values:
            raise ValueError("no requests")
        k = (len(values) - 1) * q / 100
        lo = int(k)
        hi = min(lo + 1, len(values) - 1)
        return values[lo] + (values[hi] - values[lo]) * (k - lo)


# ---- the real fleet ------------------------------------------------------------------------------------------
def replica_steps(url: str, timeout_s: float = 30.0) -> tuple[dict, list[StepTrace]]:
    """(the ``engine`` event, every step the server still keeps) of a ``minengine serve`` at ``url``: its step
    feed's history (``serve --max-history-steps``, 10,000 by default), full request ids, no block tables.

    Raises:
        RuntimeError: the feed failed, or its history did not come within ``timeout_s``.
    """
    feed = ServerFeed(url, history=10**9, block_tables=False, short_ids=False, metrics_every_s=0,
                      max_pending=0).start()  # 0: keep every step until taken
    deadline = time.monotonic() + timeout_s
    try:
        while feed.info is None and feed.error is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if feed.info is None:
            raise RuntimeError(f"{url}: its step feed did not start within {timeout_s:g} s ({feed.error})")
        expected = int(feed.info.get("history_steps", 0))
        while feed.num_received < expected and feed.error is None and time.monotonic() < deadline:
            time.sleep(0.02)
        steps = feed.poll(10**9)
    finally:
        feed.stop()
    if len(steps) < expected:
        raise RuntimeError(f"{url}: {len(steps)} of its {expected} kept steps came within {timeout_s:g} s")
    return dict(feed.info), steps


def admission_hits(steps: Sequence[StepTrace]) -> dict[str, int]:
    """Request id -> prompt tokens its prefix cache hit: where its first admission step schedules it from."""
    hits: dict[str, int] = {}
    for step in steps:
        for chunk in step.chunks:
            if chunk.request_id in step.admitted_ids and chunk.request_id not in hits:
                hits[chunk.request_id] = chunk.start_pos
    return hits


def prefill_spans(steps: Sequence[StepTrace]) -> dict[str, float]:
    """Request id -> seconds from the start of the first step that scheduled it to the end of the first step that
    sampled for it (its first token)."""
    start: dict[str, float] = {}
    spans: dict[str, float] = {}
    for step in steps:
        for chunk in step.chunks:
            rid = chunk.request_id
            start.setdefault(rid, step.start_time)
            if chunk.sampled and rid not in spans:
                spans[rid] = step.end_time - start[rid]
    return spans


def _run(coro):
    """``asyncio.run(coro)``; in a thread of its own when this thread already runs an event loop (a notebook's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _send(client, model: str, req: WindowRequest, start: float) -> tuple[str, float, int, int]:
    """Send ``req`` at its arrival (``start``: the loop time of the replay's start); returns (the server's request
    id, TTFT seconds, prompt tokens, output tokens) from the streamed chunks."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start + req.arrival_s - loop.time()))
    sent = time.perf_counter()
    stream = await client.completions.create(
        model=model, prompt=req.prompt, max_tokens=req.max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    server_id, ttft, usage = "", None, None
    async for chunk in stream:
        server_id = chunk.id
        if ttft is None and chunk.choices:
            ttft = time.perf_counter() - sent
        if chunk.usage is not None:
            usage = chunk.usage
    if ttft is None or usage is None:
        raise RuntimeError(f"request {req.request_id}: the stream ended without a token or without usage")
    return server_id, ttft, usage.prompt_tokens, usage.completion_tokens


async def _send_all(base_url: str, window: Sequence[WindowRequest], model: str | None, timeout_s: float):
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=timeout_s) as client:
        if model is None:
            model = (await client.models.list()).data[0].id
        start = asyncio.get_running_loop().time()
        return await asyncio.gather(*(_send(client, model, r, start) for r in window))


def replay_through_router(router_url: str, worker_urls: Sequence[str], window: Sequence[WindowRequest],
                          model: str | None = None, timeout_s: float = 300.0) -> ReplayResult:
    """Send ``window`` through the router at ``router_url`` (streaming, ``openai`` client) and say, from the
    replicas' steps, where each request ran and what its prefix cache held.

    Args:
        router_url: the fleet's endpoint, e.g. "http://127.0.0.1:8000".
        worker_urls: the replicas behind it; replica indices follow their (host, port) order.
        window: the requests (``text_window``).
        model: the served model's name (None: the first ``/v1/models`` lists).
        timeout_s: seconds one request may take.

    Raises:
        RuntimeError: a request's stream carried no token or no usage; the server counted other prompt tokens
            than ``WindowRequest.prompt_token_ids``; a request missing from every replica's kept steps.
    """
    sent = _run(_send_all(router_url, window, model, timeout_s))
    workers = sorted(worker_urls, key=lambda u: (httpx.URL(u).host, httpx.URL(u).port))
    steps = {u: replica_steps(u)[1] for u in workers}
    routes = {r.request_id: r.replica for r in route_requests(steps).routes}
    hits = {rid: n for s in steps.values() for rid, n in admission_hits(s).items()}
    spans = {rid: t for s in steps.values() for rid, t in prefill_spans(s).items()}
    records = []
    for req, (server_id, ttft, prompt_tokens, output_tokens) in zip(window, sent):
        engine_id = f"{server_id}-0"  # the server queues prompt i of a completion as "<id>-i"
        if prompt_tokens != len(req.prompt_token_ids):
            raise RuntimeError(f"request {req.request_id}: the server counted {prompt_tokens} prompt tokens, "
                               f"text_window {len(req.prompt_token_ids)} (another tokenizer?)")
        if engine_id not in routes or engine_id not in hits:
            raise RuntimeError(f"request {req.request_id} ({engine_id}) is in no replica's kept steps: raise "
                               f"serve --max-history-steps")
        records.append(RequestRecord(req.request_id, workers.index(routes[engine_id]), req.arrival_s, ttft,
                                     prompt_tokens, hits[engine_id], output_tokens, spans[engine_id]))
    return ReplayResult(records, len(workers))


# ---- the clock: measured steps of one replica ------------------------------------------------------------------
def _completion(url: str, prompt_ids: list[int], max_tokens: int) -> str:
    """One request straight to a replica (token ids, ``ignore_eos``); returns its engine request id."""
    body = {"model": _model(url), "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}
    return _engine_id(httpx.post(url + "/v1/completions", json=body, timeout=120))


def _engine_id(reply: httpx.Response) -> str:
    """The engine request id of a completion's reply; ``RuntimeError`` with the server's message if it failed."""
    if reply.status_code != 200:
        raise RuntimeError(f"{reply.request.url} answered HTTP {reply.status_code}: {reply.text[:300]}")
    return reply.json()["id"] + "-0"


async def _completions_at_once(url: str, prompts: list[list[int]], max_tokens: int) -> list[str]:
    """``_completion`` for every prompt at once; their engine request ids."""
    body = {"model": _model(url), "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=120) as client:
        replies = await asyncio.gather(*(client.post(url + "/v1/completions", json={**body, "prompt": p})
                                         for p in prompts))
    return [_engine_id(reply) for reply in replies]


def _model(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]


@dataclass(frozen=True)
class StepCosts:
    """A replica's fitted clock: ``hardware`` (a ``Hardware`` with ``combine="sum"``), the measured ``points``
    (every step of the measurement, with the fit's prediction), and the fit's ``r2``, ``worst_relative_error``
    and ``median_relative_error``."""

    hardware: Hardware
    points: list[CalibrationPoint]
    r2: float
    worst_relative_error: float
    median_relative_error: float


def measure_step_costs(url: str, shape: ModelShape, prompt_lens: Sequence[int] = (16, 64, 256, 1024, 2000),
                       batch_sizes: Sequence[int] = (1, 4, 8), cached_lens: Sequence[int] = (1024, 2000),
                       decode_tokens: int = 8, seed: int = 0) -> StepCosts:
    """Fit the simulator's step cost to one running replica at ``url``: each prompt length alone (one prefill step
    and a decode), each batch size of requests decoding together, and for each of ``cached_lens`` a prompt sent
    twice, the second time with 16 more tokens (a prefix hit: a few new tokens after that many cached ones, the
    step a re-sent conversation makes); random token ids, and the replica's prefix cache is reset afterwards. Lengths
    the replica's ``max_model_len`` cannot hold (with their output) are left out. Every step those requests ran in,
    its ``StepWork`` against its measured seconds (``end_time - start_time`` on the server), goes into
    ``fit_hardware``.

    Raises:
        ValueError: fewer than 4 steps measured (as ``fit_hardware``).
        RuntimeError: the replica refused a request (its message is quoted).
    """
    rng, ids = random.Random(seed), set()
    vocab, limit = shape.vocab_size, replica_steps(url)[0]["max_model_len"]
    for n in (n for n in prompt_lens if n + 2 <= limit):
        ids.add(_completion(url, [rng.randrange(vocab) for _ in range(n)], 2))
    for n in (n for n in cached_lens if n + 16 + 2 <= limit):
        prompt = [rng.randrange(vocab) for _ in range(n)]
        ids.add(_completion(url, prompt, 2))
        ids.add(_completion(url, prompt + [rng.randrange(vocab) for _ in range(16)], 2))
    for b in batch_sizes:  # b requests at once: they decode in the same steps
        prompts = [[rng.randrange(vocab) for _ in range(32)] for _ in range(b)]
        ids.update(_run(_completions_at_once(url, prompts, decode_tokens)))
    steps = [s for s in replica_steps(url)[1] if s.chunks and all(c.request_id in ids for c in s.chunks)]
    httpx.post(url + "/reset_prefix_cache", timeout=30)
    points = [CalibrationPoint("prefill" if any(c.is_prefill for c in s.chunks) else "decode",
                               sum(c.num_tokens for c in s.chunks), StepWork.from_step_trace(s),
                               s.end_time - s.start_time) for s in steps]
    hardware, fitted, r2, worst = fit_hardware(points, shape, name="CPU replica (fitted)",
                                               source=f"measured steps of {url}")
    return StepCosts(hardware, fitted, r2, worst, statistics.median(p.relative_error for p in fitted))


# ---- the twin ---------------------------------------------------------------------------------------------------
def twin_config(info: dict, hardware: Hardware, shape: ModelShape, num_replicas: int, router: str,
                seed: int = 0) -> FleetConfig:
    """The simulated fleet of ``num_replicas`` replicas like the real one: the engine settings of a replica's
    ``engine`` event (``replica_steps``), its model ``shape``, the fitted ``hardware``, the simulator's ``router``.

    Raises:
        ValueError: as ``FleetConfig`` (an unknown router, ...).
    """
    spec = ReplicaSpec("mixed", hardware, 1, info["num_kv_blocks"])
    return FleetConfig(replicas=(spec,) * num_replicas, model=shape, router=router, seed=seed,
                       max_num_batched_tokens=info["max_num_batched_tokens"], max_num_seqs=info["max_num_seqs"],
                       block_size=info["block_size"], enable_chunked_prefill=info["enable_chunked_prefill"],
                       enable_prefix_caching=info["enable_prefix_caching"], max_model_len=info["max_model_len"],
                       scheduling_policy=info["scheduling_policy"], preemption_mode=info["preemption_mode"])


def simulate_window(window: Sequence[WindowRequest], config: FleetConfig) -> ReplayResult:
    """``window`` through the simulator on ``config``: the same token ids, arrivals and output lengths."""
    trace = [TraceRequest(arrival_time=r.arrival_s, prompt_len=len(r.prompt_token_ids), output_len=r.max_tokens,
                          prompt_token_ids=list(r.prompt_token_ids), request_id=r.request_id) for r in window]
    result = simulate(trace, config)
    records = []
    for r in window:
        m = result.request_metrics[r.request_id]
        records.append(RequestRecord(r.request_id, result.assignments[r.request_id][0], r.arrival_s, m.ttft,
                                     m.num_prompt_tokens, m.num_cached_tokens, m.num_output_tokens,
                                     m.first_token_time - m.first_scheduled_time))
    return ReplayResult(records, len(config.replicas))

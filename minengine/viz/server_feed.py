"""Attach to a running ``python -m minengine serve``: read its step feed (``GET /v1/engine/steps``, server-sent
events) in a background thread and hand the steps over as ``StepTrace``s, so the dashboard's live view
(``minengine.viz.live.LivePlayer``) animates a real server scheduling real clients with the same figures as a
local run; and read its ``GET /metrics`` (Prometheus text) every few seconds for a few headline numbers.

``ServerFeed`` is a ``TraceStream``: ``poll`` returns the steps received since the last call. Connecting, reading
and the metrics all happen in the feed's own thread (an asyncio loop with ``httpx`` and ``httpx-sse``), so a
page that polls it never waits on the network: a bad URL, a server that is not minengine, a connection that
drops, or steps the server dropped for a slow reader each end up as a plain state on the feed (``state``,
``error``, ``num_dropped``) for the page to say in words. ``stop()`` ends the thread at once (the read is
cancelled, even on an idle feed); an ``alive`` callback lets the owner (a browser session) end it too.

The server's clock is its engine's (``clock`` of the ``engine`` event: "wall", i.e. ``time.perf_counter``
seconds, for ``minengine serve``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from httpx_sse import SSEError, aconnect_sse
from prometheus_client.parser import text_string_to_metric_families

from minengine.metrics.trace import StepTrace
from minengine.viz.live import trace_from_dict

FEED_PATH = "/v1/engine/steps"
METRICS_PATH = "/metrics"
DEFAULT_URL = "http://127.0.0.1:8000"
# What the feed's first event must describe for the server to count as minengine's.
ENGINE_FIELDS = ("block_size", "num_kv_blocks", "max_num_batched_tokens", "max_num_seqs")
ERROR_KINDS = ("unreachable", "not_minengine", "bad_event", "dropped")
_HEX_ID = re.compile(r"\b([0-9a-f]{8})[0-9a-f]{24}\b")  # the uuid4 hex of the server's request ids


@dataclass(frozen=True)
class FeedError:
    """Why a feed failed. ``kind``: "unreachable" (no connection: nothing listens, a wrong host, a timeout),
    "not_minengine" (something answered, but not with minengine's step feed), "bad_event" (a step event that
    does not decode: another minengine version?) or "dropped" (the connection broke, or the server ended the
    feed, after it worked); ``detail`` is the underlying message."""

    kind: str
    detail: str


def check_url(url: str) -> str:
    """``url`` without surrounding blanks or a trailing slash, e.g. "http://127.0.0.1:8000" (a path prefix, as
    behind a reverse proxy, is kept).

    Raises:
        ValueError: not an http(s) URL with a host (e.g. "localhost:8000" without "http://"), or one with a
            query or a fragment.
    """
    url = (url or "").strip().rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a port that is not a number in 0..65535)
    except ValueError as exc:
        raise ValueError(f"url {url!r} is not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url must look like http://HOST:PORT (a running `python -m minengine serve`), "
                         f"got {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"url must be the server's base URL, without ?query or #fragment, got {url!r}")
    return url


def short_request_id(request_id: str) -> str:
    """A server request id shortened for figure labels: the 32 hex digits of its uuid cut to the first 8 and an
    ellipsis ("cmpl-71418df7…-0"); other ids unchanged."""
    return _HEX_ID.sub(r"\1…", request_id)


def rename_requests(trace: StepTrace, rename: Callable[[str], str] = short_request_id) -> StepTrace:
    """A copy of ``trace`` with every request id passed through ``rename`` (default ``short_request_id``)."""
    s = rename
    return dataclasses.replace(
        trace, chunks=[dataclasses.replace(c, request_id=s(c.request_id)) for c in trace.chunks],
        preempted_ids=[s(r) for r in trace.preempted_ids], admitted_ids=[s(r) for r in trace.admitted_ids],
        finished_ids=[s(r) for r in trace.finished_ids], timed_out_ids=[s(r) for r in trace.timed_out_ids],
        block_tables=None if trace.block_tables is None else {s(r): v for r, v in trace.block_tables.items()})


def summarize_metrics(text: str) -> dict[str, float | None]:
    """A few headline numbers from a ``/metrics`` page (Prometheus text, vLLM's series names), summed over
    labels: ``running``, ``waiting`` (requests), ``kv_cache_usage`` (0..1), ``preemptions``,
    ``requests_finished``, ``prompt_tokens``, ``generation_tokens`` (counts since the server started),
    ``prefix_hit_rate`` (hit / queried prompt tokens; None before any query) and ``ttft_mean_s``,
    ``itl_mean_s``, ``e2e_mean_s`` (histogram sum / count, seconds; None before the first sample).
    A series the page lacks is None.

    Raises:
        ValueError: the text is not in the Prometheus format.
    """
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name] = samples.get(s.name, 0.0) + s.value

    def get(name: str) -> float | None:
        return samples.get(name)

    def ratio(num: str, den: str) -> float | None:
        n, d = get(num), get(den)
        return None if n is None or not d else n / d

    return {
        "running": get("vllm:num_requests_running"), "waiting": get("vllm:num_requests_waiting"),
        "kv_cache_usage": get("vllm:kv_cache_usage_perc"), "preemptions": get("vllm:num_preemptions_total"),
        "requests_finished": get("vllm:request_success_total"), "prompt_tokens": get("vllm:prompt_tokens_total"),
        "generation_tokens": get("vllm:generation_tokens_total"),
        "prefix_hit_rate": ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
        "ttft_mean_s": ratio("vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count"),
        "itl_mean_s": ratio("vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count"),
        "e2e_mean_s": ratio("vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count"),
    }


class _NotMinengine(Exception):
    pass


class ServerFeed:
    """A running server's step feed, read in a background thread; a ``TraceStream``.

    Args:
        url: the server's base URL, e.g. "http://127.0.0.1:8000" (``check_url``).
        history: steps the server replays first (``?history=``), so the figures do not start empty.
        block_tables: ask for block tables, ref counts and cached ids (``?block_tables=``; the pool and table
            figures need them).
        short_ids: rename requests for the figures: the server's id shortened (``short_request_id``) and
            " #n", the order in which this feed first saw it ("cmpl-71418df7…-0 #17"); n also picks the
            request's colour (``minengine.viz.colors.request_color``), so requests running together differ.
        connect_timeout_s: seconds to wait for a connection (then "unreachable").
        first_event_timeout_s: seconds to wait for the ``engine`` event once connected (then "not_minengine").
        idle_timeout_s: seconds without a byte (an idle minengine feed sends a keep-alive every 15 s) before
            the connection counts as dropped.
        metrics_every_s: seconds between two reads of ``/metrics`` (0 = never).
        max_pending: steps kept for ``poll`` (a paused view); older ones are lost and counted in ``num_lost``.
        api_key: sent as ``Authorization: Bearer <key>`` with every read (a server started with ``--api-key``
            guards its feed and ``/metrics``); None sends none.
        alive: called about once a second from the feed's thread; once it has returned False for
            ``orphan_grace_s`` seconds the feed stops itself (``stop_reason`` "session_ended"): its owner is gone.

    Attributes (read them from any thread):
        state: "new", "connecting", "connected", "stopped" (``stop()`` or ``alive``) or "failed".
        error: a ``FeedError`` when ``state`` is "failed", else None.
        stop_reason: "disconnect" or "session_ended" once stopped.
        info: the ``engine`` event (pool and budget settings, ``clock``), once connected.
        metrics: the latest ``summarize_metrics`` of ``/metrics`` (None until read); ``metrics_error`` says
            why it could not be read, if it could not.
        num_received: steps received; ``num_finished``: requests the received steps finished.
        num_dropped: steps the server dropped for this reader (its ``num_dropped``: this reader was slow).
        num_lost: steps received but pushed out of the pending queue before ``poll`` took them.
        last_trace: the latest step received.

    Raises:
        ValueError: a bad ``url`` or a negative setting (from the constructor; nothing is started).
    """

    def __init__(self, url: str, history: int = 0, block_tables: bool = True, short_ids: bool = True,
                 connect_timeout_s: float = 3.0, first_event_timeout_s: float = 10.0, idle_timeout_s: float = 45.0,
                 metrics_every_s: float = 2.0, max_pending: int = 5000, alive: Callable[[], bool] | None = None,
                 orphan_grace_s: float = 10.0, api_key: str | None = None):
        self.url = check_url(url)
        for name, value in (("history", history), ("max_pending", max_pending)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        for name, value in (("connect_timeout_s", connect_timeout_s), ("first_event_timeout_s", first_event_timeout_s),
                            ("idle_timeout_s", idle_timeout_s), ("orphan_grace_s", orphan_grace_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        if not metrics_every_s >= 0:
            raise ValueError(f"metrics_every_s must be >= 0 seconds (0 = never), got {metrics_every_s!r}")
        self.history, self.block_tables, self.short_ids = history, block_tables, short_ids
        self.connect_timeout_s, self.first_event_timeout_s = connect_timeout_s, first_event_timeout_s
        self.idle_timeout_s, self.metrics_every_s = idle_timeout_s, metrics_every_s
        self.alive, self.orphan_grace_s, self.max_pending = alive, orphan_grace_s, max_pending
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.state = "new"
        self.error: FeedError | None = None
        self.stop_reason: str | None = None
        self.info: dict | None = None
        self.metrics: dict | None = None
        self.metrics_error: str | None = None
        self.num_received = self.num_finished = self.num_dropped = self.num_lost = 0
        self.last_trace: StepTrace | None = None
        self._names: dict[str, str] = {}  # server id -> display name, while the request is unfinished
        self._num_named = 0
        self._pending: deque[StepTrace] = deque(maxlen=max_pending or None)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        # set once the server's history replay has come in whole (at least one step), or the feed failed or stopped
        self._news = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._thread = threading.Thread(target=self._thread_main, name=f"minengine-feed {self.url}", daemon=True)

    # ---- the owner's side ----------------------------------------------------------------------------------
    def start(self) -> ServerFeed:
        """Start reading (in the background; returns at once)."""
        if self.state == "new":
            self.state = "connecting"
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0, reason: str = "disconnect") -> bool:
        """Stop reading: the connection is closed at once, whatever the feed is waiting for. Idempotent.
        Returns True once the thread has ended (within ``timeout_s`` seconds)."""
        with self._lock:
            if self.stop_reason is None and self.state not in ("failed", "stopped"):
                self.stop_reason = reason
            self._stop.set()
            self._news.set()  # nothing more to wait for
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop has closed already
                pass
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def wait_history(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the server's history replay (the ``history_steps`` its
        ``engine`` event announces; at least the first step when it announces none), or for the feed to fail
        or stop; returns True if either came. A page that waits a moment on Connect can draw the server's
        figures, up to its latest step, in that same rerun.

        Raises:
            ValueError: a negative ``timeout_s``.
        """
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0 seconds, got {timeout_s!r}")
        return self._news.wait(timeout_s)

    @property
    def done(self) -> bool:
        """True once no step will come: the thread has ended and ``poll`` has taken every step."""
        return self.state in ("stopped", "failed") and not self._thread.is_alive() and not self._pending

    @property
    def clock_label(self) -> str:
        """The server's clock ("wall" for ``minengine serve``; "wall" before the engine event arrives)."""
        return (self.info or {}).get("clock") or "wall"

    def poll(self, max_steps: int, budget_s: float = float("inf")) -> list[StepTrace]:
        """The steps received since the last call, oldest first, at most ``max_steps``; never waits
        (``budget_s`` is part of ``TraceStream`` and unused: the steps are already here)."""
        with self._lock:
            n = min(max_steps, len(self._pending))
            return [self._pending.popleft() for _ in range(n)]

    # ---- the feed's thread ---------------------------------------------------------------------------------
    def _thread_main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        with self._lock:
            if self._stop.is_set():
                self._finish_stopped()
                return
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        try:
            await self._read()
        except asyncio.CancelledError:
            self._finish_stopped()
        finally:
            with self._lock:
                self._loop = self._task = None

    def _finish_stopped(self) -> None:
        with self._lock:
            if self.state != "failed":
                self.state = "stopped"
                self.stop_reason = self.stop_reason or "disconnect"
        self._news.set()

    def _fail(self, kind: str, detail: str) -> None:
        with self._lock:
            if not self._stop.is_set():
                self.error = FeedError(kind, detail)
                self.state = "failed"
            else:
                self.state = "stopped"
        self._news.set()

    async def _read(self) -> None:
        timeout = httpx.Timeout(connect=self.connect_timeout_s, read=self.idle_timeout_s, write=10.0, pool=10.0)
        params = {"history": str(self.history), "block_tables": "true" if self.block_tables else "false"}
        helpers: list[asyncio.Task] = []
        connected = False
        async with httpx.AsyncClient(timeout=timeout, headers=self._headers) as client:
            if self.alive is not None:
                helpers.append(asyncio.create_task(self._watch_owner()))
            try:
                async with aconnect_sse(client, "GET", self.url + FEED_PATH, params=params) as source:
                    r = source.response
                    if r.status_code != 200:
                        reason = f" ({r.reason_phrase})" if r.reason_phrase else ""
                        raise _NotMinengine(f"GET {FEED_PATH} answered HTTP {r.status_code}{reason}")
                    events = source.aiter_sse()
                    try:
                        first = await asyncio.wait_for(anext(events), self.first_event_timeout_s)
                    except (asyncio.TimeoutError, StopAsyncIteration):
                        raise _NotMinengine(f"GET {FEED_PATH} sent no engine event within "
                                            f"{self.first_event_timeout_s:g} s") from None
                    self._take_engine_event(first)
                    connected = True
                    if self.metrics_every_s > 0:
                        helpers.append(asyncio.create_task(self._poll_metrics(client)))
                    async for event in events:
                        if event.event == "step":
                            self._take_step(event.data)
                    self._fail("dropped", "the server closed the feed (shutting down?)")
            except _NotMinengine as exc:
                self._fail("not_minengine", str(exc))
            except SSEError as exc:  # the content type is not text/event-stream
                self._fail("not_minengine", f"GET {FEED_PATH} is not a server-sent-event stream: {exc}")
            except ValueError as exc:  # a step event that does not decode
                self._fail("bad_event", str(exc))
            except httpx.TimeoutException as exc:
                if connected:
                    self._fail("dropped", f"no data for {self.idle_timeout_s:g} s ({type(exc).__name__})")
                else:
                    self._fail("unreachable", f"no answer within the timeout ({type(exc).__name__})")
            except httpx.HTTPError as exc:  # refused, reset, a broken chunked body, a bad host name, ...
                detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                self._fail("dropped" if connected else "unreachable", detail)
            except OSError as exc:
                self._fail("dropped" if connected else "unreachable", f"{type(exc).__name__}: {exc}")
            finally:
                for task in helpers:
                    task.cancel()

    def _take_engine_event(self, event) -> None:
        try:
            info = event.json() if event.event == "engine" else None
        except json.JSONDecodeError:
            info = None
        if not isinstance(info, dict) or any(not isinstance(info.get(k), int) for k in ENGINE_FIELDS):
            raise _NotMinengine(f"GET {FEED_PATH} did not start with minengine's engine event (got event "
                                f"{event.event!r}: {event.data[:80]!r})")
        with self._lock:
            self.info = info
            if not self._stop.is_set():
                self.state = "connected"

    def _take_step(self, data: str) -> None:
        try:
            d = json.loads(data)
            dropped = int(d.pop("num_dropped", 0))
            d.pop("duration", None)
            trace = trace_from_dict(d)
        except (json.JSONDecodeError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"a step event could not be read: {exc}") from exc
        if self.short_ids:
            named = rename_requests(trace, self._display_name)
            for rid in trace.finished_ids:  # a finished request does not come back: forget its name
                self._names.pop(rid, None)
            trace = named
        with self._lock:
            if len(self._pending) == self._pending.maxlen:
                self.num_lost += 1
            self._pending.append(trace)
            self.num_received += 1
            self.num_finished += len(trace.finished_ids)
            self.num_dropped = max(self.num_dropped, dropped)
            self.last_trace = trace
            replayed = self.num_received >= max(1, int((self.info or {}).get("history_steps", 0)))
        if replayed:
            self._news.set()

    def _display_name(self, request_id: str) -> str:
        name = self._names.get(request_id)
        if name is None:
            name = self._names[request_id] = f"{short_request_id(request_id)} #{self._num_named}"
            self._num_named += 1
        return name

    async def _poll_metrics(self, client: httpx.AsyncClient) -> None:
        while True:
            try:
                r = await client.get(self.url + METRICS_PATH, timeout=5.0)
                r.raise_for_status()
                self.metrics, self.metrics_error = summarize_metrics(r.text), None
            except (httpx.HTTPError, ValueError) as exc:
                self.metrics_error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(self.metrics_every_s)

    async def _watch_owner(self) -> None:
        gone_since = None
        while True:
            await asyncio.sleep(1.0)
            try:
                alive = bool(self.alive())
            except Exception:  # an owner that cannot answer is gone
                alive = False
            now = time.monotonic()
            if alive:
                gone_since = None
            elif gone_since is None:
                gone_since = now
            elif now - gone_since >= self.orphan_grace_s:
                with self._lock:
                    self.stop_reason = self.stop_reason or "session_ended"
                    self._stop.set()
                self._task.cancel()
                return

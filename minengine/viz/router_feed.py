"""Follow a fleet behind vLLM's router (``python -m minengine fleet-serve``): ask the router for its workers, read
every replica's step feed (one ``ServerFeed`` each), and say from the replicas' own steps which replica served
each request and what each one holds.

The router (``vllm-router``) answers ``GET /list_workers`` with ``{"urls": ["http://host:port", ...]}``, in no
fixed order; the replicas are listed here sorted by host and port, so a page keeps them in the same places. The
router itself records nothing per request that a client can read, but each replica's step feed names the
requests it scheduled: a request the router sent to replica R shows up in R's steps, and in no other's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from minengine.metrics.trace import StepTrace
from minengine.viz.server_feed import ServerFeed, check_url

LIST_WORKERS_PATH = "/list_workers"


class RouterError(Exception):
    """The router could not be asked for its workers. ``kind``: "unreachable" (no connection, a timeout) or
    "not_router" (something answered, but not as vLLM's router does); the message names the URL."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def list_workers(router_url: str, api_key: str | None = None, timeout_s: float = 5.0) -> list[str]:
    """The base URLs of the router's workers, sorted by (host, port), from its ``GET /list_workers``.

    Args:
        router_url: the router's base URL, e.g. "http://127.0.0.1:8000" (``check_url``).
        api_key: sent as ``Authorization: Bearer <key>`` (a router started with ``--api-key``); None sends none.
        timeout_s: seconds to wait for the answer.

    Raises:
        ValueError: a bad ``router_url`` (not http(s)://HOST:PORT) or a ``timeout_s`` that is not > 0.
        RouterError: nothing answers at ``router_url`` ("unreachable"), or it answers but not with vLLM's
            router's list of workers ("not_router"); the message names the URL.
    """
    url = check_url(router_url)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        reply = httpx.get(url + LIST_WORKERS_PATH, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException as exc:
        raise RouterError("unreachable", f"{url} did not answer GET {LIST_WORKERS_PATH} within {timeout_s:g} s "
                                         f"({type(exc).__name__})") from None
    except (httpx.HTTPError, OSError) as exc:
        raise RouterError("unreachable", f"cannot reach {url}: {type(exc).__name__}: {exc}") from None
    if reply.status_code != 200:
        raise RouterError("not_router", f"{url} is not a vLLM router: GET {LIST_WORKERS_PATH} answered HTTP "
                                        f"{reply.status_code} {reply.reason_phrase}".rstrip())
    try:
        urls = reply.json()["urls"]
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            raise TypeError("urls is not a list of strings")
        workers = [check_url(u) for u in urls]
    except (ValueError, KeyError, TypeError) as exc:
        raise RouterError("not_router", f"{url} is not a vLLM router: GET {LIST_WORKERS_PATH} did not answer "
                                        f'{{"urls": [...]}} ({type(exc).__name__}: {exc}; got '
                                        f"{reply.text[:80]!r})") from None
    return sorted(dict.fromkeys(workers), key=_host_port)


def open_replica_feeds(router_url: str, api_key: str | None = None, timeout_s: float = 5.0,
                       **feed_args) -> dict[str, ServerFeed]:
    """One started ``ServerFeed`` per worker of the router (``list_workers``), keyed by the worker's URL in that
    order; ``api_key`` goes to the router and to every feed, ``feed_args`` to every ``ServerFeed`` (``history``,
    ``alive``, ...). A replica that cannot be read fails its own feed (``ServerFeed.state``), not the others.

    Raises:
        ValueError, RouterError: as ``list_workers``; ValueError for a bad ``feed_args`` value (no feed is left
            running then).
    """
    feeds: dict[str, ServerFeed] = {}
    workers = list_workers(router_url, api_key, timeout_s)
    for worker in workers:
        feeds[worker] = ServerFeed(worker, api_key=api_key, **feed_args)  # all built (checked) before any starts
    return {worker: feed.start() for worker, feed in feeds.items()}


@dataclass(frozen=True)
class RequestRoute:
    """Where one request ran: ``replica`` (a key of the traces given to ``route_requests``), the step and time
    (seconds, on the shared clock ``route_requests`` was given, else the replica's own) it was first seen in,
    the tokens the replica scheduled for it in those steps, and whether one of them finished it."""

    request_id: str
    replica: str
    first_step: int
    first_time_s: float
    num_tokens: int
    finished: bool


@dataclass(frozen=True)
class ReplicaCounts:
    """One replica over its given steps: ``requests`` routed to it (``RequestRoute``), ``prefix_queried_tokens``
    and ``prefix_hit_tokens`` (prompt tokens its prefix cache was asked for and had, first admissions: the
    ``StepTrace`` fields summed), and ``used_blocks`` / ``total_blocks`` of its KV pool at its latest step (None
    without a step)."""

    steps: int
    requests: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    used_blocks: int | None
    total_blocks: int | None


@dataclass(frozen=True)
class FleetRouting:
    """``routes``: every request seen, the earliest first seen first; ``replicas``: per replica, in the order
    given."""

    routes: list[RequestRoute]
    replicas: dict[str, ReplicaCounts]


def _request_ids(trace: StepTrace) -> list[str]:
    """Every request a step names: scheduled, admitted, preempted, finished, holding blocks."""
    ids = [c.request_id for c in trace.chunks] + trace.admitted_ids + trace.preempted_ids + trace.finished_ids
    return ids + list(trace.block_tables or ())


def route_requests(traces_by_replica: Mapping[str, Sequence[StepTrace]],
                   clock_offsets_s: Mapping[str, float] | None = None) -> FleetRouting:
    """Which replica served each request, and per-replica counts, from the replicas' steps (no engine logic: the
    requests each replica's steps name are the ones the router sent it).

    Args:
        traces_by_replica: replica name (its URL) -> its steps, oldest first.
        clock_offsets_s: seconds added to a replica's step times to put every replica on one clock (a server's
            ``unix_time - clock_now``, ``clock_offset``); a replica missing here keeps its own clock.

    Returns:
        ``FleetRouting``. A request id seen on several replicas (a client that reused one) is given to the one
        where it was seen first (ties: the order of ``traces_by_replica``), so every request has exactly one
        replica and the replicas' ``requests`` sum to ``len(routes)``.
    """
    offsets = clock_offsets_s or {}
    tally = RoutingTally(list(traces_by_replica))
    for replica, traces in traces_by_replica.items():
        tally.add(replica, traces, offsets.get(replica, 0.0))
    return tally.routing()


class RoutingTally:
    """``route_requests`` kept up to date step batch by step batch: a live page keeps only a window of each
    replica's steps for its figures, while its counts cover every step since it connected.

    Args:
        replicas: the replicas' names (URLs), in the order ``routing`` lists them.
    """

    def __init__(self, replicas: Sequence[str]):
        self._seen: dict[str, dict[str, dict]] = {r: {} for r in replicas}  # replica -> request id -> its row
        self._steps = dict.fromkeys(replicas, 0)
        self._queried = dict.fromkeys(replicas, 0)
        self._hit = dict.fromkeys(replicas, 0)
        self._last: dict[str, StepTrace | None] = dict.fromkeys(replicas)

    def add(self, replica: str, traces: Sequence[StepTrace], clock_offset_s: float = 0.0) -> None:
        """Count ``replica``'s next steps (oldest first), their times moved by ``clock_offset_s`` seconds.

        Raises:
            KeyError: a replica not given at construction.
        """
        seen = self._seen[replica]
        for tr in traces:
            tokens = {}
            for c in tr.chunks:
                tokens[c.request_id] = tokens.get(c.request_id, 0) + c.num_tokens
            for rid in _request_ids(tr):
                row = seen.setdefault(rid, {"first_step": tr.step, "first_time_s": tr.start_time + clock_offset_s,
                                            "num_tokens": 0, "finished": False})
                row["num_tokens"] += tokens.pop(rid, 0)
            for rid in tr.finished_ids:
                seen[rid]["finished"] = True
            self._queried[replica] += tr.prefix_queried_tokens
            self._hit[replica] += tr.prefix_hit_tokens
        self._steps[replica] += len(traces)
        if traces:
            self._last[replica] = traces[-1]

    def routing(self) -> FleetRouting:
        """Every request counted so far with its replica (the one that saw it first), and each replica's counts."""
        first: dict[str, RequestRoute] = {}
        for replica, seen in self._seen.items():
            for rid, row in seen.items():
                route = RequestRoute(rid, replica, **row)
                if rid not in first or route.first_time_s < first[rid].first_time_s:
                    first[rid] = route
        routes = sorted(first.values(), key=lambda r: r.first_time_s)
        replicas = {}
        for replica, last in self._last.items():
            replicas[replica] = ReplicaCounts(
                steps=self._steps[replica], requests=sum(r.replica == replica for r in routes),
                prefix_queried_tokens=self._queried[replica], prefix_hit_tokens=self._hit[replica],
                used_blocks=None if last is None else last.num_used_blocks,
                total_blocks=None if last is None else last.num_total_blocks)
        return FleetRouting(routes, replicas)


def clock_offset(feed: ServerFeed) -> float | None:
    """Seconds from the server's step clock to Unix time (``unix_time - clock_now`` of its ``engine`` event), so
    replicas' steps can be put on one clock; None before the event came or when it lacks either field."""
    info = feed.info or {}
    unix, now = info.get("unix_time"), info.get("clock_now")
    if not isinstance(unix, (int, float)) or not isinstance(now, (int, float)):
        return None
    return float(unix) - float(now)

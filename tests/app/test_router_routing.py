"""``minengine.viz.router_feed`` without a fleet: ``route_requests`` on synthetic steps (a property: every request
has exactly one replica, one that named it, and the replicas' counts add up), and ``list_workers`` against things
that are not vLLM's router (a closed port, an HTTP server without ``/list_workers``, wrong JSON): errors naming
the URL."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine.metrics.trace import ScheduledChunk, StepTrace
from minengine.viz.router_feed import RouterError, RoutingTally, list_workers, route_requests
from tests.server_helpers import free_socket

IDS = ["a", "b", "c", "d", "e"]  # few ids, so some show up on two replicas (a client reusing one)


def step(n: int, t: float, scheduled: list[str], finished: list[str], hit: int = 0, used: int = 1) -> StepTrace:
    return StepTrace(step=n, start_time=t, end_time=t + 0.01, token_budget=64,
                     chunks=[ScheduledChunk(r, 2, 0, True, True) for r in scheduled], num_running=len(scheduled),
                     num_waiting=0, num_free_blocks=16 - used, num_cached_free_blocks=0, num_total_blocks=16,
                     preempted_ids=[], admitted_ids=[], finished_ids=finished, prefix_queried_tokens=2 * hit,
                     prefix_hit_tokens=hit)


steps_strategy = st.lists(st.tuples(st.lists(st.sampled_from(IDS), max_size=3, unique=True),
                                    st.lists(st.sampled_from(IDS), max_size=2, unique=True),
                                    st.integers(0, 32), st.integers(0, 16)), max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(steps_strategy, min_size=1, max_size=4), st.lists(st.floats(-100, 100), min_size=4, max_size=4))
def test_every_request_has_exactly_one_replica_and_the_counts_add_up(replicas, offsets):
    traces = {f"http://r{i}:1": [step(n, 0.1 * n, s, f, hit, used) for n, (s, f, hit, used) in enumerate(steps)]
              for i, steps in enumerate(replicas)}
    clock = {url: off for url, off in zip(traces, offsets)}
    routing = route_requests(traces, clock)
    named = {url: {r for tr in trs for r in [c.request_id for c in tr.chunks] + tr.finished_ids}
             for url, trs in traces.items()}
    ids = [r.request_id for r in routing.routes]
    assert sorted(ids) == sorted(set().union(*named.values()))  # every request once
    for route in routing.routes:
        assert route.request_id in named[route.replica]
        on = [u for u in traces if route.request_id in named[u]]
        if len(on) == 1:
            assert route.replica == on[0]
    assert sum(c.requests for c in routing.replicas.values()) == len(routing.routes)
    assert list(routing.replicas) == list(traces)
    for url, trs in traces.items():
        c = routing.replicas[url]
        assert c.steps == len(trs) and c.prefix_hit_tokens == sum(tr.prefix_hit_tokens for tr in trs)
        assert c.used_blocks == (trs[-1].num_used_blocks if trs else None)
    times = [r.first_time_s for r in routing.routes]
    assert times == sorted(times)


@settings(max_examples=100, deadline=None)
@given(st.lists(steps_strategy, min_size=1, max_size=3), st.data())
def test_a_tally_fed_step_batches_counts_what_route_requests_counts_over_every_step(replicas, data):
    """The Router page counts every step since Connect, fed a few steps per redraw, while it keeps only a window."""
    traces = {f"http://r{i}:1": [step(n, 0.1 * n, s, f, hit, used) for n, (s, f, hit, used) in enumerate(steps)]
              for i, steps in enumerate(replicas)}
    tally = RoutingTally(list(traces))
    cursor = dict.fromkeys(traces, 0)
    while any(cursor[u] < len(trs) for u, trs in traces.items()):  # replicas' batches interleaved at random
        url = data.draw(st.sampled_from([u for u in traces if cursor[u] < len(traces[u])]))
        n = data.draw(st.integers(1, len(traces[url]) - cursor[url]))
        tally.add(url, traces[url][cursor[url]:cursor[url] + n])
        cursor[url] += n
    assert tally.routing() == route_requests(traces)
    with pytest.raises(KeyError):
        tally.add("http://elsewhere:1", [])


def test_a_request_seen_on_two_replicas_goes_to_the_earlier_one_on_the_shared_clock():
    traces = {"A": [step(0, 5.0, ["x"], [])], "B": [step(0, 1.0, ["x", "y"], ["x"])]}
    by_own_clock = route_requests(traces)
    assert {r.request_id: r.replica for r in by_own_clock.routes} == {"x": "B", "y": "B"}
    shared = route_requests(traces, {"A": 0.0, "B": 10.0})  # B's clock is 10 s behind: A saw x first
    assert {r.request_id: r.replica for r in shared.routes} == {"x": "A", "y": "B"}
    assert [c.requests for c in shared.replicas.values()] == [1, 1]
    x = shared.routes[0]
    assert (x.first_time_s, x.num_tokens, x.finished) == (5.0, 2, False)


class _Handler(http.server.BaseHTTPRequestHandler):
    answers = {"/list_workers": (404, "text/plain", "no such route")}

    def do_GET(self):  # noqa: N802 (http.server's name)
        code, kind, body = self.answers.get(self.path, (404, "text/plain", "?"))
        self.send_response(code)
        self.send_header("content-type", kind)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status, body, message", [
    (404, "no such route", r"is not a vLLM router: GET /list_workers answered HTTP 404"),
    (200, "<html>hello</html>", r'is not a vLLM router: GET /list_workers did not answer \{"urls"'),
    (200, json.dumps({"urls": "http://h:1"}), r"did not answer \{\"urls\".*not a list of strings"),
    (200, json.dumps({"urls": ["h:1"]}), r"did not answer \{\"urls\".*must look like http"),
])
def test_something_that_is_not_the_router_is_named(stub, monkeypatch, status, body, message):
    monkeypatch.setattr(_Handler, "answers", {"/list_workers": (status, "application/json", body)})
    url = f"http://127.0.0.1:{stub.server_address[1]}"
    with pytest.raises(RouterError, match=message) as info:
        list_workers(url)
    assert info.value.kind == "not_router" and str(info.value).startswith(url)


def test_the_workers_come_sorted_by_host_and_port(stub, monkeypatch):
    urls = ["http://127.0.0.1:10000/", "http://127.0.0.1:9999", "http://127.0.0.1:9999"]
    monkeypatch.setattr(_Handler, "answers", {"/list_workers": (200, "application/json", json.dumps({"urls": urls}))})
    assert list_workers(f"http://127.0.0.1:{stub.server_address[1]}") == ["http://127.0.0.1:9999",
                                                                          "http://127.0.0.1:10000"]


def test_unreachable_and_bad_urls():
    sock = free_socket()  # bound, not listening: a connection is refused
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        with pytest.raises(RouterError, match=f"cannot reach {url}") as info:
            list_workers(url)
        assert info.value.kind == "unreachable"
    finally:
        sock.close()
    with pytest.raises(ValueError, match="url must look like http://HOST:PORT"):
        list_workers("localhost:8000")
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        list_workers("http://127.0.0.1:1", timeout_s=0)

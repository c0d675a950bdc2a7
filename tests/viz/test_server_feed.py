"""``minengine.viz.server_feed.ServerFeed``, the dashboard's client of a server's step feed: against the real
server (the steps it hands over are the engine's own traces; ``/metrics`` numbers; a stop that is immediate
even on an idle feed) and against canned servers on loopback for every way it can go wrong: a bad URL, nothing
listening, something that is not minengine, a step that does not decode, a connection that drops mid-stream,
steps the server dropped, an owner that went away. Plus the figure pieces a server window needs
(``step_request_metrics``, ``LivePlayer(keep=)``, the batch axis of a window)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import openai
import pytest

from minengine.metrics.trace import StepTrace
from minengine.viz import batch_composition_figure, find_stalls, itl_figure, step_request_metrics
from minengine.viz.live import LivePlayer
from minengine.viz.runner import DashboardConfig, run_workload
from minengine.viz.server_feed import ServerFeed, check_url, rename_requests, short_request_id, summarize_metrics
from minengine.viz.workload import Workload, WorkloadRequest
from minengine.workloads import SHAKESPEARE_OPENINGS
from tests.canned_server import ENGINE, CannedServer, chunk, http_head, sse, step_dict
from tests.server_helpers import free_socket

TIMEOUT = 60.0


def wait_for(condition, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def drain_feed(feed: ServerFeed, timeout_s: float = 10.0) -> list[StepTrace]:
    """Every step until the feed is done."""
    got = []
    deadline = time.monotonic() + timeout_s
    while not feed.done:
        got += feed.poll(1 << 30)
        assert time.monotonic() < deadline, f"feed still {feed.state}"
        time.sleep(0.02)
    return got


# ---- the real server -------------------------------------------------------------------------------------------
def test_the_feed_hands_over_the_engines_own_steps_and_metrics(server):
    feed = ServerFeed(server.url, metrics_every_s=0.2).start()
    try:
        wait_for(lambda: feed.state == "connected", what="the engine event")
        assert feed.info["num_kv_blocks"] == 256 and feed.info["max_num_batched_tokens"] == 256
        assert feed.clock_label == "wall"
        steps_before = server.engine.num_steps

        async def clients():
            aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="EMPTY", timeout=TIMEOUT, max_retries=0)
            async with aclient:
                async def one(i):
                    stream = await aclient.completions.create(model="tiny-shakespeare-llama", stream=True,
                                                              prompt=SHAKESPEARE_OPENINGS[i], max_tokens=12 + i,
                                                              temperature=0)
                    return [c async for c in stream][0].id
                return await asyncio.gather(*(one(i) for i in range(4)))

        ids = asyncio.run(clients())
        server.wait_idle()
        wait_for(lambda: feed.last_trace is not None and feed.last_trace.step == server.engine.num_steps - 1,
                 what="the last step")
        got = feed.poll(1 << 30)
        want = [tr for tr in server.engine.traces if tr.step >= steps_before]
        # each request renamed "<short id> #n", n in order of first appearance
        names = {}
        for tr in want:
            for c in tr.chunks:
                names.setdefault(c.request_id, f"{short_request_id(c.request_id)} #{len(names)}")
        assert set(names) == {rid + "-0" for rid in ids}
        assert all(re.fullmatch(r"cmpl-[0-9a-f]{8}…-0 #[0-3]", name) for name in names.values()), names
        # otherwise exactly the engine's records
        assert [tr.to_dict() for tr in got] == [rename_requests(tr, names.__getitem__).to_dict() for tr in want]
        assert feed.num_finished == 4 and feed.num_dropped == 0 and feed.num_lost == 0
        wait_for(lambda: feed.metrics is not None and feed.metrics["generation_tokens"] >= 12 + 13 + 14 + 15,
                 what="/metrics")
        m = feed.metrics
        assert m["running"] == 0 and m["waiting"] == 0 and 0 < m["ttft_mean_s"] < 10 and 0 < m["itl_mean_s"] < 10
        # ITLs rebuilt from the steps equal the engine's own per-request records
        metrics = step_request_metrics(got)
        for rid in ids:
            mine, engine = metrics[names[rid + "-0"]], server.engine.request_metrics[rid + "-0"]
            assert mine.itls == pytest.approx(engine.itls) and mine.finished_time == engine.finished_time
    finally:
        started = time.monotonic()
        assert feed.stop()  # an idle feed (keep-alive every 15 s): the read is cancelled, not waited out
        assert time.monotonic() - started < 2.0
    assert feed.state == "stopped" and feed.stop_reason == "disconnect" and feed.done and feed.error is None


def test_history_replays_the_last_steps_first(server):
    server.wait_idle()
    last = server.engine.traces[-1].step
    feed = ServerFeed(server.url, history=3, block_tables=False, metrics_every_s=0).start()
    try:
        # the wait ends with the whole replay in: a page draws up to the server's latest step on Connect
        assert feed.wait_history(TIMEOUT) and feed.num_received >= 3
        got = feed.poll(10)
        assert [tr.step for tr in got] == [last - 2, last - 1, last] and got[0].block_tables is None
    finally:
        feed.stop()


# ---- bad URLs, and servers that are not (or no longer) minengine ---------------------------------------------------
@pytest.mark.parametrize("url", ["localhost:8000", "", "   ", "ftp://127.0.0.1:8000", "http://", "http://host:99999",
                                 "127.0.0.1", "http://127.0.0.1:8000/?x=1", "http://127.0.0.1:8000#top"])
def test_a_bad_url_is_refused_at_once(url):
    with pytest.raises(ValueError, match="url"):
        ServerFeed(url)


def test_check_url_keeps_a_good_url():
    assert check_url(" http://127.0.0.1:8000/ ") == "http://127.0.0.1:8000"
    assert check_url("https://example.org/minengine") == "https://example.org/minengine"


def test_nothing_listening_is_unreachable():
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()  # a port nobody listens on
    started = time.monotonic()
    feed = ServerFeed(f"http://127.0.0.1:{port}").start()
    drain_feed(feed, timeout_s=10)
    assert feed.state == "failed" and feed.error.kind == "unreachable", feed.error
    assert time.monotonic() - started < 5 and feed.info is None


def test_a_black_hole_times_out_as_unreachable():
    # a listening socket that never accepts: the TCP handshake completes in the kernel's backlog, then no answer
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(0)
        feed = ServerFeed(f"http://127.0.0.1:{sock.getsockname()[1]}", connect_timeout_s=0.5,
                          first_event_timeout_s=0.5, idle_timeout_s=0.5).start()
        drain_feed(feed, timeout_s=10)
    assert feed.state == "failed" and feed.error.kind in ("unreachable", "not_minengine"), feed.error


@pytest.mark.parametrize("head, chunks, says", [
    (http_head("404 Not Found", "application/json", chunked=False), [b'{"detail":"Not Found"}'], "HTTP 404"),
    (http_head("200 OK", "text/html", chunked=False), [b"<html>hello</html>"], "server-sent-event"),
    (http_head(), [chunk(sse("message", "hello"))], "engine event"),
    (http_head(), [chunk(sse("engine", {"model": "x"}))], "engine event"),
    (http_head(), [chunk(": keep-alive\n\n")], "no engine event"),
])
def test_a_server_that_is_not_minengine_says_so(head, chunks, says):
    with CannedServer(head, chunks, close=False) as canned:
        feed = ServerFeed(canned.url, first_event_timeout_s=1.0).start()
        drain_feed(feed)
    assert feed.state == "failed" and feed.error.kind == "not_minengine" and says in feed.error.detail, feed.error


def test_waiting_for_the_history_ends_at_its_last_step_a_failure_or_a_stop():
    with CannedServer(http_head(), [chunk(sse("engine", ENGINE)), chunk(": keep-alive\n\n")], close=False) as canned:
        feed = ServerFeed(canned.url).start()
        started = time.monotonic()
        assert not feed.wait_history(0.3)  # connected, no step: the wait is bounded
        assert 0.3 <= time.monotonic() - started < 5 and feed.num_received == 0
        with pytest.raises(ValueError, match="timeout_s"):
            feed.wait_history(-1)
        feed.stop()
        assert feed.wait_history(0)
    with CannedServer(http_head(), [chunk(sse("engine", ENGINE)), chunk(sse("step", step_dict(0)))],
                      close=False) as canned:
        feed = ServerFeed(canned.url).start()
        assert feed.wait_history(TIMEOUT) and feed.num_received == 1
        feed.stop()
    announced = {**ENGINE, "history_steps": 2}  # a replay of two steps, the second one late
    with CannedServer(http_head(), [chunk(sse("engine", announced)), chunk(sse("step", step_dict(0)))],
                      close=False) as canned:
        feed = ServerFeed(canned.url).start()
        assert not feed.wait_history(0.5) and feed.num_received == 1  # half the replay: still waiting
        feed.stop()
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()  # nothing listens
    failed = ServerFeed(f"http://127.0.0.1:{port}").start()
    assert failed.wait_history(TIMEOUT) and failed.state == "failed"


def test_a_step_that_does_not_decode_is_a_bad_event():
    with CannedServer(http_head(), [chunk(sse("engine", ENGINE)), chunk(sse("step", {"step": 1}))],
                      close=False) as canned:
        feed = ServerFeed(canned.url).start()
        drain_feed(feed)
    assert feed.state == "failed" and feed.error.kind == "bad_event" and "StepTrace" in feed.error.detail


@pytest.mark.parametrize("tail", [b"", b"3e8\r\nevent: st"])  # closed between events / in the middle of one
def test_a_connection_that_drops_mid_stream_keeps_its_steps(tail):
    events = [chunk(sse("engine", ENGINE))] + [chunk(sse("step", step_dict(i))) for i in range(3)]
    with CannedServer(http_head(), events + [tail], close=True) as canned:
        feed = ServerFeed(canned.url).start()
        got = drain_feed(feed)
    assert feed.state == "failed" and feed.error.kind == "dropped", feed.error
    assert [tr.step for tr in got] == [0, 1, 2] and feed.info["model"] == "fake"
    assert got[0].chunks[0].request_id == "cmpl-01234567…-0 #0" and list(got[0].block_tables) == ["cmpl-01234567…-0 #0"]
    assert got[2].chunks[0].request_id == "cmpl-01234567…-0 #0"  # the same name at every step


def test_steps_the_server_dropped_and_steps_lost_here_are_counted():
    events = [chunk(sse("engine", ENGINE))] + [chunk(sse("step", step_dict(i, d))) for i, d in
                                               enumerate([0, 0, 3, 3, 7])]
    with CannedServer(http_head(), events, close=False) as canned:
        feed = ServerFeed(canned.url, max_pending=2).start()
        wait_for(lambda: feed.num_received == 5, what="5 steps")
        assert feed.num_dropped == 7  # the server's count for this subscriber
        assert feed.num_lost == 3 and [tr.step for tr in feed.poll(10)] == [3, 4]  # a paused reader keeps the latest
        assert feed.stop() and feed.state == "stopped"


def test_a_feed_whose_owner_went_away_stops_itself():
    with CannedServer(http_head(), [chunk(sse("engine", ENGINE))], close=False) as canned:
        owner = {"alive": True}
        feed = ServerFeed(canned.url, alive=lambda: owner["alive"], orphan_grace_s=0.5).start()
        wait_for(lambda: feed.state == "connected", what="connected")
        time.sleep(1.5)
        assert feed.state == "connected"  # the owner is there: the feed goes on
        owner["alive"] = False
        drain_feed(feed, timeout_s=10)
    assert feed.state == "stopped" and feed.stop_reason == "session_ended" and feed.error is None


def test_stop_before_the_connection_is_made_and_stop_twice():
    feed = ServerFeed("http://127.0.0.1:9")
    assert feed.stop() and feed.state == "new"  # never started: nothing to stop
    feed = ServerFeed("http://127.0.0.1:9").start()
    assert feed.stop() and feed.stop()
    assert feed.done and feed.state in ("stopped", "failed")


# ---- pieces ---------------------------------------------------------------------------------------------------
def test_display_names_are_numbered_in_order_and_forgotten_when_finished():
    feed = ServerFeed("http://127.0.0.1:9")

    def step(n, ids, finished=()):
        return json.dumps({**step_dict(n), "chunks": [{"request_id": r, "num_tokens": 1, "start_pos": 0,
                                                        "is_prefill": True, "sampled": True} for r in ids],
                           "block_tables": {r: [0] for r in ids}, "finished_ids": list(finished)})

    a, b, c = (f"cmpl-{x * 32}-0" for x in "abc")
    feed._take_step(step(0, [a, b]))
    feed._take_step(step(1, [b], finished=[b]))
    feed._take_step(step(2, [a, c]))
    got = feed.poll(10)
    assert [[ch.request_id for ch in tr.chunks] for tr in got] == [
        ["cmpl-aaaaaaaa…-0 #0", "cmpl-bbbbbbbb…-0 #1"], ["cmpl-bbbbbbbb…-0 #1"],
        ["cmpl-aaaaaaaa…-0 #0", "cmpl-cccccccc…-0 #2"]]
    assert got[1].finished_ids == ["cmpl-bbbbbbbb…-0 #1"] and set(feed._names) == {a, c}  # b is forgotten
    assert feed.num_finished == 1 and feed.num_received == 3
    # the colours of requests running together differ (the number picks the colour)
    from minengine.viz.colors import request_color
    assert len({request_color(f"cmpl-aaaaaaaa…-0 #{n}") for n in range(16)}) == 16


def test_short_request_ids():
    assert short_request_id("cmpl-71418df7a1b2c3d4e5f60718293a4b5c-0") == "cmpl-71418df7…-0"
    assert short_request_id("0_chatcmpl-71418df7a1b2c3d4e5f60718293a4b5c-0") == "0_chatcmpl-71418df7…-0"
    assert short_request_id("r3") == "r3" and short_request_id("my-request") == "my-request"


def test_summarize_metrics_of_an_empty_server():
    text = ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 2.0\n"
            "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{engine=\"0\"} 0.0\n")
    m = summarize_metrics(text)
    assert m["running"] == 2 and m["prefix_hit_rate"] is None and m["ttft_mean_s"] is None
    with pytest.raises(ValueError):
        summarize_metrics("<html>not prometheus</html>")


def test_live_player_keeps_a_window_and_the_batch_axis_follows_it(bundled_model):
    wl = Workload("keep", tuple(WorkloadRequest(f"r{i}", tuple(range(5, 37)), 24, arrival_step=2 * i)
                                        for i in range(3)))
    res = run_workload(DashboardConfig(num_kv_blocks=32, model=bundled_model), wl)

    class Replay:
        done = False

        def __init__(self, traces):
            self.left = list(traces)

        def poll(self, max_steps, budget_s=float("inf")):
            out, self.left = self.left[:max_steps], self.left[max_steps:]
            self.done = not self.left
            return out

    player = LivePlayer(Replay(res.traces), speed=0, keep=10)
    player.finish()
    assert [tr.step for tr in player.traces] == [tr.step for tr in res.traces[-10:]]
    first = player.traces[0].step
    fig = batch_composition_figure(player.traces, "en", min_steps=40)
    assert list(fig.layout.xaxis.range) == [first - 0.5, first + 39.5]  # a window starts where it starts
    with pytest.raises(ValueError, match="keep"):
        LivePlayer(Replay([]), keep=0)
    # ITLs from the steps alone equal the engine's records
    metrics = step_request_metrics(res.traces)
    for rid, m in metrics.items():
        assert m.itls == pytest.approx(res.request_metrics[rid].itls)
        assert m.num_output_tokens == 24 and m.finished_time == res.request_metrics[rid].finished_time
    # the ITL figure of a window: x from the window's first step, and the axis says so; stalls on the same axis
    window = res.traces[5:]
    origin = window[0].start_time
    fig = itl_figure(step_request_metrics(window), window, 0.0, "en", origin=origin)
    assert fig.layout.xaxis.title.text == "time since first step (s)"
    stalls = find_stalls(step_request_metrics(window), window, 0.0, origin=origin)
    assert stalls and min(s["time_s"] for s in stalls) > 0
    assert sorted(fig.data[1].x) == sorted(s["time_s"] for s in stalls)
    assert itl_figure(res.request_metrics, res.traces, 0.0, "en").layout.xaxis.title.text == \
        "time since first arrival (s)"

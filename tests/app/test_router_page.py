"""Following a real fleet: two ``minengine serve`` replicas behind the real vllm-router (``fleet-serve``, started
once for this module), requests sent through the router with the ``openai`` client. ``open_replica_feeds`` finds
both replicas from the router's ``/list_workers`` and ``route_requests`` gives each request the replica that
served it: checked against each replica's own ``/metrics`` (every request's prompt has its own power-of-two
length, so a replica's prompt-token total says which requests it ran). Then the Router page (``AppTest``): URL
typed, Connect pressed, both replicas' pools and the requests drawn; bad URLs are messages. Every process of the
fleet is gone afterwards."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

pytest.importorskip("vllm_router", reason="vllm-router is not installed: the fleet runs behind it")
pytest.importorskip("streamlit")

from streamlit.testing.v1 import AppTest  # noqa: E402

from minengine.viz.router_feed import clock_offset, open_replica_feeds, route_requests  # noqa: E402
from minengine.viz.server_feed import short_request_id  # noqa: E402
from tests.server_helpers import finished_requests, free_ports, start_fleet  # noqa: E402

PAGE = Path(__file__).resolve().parents[2] / "pages" / "Router.py"


class RealFleet:
    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.replicas = [f"http://127.0.0.1:{port + 1}", f"http://127.0.0.1:{port + 2}"]
        from openai import OpenAI

        self.client = OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)
        self.model = None

    def send(self, prompt_lens: list[int]) -> list[str]:
        """One completion per prompt length (token ids), one after another; their request ids as the replicas'
        feeds name them (the response id and the choice index)."""
        self.model = self.model or self.client.models.list().data[0].id
        ids = []
        for n in prompt_lens:
            out = self.client.completions.create(model=self.model, prompt=[7] * n, max_tokens=2, temperature=0)
            assert out.usage.prompt_tokens == n
            ids.append(out.id + "-0")
        return ids


@pytest.fixture(scope="module")
def fleet(bundled_model):
    port = free_ports(3)
    # the router's Prometheus exporter listens on 29000 unless told otherwise: another fleet may hold that port
    metrics_port = free_ports(1)
    process, lines, pids = start_fleet(["--num-replicas", "2", "--port", str(port), "--policy", "round_robin",
                                        "--router-args", f"--prometheus-port {metrics_port}",
                                        "--startup-timeout", "50", "--", bundled_model, "--max-model-len", "256",
                                        "--uvicorn-log-level", "warning"])
    try:
        yield RealFleet(port)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    assert code == 0, "".join(lines[-20:])
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert not alive, alive


def prompt_tokens(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=10).text
    return round(sum(float(v) for v in re.findall(r"^vllm:prompt_tokens_total\{[^}]*\} (\S+)$", text, re.M)))


def test_the_feeds_find_both_replicas_and_the_replica_of_each_request(fleet):
    lens = [1, 2, 4, 8, 16, 32]
    before = {u: (prompt_tokens(u), finished_requests(u)) for u in fleet.replicas}  # other tests' requests
    ids = fleet.send(lens)
    feeds = open_replica_feeds(fleet.url, history=1000)
    try:
        assert list(feeds) == fleet.replicas  # sorted by port, whatever order the router lists them in
        traces = {u: [] for u in feeds}
        deadline = time.monotonic() + 20
        while True:
            for u, f in feeds.items():
                traces[u] += f.poll(10_000)
            routing = route_requests(traces, {u: clock_offset(f) for u, f in feeds.items()})
            done = [r for r in routing.routes if r.finished]
            if len(done) >= len(ids) + sum(n for _, n in before.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert all(f.state == "connected" for f in feeds.values()), [f.error for f in feeds.values()]
    finally:
        for f in feeds.values():
            f.stop()
    replica_of = {}
    for rid, n in zip(ids, lens):
        (route,) = [r for r in routing.routes if r.request_id.startswith(short_request_id(rid) + " #")]
        assert route.finished and route.num_tokens >= n
        replica_of[rid] = route.replica
    for url in fleet.replicas:  # each replica's own counters agree with the view, request by request
        mine = [n for rid, n in zip(ids, lens) if replica_of[rid] == url]
        assert sum(mine) == prompt_tokens(url) - before[url][0]
        assert len(mine) == finished_requests(url) - before[url][1] == 3  # round robin
        assert routing.replicas[url].requests == finished_requests(url)  # the view saw every request it ran




@pytest.fixture
def page():
    at = AppTest.from_file(str(PAGE), default_timeout=60)
    at.run()
    assert not at.exception
    yield at
    players = at.session_state["router_players"] if "router_players" in at.session_state else {}
    for player in players.values():
        player.stream.stop()


def connect(at: AppTest, url: str) -> None:
    at.sidebar.text_input(key="router_url").set_value(url).run()
    at.sidebar.button(key="router_connect").click().run()
    assert not at.exception, at.exception


def test_the_page_draws_both_replicas_and_where_each_request_went(fleet, page):
    at = page
    assert "press Connect" in " ".join(m.value for m in at.markdown)
    ids = fleet.send([3, 5])
    connect(at, fleet.url)
    assert not at.error, [e.value for e in at.error]
    for _ in range(20):  # each run is one tick of the live view (a fragment's timer does not fire in AppTest)
        table = at.dataframe[0].value if at.dataframe else None
        if table is not None and all(any(str(v).startswith(short_request_id(r)) for v in table["request"])
                                     for r in ids):
            break
        time.sleep(0.3)
        at.run()
    names = [m.value for m in at.markdown if m.value.startswith("**replica ")]
    assert names == [f"**replica {u.removeprefix('http://')}**" for u in fleet.replicas]
    charts = at.get("plotly_chart")
    assert len(charts) == 3  # two block pools, the requests bar
    rows = {str(r): str(p) for r, p in zip(table["request"], table["replica"])}
    for rid in ids:
        ((_, where),) = [(r, p) for r, p in rows.items() if r.startswith(short_request_id(rid))]
        assert where in [u.removeprefix("http://") for u in fleet.replicas]
    assert {rows[r] for r in rows if any(r.startswith(short_request_id(i)) for i in ids)} == \
        {u.removeprefix("http://") for u in fleet.replicas}  # round robin: one each
    steps = sum(len(p.traces) for p in at.session_state["router_players"].values())
    assert f"every step since Connect ({steps:,} steps" in at.caption[-1].value
    at.button(key="router_pause").click().run()
    assert all(p.paused for p in at.session_state["router_players"].values())
    more = fleet.send([4])
    time.sleep(1.5)
    at.run()
    assert not [r for r in at.dataframe[0].value["request"] if str(r).startswith(short_request_id(more[0]))]
    at.button(key="router_resume").click().run()
    for _ in range(20):
        if [r for r in at.dataframe[0].value["request"] if str(r).startswith(short_request_id(more[0]))]:
            break
        time.sleep(0.3)
        at.run()
    else:
        raise AssertionError("the request sent while paused never showed after Resume")
    at.sidebar.radio(key="router_lang").set_value("zh").run()
    assert not at.exception and [m.value for m in at.markdown if m.value.startswith("**副本 ")]


@pytest.mark.parametrize("kind", ["not_a_url", "closed_port", "a_replica"])
def test_a_bad_router_url_is_a_message(fleet, page, kind):
    url = {"not_a_url": "localhost:8000", "closed_port": "http://127.0.0.1:9",
           "a_replica": fleet.replicas[0]}[kind]
    connect(page, url)
    (error,) = [e.value for e in page.error]
    expected = {"not_a_url": "url must look like http://HOST:PORT", "closed_port": "cannot reach http://127.0.0.1:9",
                "a_replica": f"{fleet.replicas[0]} is not a vLLM router: GET /list_workers answered HTTP 404"}[kind]
    assert error.startswith("Cannot follow this router:") and expected in error, error
    assert "router_players" not in page.session_state


def test_an_api_key_reaches_a_guarded_replicas_feed(bundled_model):
    """A replica started with ``--api-key`` guards its step feed: without the key the feed fails as not minengine
    (HTTP 401), with it the feed connects."""
    from minengine.entrypoints.cli_args import FrontendArgs
    from minengine.viz.server_feed import ServerFeed
    from tests.server_helpers import running_server

    with running_server(bundled_model, FrontendArgs(api_key=["s3cret"])) as server:
        feeds = [ServerFeed(server.url, metrics_every_s=0).start(),
                 ServerFeed(server.url, metrics_every_s=0, api_key="s3cret").start()]
        try:
            for feed in feeds:
                deadline = time.monotonic() + 10
                while feed.state == "connecting" and time.monotonic() < deadline:
                    time.sleep(0.05)
            assert feeds[0].state == "failed" and "HTTP 401" in feeds[0].error.detail, feeds[0].error
            assert feeds[1].state == "connected", feeds[1].error
        finally:
            for feed in feeds:
                feed.stop()


def test_the_dashboard_lists_the_router_page():
    at = AppTest.from_file(str(PAGE.parents[1] / "app.py"), default_timeout=120)
    at.run()
    at.switch_page("pages/Router.py").run()
    assert not at.exception and [t.value for t in at.title] == ["minengine: a fleet behind its router"]

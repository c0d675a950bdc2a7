"""app.py's live-server source, driven headless by ``AppTest``: attach to a real server (in this process, on a
free loopback port) while the official ``openai`` client streams completions into it, and watch the figures grow
and show the server's requests; both languages; Disconnect and a source change stop the feed's thread; a bad
URL, a closed port, something that is not minengine and a connection that drops mid-run are messages, never a
traceback or a hang.

In AppTest a fragment's timer does not fire: each ``at.run()`` is one tick of the live view.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from minengine.viz.server_feed import short_request_id  # noqa: E402
from scripts.live_server_screenshot import ClientLoad  # noqa: E402
from tests.app.conftest import subtitles  # noqa: E402
from tests.canned_server import ENGINE, CannedServer, chunk, http_head, sse, step_dict  # noqa: E402
from tests.server_helpers import free_socket, running_server  # noqa: E402
from tests.streamlit_colors import rewritten_colors  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "app.py"
CJK = re.compile(r"[\u4e00-\u9fff]")
SERVER_FIGURES = 7  # block pool, block tables, batch bars, token timeline, ITL, queues, KV


# the settings of this module's ``server`` fixture (tests/conftest.py)
SERVER_ENGINE_CONFIG = dict(num_kv_blocks=128, max_num_seqs=16)


@pytest.fixture
def app():
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    assert not at.exception
    yield at
    player = at.session_state["server_player"] if "server_player" in at.session_state else None
    if player is not None:
        player.stream.stop()


def attach(at: AppTest, url: str, lang: str = "en") -> None:
    at.radio(key=f"source_{lang}").set_value("server").run()
    at.text_input(key="server_url").set_value(url).run()
    at.button(key="server_connect").click().run()
    assert not at.exception, at.exception


def feed(at: AppTest):
    return at.session_state["server_player"].stream


def status(at: AppTest) -> str | None:
    return next((md.value for md in at.markdown if md.value.startswith(("**Live server", "**实时服务器"))), None)


def status_step(at: AppTest) -> int:
    return int(re.search(r"(?:step|第) (\d+)", status(at)).group(1))


def titles(at: AppTest) -> list[str]:
    """Every chart's title; each chart is also checked for a colour Streamlit's frontend would repaint."""
    out = []
    for c in at.get("plotly_chart"):
        assert rewritten_colors(c.proto.spec) == [], c.proto.spec[:200]
        title = json.loads(c.proto.spec)["layout"].get("title", {})
        out.append(title.get("text", "") if isinstance(title, dict) else str(title))
    return out


def strings(value) -> list[str]:
    """Every string in parsed JSON (``value``: dicts, lists, scalars), keys and values, depth first."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings(k) + strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def figure_text(at: AppTest) -> str:
    """Every string in every chart's figure, parsed from its JSON (never the serialized text, whose escaping is
    the library's choice: plotly 7 writes "…" as \\u2026): trace names, y categories, hover text (request ids
    show up here)."""
    return " ".join(s for c in at.get("plotly_chart") for s in strings(json.loads(c.proto.spec)))


def tick_until(at: AppTest, condition, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        at.run()
        assert not at.exception, at.exception
        if condition():
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {[e.value for e in at.error]}"
        time.sleep(0.2)


def test_attach_to_a_live_server_under_load_in_both_languages(app, server):
    app.radio(key="source_en").set_value("server").run()
    assert not app.exception and not app.get("plotly_chart")
    assert any("press Connect" in md.value for md in app.markdown)
    assert app.button(key="server_disconnect").disabled
    assert not [s for s in app.selectbox if (s.key or "").startswith("preset_")]  # no local workload controls
    attach(app, server.url)
    clients = ClientLoad(server.url, concurrent=3, shared=1, long=1).start()
    try:
        tick_until(app, lambda: status(app) is not None, what="the first step")
        first = status_step(app)
        tick_until(app, lambda: status_step(app) >= first + 20 and len(clients.ids) >= 3, what="20 more steps")
        tick_until(app, lambda: any(short_request_id(rid) in figure_text(app) for rid in clients.ids[:3]),
                   what="the clients' requests in the figures")
        live = titles(app)
        assert len(live) == SERVER_FIGURES, live
        assert live[0].startswith(f"KV block pool at step {status_step(app)} ")  # the latest step received
        assert subtitles(app).count("wall clock: live server") == 4  # timeline, ITL, queues, KV: time axes
        assert "of 128 blocks in use" in live[0] and "128 KV blocks of 16 tokens" in status(app)
        assert not app.error and not clients.errors

        app.radio(key="lang").set_value("zh").run()
        assert not app.exception and not app.error
        assert app.radio(key="source_zh").value == "server"  # the source survives the switch
        tick_until(app, lambda: len(titles(app)) == SERVER_FIGURES, what="the Chinese figures")
        assert all(CJK.search(x) for x in titles(app)), titles(app)
        assert subtitles(app).count("挂钟时间：实时服务器") == 4
        assert status(app).startswith("**实时服务器")
        app.radio(key="lang").set_value("en").run()
    finally:
        clients.stop()
    assert not clients.errors
    server.wait_idle()

    def cards():
        return {m.label: m.value for m in app.metric}

    # the server's /metrics, read every 2 s by the feed: once idle, the engine's own totals
    s = server.engine.summary()
    want = {"Finished requests": f"{s.num_requests:,}", "Generated tokens": f"{s.output_tokens:,}",
            "Prompt tokens": f"{s.prompt_tokens:,}", "Preemptions": f"{s.num_preemptions:,}"}
    tick_until(app, lambda: {k: cards().get(k) for k in want} == want, what=f"the metric cards {want}")
    assert len(cards()) == 8 and s.num_requests >= 3
    assert float(cards()["Mean ITL (ms)"]) > 0 and float(cards()["Mean TTFT (ms)"]) > 0
    # the status line counts the requests the feed saw finish: all of them (it connected before the first)
    assert f"; {s.num_requests} requests finished in the steps received" in status(app)
    the_feed = feed(app)
    app.button(key="server_disconnect").click().run()
    assert the_feed.state == "stopped" and not the_feed._thread.is_alive()
    assert any("Disconnected from" in i.value for i in app.info)
    held = status_step(app)
    time.sleep(1.0)
    app.run()
    assert status_step(app) == held and len(titles(app)) == SERVER_FIGURES  # the last steps stay on screen
    assert app.button(key="server_disconnect").disabled

    attach(app, server.url)  # again, then leave for a local run: the feed goes with the source
    # drawn on Connect: the server's history replay is in the very rerun that the click made
    assert len(titles(app)) == SERVER_FIGURES and status_step(app) == server.engine.traces[-1].step
    tick_until(app, lambda: feed(app).state == "connected", what="connected again")
    the_feed = feed(app)
    app.radio(key="source_en").set_value("local").run()
    assert not app.exception and "server_player" not in app.session_state
    assert the_feed.state == "stopped" and not the_feed._thread.is_alive()
    assert app.button(key="run")  # the local page is back
    assert server.engine.kv_cache_manager.num_free_blocks == server.engine.num_kv_blocks


@pytest.mark.parametrize("url, says", [("localhost:8000", "Not a server URL"), ("ftp://127.0.0.1", "Not a server URL"),
                                       ("", "Not a server URL")])
def test_a_bad_url_is_a_message(app, url, says):
    attach(app, url)
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and says in errors[0], errors
    assert not app.get("plotly_chart") and "server_player" not in app.session_state


def test_a_closed_port_is_a_message_quickly(app):
    sock = free_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    started = time.monotonic()
    attach(app, url)
    tick_until(app, lambda: bool(app.error), timeout_s=10, what="the error")
    assert time.monotonic() - started < 10
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and errors[0].startswith(f"Cannot reach {url}") and "minengine serve" in errors[0]
    assert app.button(key="server_disconnect").disabled and not app.get("plotly_chart")


def test_a_server_that_is_not_minengine_is_a_message(app):
    with CannedServer(http_head("404 Not Found", "application/json", chunked=False), [b"{}"]) as canned:
        attach(app, canned.url)
        tick_until(app, lambda: bool(app.error), timeout_s=10, what="the error")
    errors = [e.value for e in app.error]
    assert "is not a minengine server" in errors[0] and "HTTP 404" in errors[0], errors


def test_a_connection_that_drops_mid_run_keeps_the_figures_and_says_so(app):
    events = [chunk(sse("engine", ENGINE))] + [chunk(sse("step", step_dict(i, 2 if i > 3 else 0))) for i in range(6)]
    with CannedServer(http_head(), events + [b"3e8\r\nevent: st"]) as canned:
        attach(app, canned.url)
        tick_until(app, lambda: bool(app.error), timeout_s=10, what="the error")
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and "dropped after step 5 (6 steps received here)" in errors[0], errors
    assert any("skipped 2 steps" in w.value for w in app.warning)  # the server's num_dropped
    assert len(titles(app)) == SERVER_FIGURES and status_step(app) == 5 and "connection lost" in status(app)
    assert "cmpl-01234567…-0" in figure_text(app)
    app.run()
    assert not app.exception and app.button(key="server_disconnect").disabled


def test_a_server_without_block_tables_draws_the_rest(app, bundled_model):
    with running_server(bundled_model, trace_block_tables=False) as bare:
        attach(app, bare.url)
        clients = ClientLoad(bare.url, concurrent=2, shared=0, long=0, max_tokens=16).start()
        try:
            tick_until(app, lambda: status(app) is not None and status_step(app) >= 10, what="10 steps")
        finally:
            clients.stop()
        assert any("does not record block tables" in i.value for i in app.info)
        assert len(titles(app)) == SERVER_FIGURES - 2 and not app.error  # no pool, no tables; the rest
        feed(app).stop()


def test_a_connection_that_drops_before_any_step_says_so(app):
    with CannedServer(http_head(), [chunk(sse("engine", ENGINE)), b"3e8\r\nevent: st"]) as canned:
        attach(app, canned.url)
        tick_until(app, lambda: bool(app.error), timeout_s=10, what="the error")
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and "dropped before any step arrived" in errors[0], errors
    assert not app.get("plotly_chart") and status(app) is None

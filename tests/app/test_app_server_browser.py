"""The dashboard attached to a real ``python -m minengine serve`` in a real browser: both started as a user
starts them (subprocesses on free loopback ports, the bundled model), headless Chromium driven by Playwright,
the official ``openai`` client streaming completions into the server from threads.

Checked: after Connect the live figures grow by themselves (the step in the block pool's title moves on) and show
the clients' requests; the time figures say "wall clock: live server"; no two labels of a figure overlap and no
metric card is cut off, in English and in 中文 (screenshots ``server_live_<lang>.png`` in
``$MINENGINE_SCREENSHOTS``, default /tmp/minengine_screens); Disconnect holds the picture; closing the tab ends
the feed (the dashboard's connections to the server close); a bad URL and a closed port are messages; a server
killed mid-run is a message and the figures stay.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("streamlit")
psutil = pytest.importorskip("psutil")

from scripts.live_server_screenshot import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    ClientLoad,
    attach,
    free_port,
    live_step,
    pool_step,
    start_dashboard,
    start_server,
    stop,
)
from tests.app.test_app_browser import _CUT_METRICS_JS, overlapping_labels, settled  # noqa: E402

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} missing: apt-get install -y chromium", allow_module_level=True)

SCREENS = Path(os.environ.get("MINENGINE_SCREENSHOTS", "/tmp/minengine_screens"))
SERVER_FIGURES = 7

_TEXTS_JS = "(sel) => Array.from(document.querySelectorAll(sel)).map(t => t.textContent)"


def texts(page, selector: str) -> list[str]:
    return page.evaluate(_TEXTS_JS, selector)


# Each visible figure's title and subtitle (a figure being redrawn can hold two title groups for a moment).
_TITLE_PAIRS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p.offsetParent !== null)
  .map(p => [(p.querySelector('.gtitle') || {}).textContent || '',
             (p.querySelector('.gtitle-subtitle') || {}).textContent || ''])"""


def figure_count(page, want: int, tries: int = 6) -> int:
    """Visible figures, once there are ``want`` of them (or after ``tries``)."""
    n = -1
    for _ in range(tries):
        n = len(page.evaluate(_TITLE_PAIRS_JS))
        if n == want:
            break
        page.wait_for_timeout(700)
    return n


def subtitle_count(page, text: str, want: int, tries: int = 6) -> int:
    """How many visible figures have ``text`` as their subtitle, once it reads ``want`` (or after ``tries``)."""
    n = -1
    for _ in range(tries):
        n = sum(1 for _, sub in page.evaluate(_TITLE_PAIRS_JS) if sub == text)
        if n == want:
            break
        page.wait_for_timeout(700)
    return n


@pytest.fixture(scope="module")
def processes(tmp_path_factory):
    logs = tmp_path_factory.mktemp("attach")
    server_port, app_port = free_port(), free_port()
    with open(logs / "serve.log", "w") as slog, open(logs / "streamlit.log", "w") as alog:
        server = start_server(server_port, slog)
        try:
            dashboard = start_dashboard(app_port, alog)
            try:
                yield {"server": f"http://127.0.0.1:{server_port}", "server_port": server_port,
                       "app": f"http://127.0.0.1:{app_port}", "dashboard": dashboard, "logs": logs}
            finally:
                stop(dashboard)
        finally:
            stop(server)


@pytest.fixture
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def open_page(browser, url: str, height: int = 2600):
    page = browser.new_page(viewport={"width": 1600, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url, wait_until="domcontentloaded", timeout=60_000)
    page.get_by_text("Language / 语言").wait_for(timeout=90_000)
    return page, errors


def no_exception(page, where: str) -> None:
    assert page.locator("[data-testid='stException']").count() == 0, where


def errors_shown(page) -> list[str]:
    return page.locator("[data-testid='stAlertContentError']").all_text_contents()


def wait_for_figures(page, timeout_ms: int = 120_000) -> None:
    page.wait_for_function(f"() => document.querySelectorAll('.js-plotly-plot .gtitle').length >= {SERVER_FIGURES}",
                           timeout=timeout_ms)


def wait_until(condition, timeout_s: float, what: str, page=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f": {errors_shown(page)}" if page else ""))
        time.sleep(0.3)


def connections_to(pid: int, port: int) -> int:
    """Open TCP connections from process ``pid`` to ``port`` on loopback."""
    return sum(1 for c in psutil.Process(pid).net_connections(kind="tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_attached_to_a_live_server_under_load_in_both_languages(processes, browser):
    SCREENS.mkdir(parents=True, exist_ok=True)
    url, dashboard = processes["server"], processes["dashboard"]
    page, page_errors = open_page(browser, processes["app"])
    load = ClientLoad(url, concurrent=6, shared=3, long=1).start()
    try:
        attach(page, url)
        wait_for_figures(page)
        steps = []  # the step read when it first showed (a redraw can hide it a moment later)
        wait_until(lambda: steps.append(pool_step(page)) or steps[-1] is not None, 60, "the first step", page)
        first = steps[-1]
        # grows by itself: no input from us, only the server's clients
        wait_until(lambda: (pool_step(page) or 0) >= first + 30, 90, "30 more steps", page)
        assert live_step(page) is not None  # the status line names the step too
        shown = set(re.findall(r"cmpl-([0-9a-f]{8})…", " ".join(texts(page, ".js-plotly-plot text"))))
        time.sleep(2)  # every request on screen has sent its first chunk to its client by then
        ours = {re.search(r"cmpl-([0-9a-f]{8})", rid).group(1) for rid in load.ids}
        assert shown and shown <= ours, (shown, ours)  # the clients' requests, and only theirs
        assert subtitle_count(page, "wall clock: live server", 4) == 4
        assert any(t.startswith("KV block pool at step") for t in texts(page, '.js-plotly-plot .gtitle'))
        assert connections_to(dashboard.pid, processes["server_port"]) >= 1  # the feed is attached
        page.wait_for_timeout(2500)  # a redraw with the metric cards in place
        page.screenshot(path=str(SCREENS / "server_live_en.png"))
        no_exception(page, "en")
        assert not errors_shown(page)
        assert not overlapping_labels(page)
        assert not settled(page, _CUT_METRICS_JS), "metric values cut off"
        cards = page.locator("[data-testid='stMetricValue']").all_text_contents()
        assert len(cards) == 8 and all(re.search(r"\d", v) for v in cards), cards

        page.get_by_text("中文", exact=True).click()
        page.wait_for_function("() => document.body.innerText.includes('实时服务器 http')", timeout=60_000)
        page.wait_for_function("""() => Array.from(document.querySelectorAll('.js-plotly-plot .gtitle'))
                                  .every(t => /[\u4e00-\u9fff]/.test(t.textContent))""", timeout=60_000)
        held = pool_step(page)
        wait_until(lambda: (pool_step(page) or 0) > held, 60, "a step in Chinese", page)  # still attached
        assert subtitle_count(page, "挂钟时间：实时服务器", 4) == 4
        page.wait_for_timeout(2500)
        page.screenshot(path=str(SCREENS / "server_live_zh.png"))
        no_exception(page, "zh")
        assert not errors_shown(page)
        assert not overlapping_labels(page)
        assert not settled(page, _CUT_METRICS_JS), "metric values cut off (zh)"

        page.get_by_role("button", name="断开", exact=True).click()
        page.get_by_text("已断开与").first.wait_for(timeout=30_000)
        # the last redraw has the steps received up to the disconnect (plotly may draw it after the status line)
        wait_until(lambda: live_step(page) is not None and pool_step(page) == live_step(page), 30,
                   "the figures to catch up with the status line", page)
        held = pool_step(page)
        page.wait_for_timeout(3000)
        assert pool_step(page) == held == live_step(page)  # the picture holds
        wait_until(lambda: connections_to(dashboard.pid, processes["server_port"]) == 0, 20, "the feed to close")

        # attach again, then close the tab: the session ends, and with it the feed
        page.get_by_role("button", name="连接", exact=True).click()
        wait_until(lambda: connections_to(dashboard.pid, processes["server_port"]) >= 1, 30, "a new feed")
        page.close()
        wait_until(lambda: connections_to(dashboard.pid, processes["server_port"]) == 0, 60,
                   "the feed of a closed tab to end")
    finally:
        load.stop()
    assert not load.errors, load.errors[:3]
    assert not page_errors, page_errors


def test_a_bad_url_and_a_closed_port_are_messages(processes, browser):
    page, page_errors = open_page(browser, processes["app"])
    attach(page, "localhost:8000")
    page.get_by_text("Not a server URL").first.wait_for(timeout=30_000)
    closed = free_port()
    started = time.monotonic()
    box = page.get_by_label("Server URL")
    box.fill(f"http://127.0.0.1:{closed}")
    box.press("Enter")
    page.wait_for_timeout(800)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)
    page.get_by_role("button", name="Connect", exact=True).click()
    # a refused connection is a message, not a hang: well within a minute even on a loaded machine
    page.get_by_text(f"Cannot reach http://127.0.0.1:{closed}").first.wait_for(timeout=90_000)
    assert time.monotonic() - started < 90
    assert len(errors_shown(page)) == 1
    assert page.locator(".js-plotly-plot").count() == 0
    no_exception(page, "bad url")
    assert page.get_by_role("button", name="Disconnect").is_disabled()
    SCREENS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENS / "server_unreachable_en.png"))
    assert not page_errors, page_errors


def test_a_server_killed_mid_run_is_a_message_and_the_figures_stay(processes, browser, tmp_path):
    port = free_port()
    with open(tmp_path / "serve.log", "w") as log:
        victim = start_server(port, log)
        url = f"http://127.0.0.1:{port}"
        load = ClientLoad(url, concurrent=3, shared=0, long=0).start()
        try:
            page, page_errors = open_page(browser, processes["app"])
            attach(page, url)
            wait_for_figures(page)
            wait_until(lambda: (pool_step(page) or 0) > 10, 90, "steps from the victim", page)
            os.killpg(victim.pid, signal.SIGKILL)  # mid-run, clients streaming
            victim.wait(timeout=30)
            page.get_by_text(f"The connection to {url} dropped after").first.wait_for(timeout=60_000)
        finally:
            load.stop()
            stop(victim)
    errors = errors_shown(page)
    assert len(errors) == 1 and "press Connect to attach again" in errors[0], errors
    assert figure_count(page, SERVER_FIGURES) == SERVER_FIGURES  # the steps received stay
    assert "connection lost" in page.evaluate("() => document.body.innerText")
    page.wait_for_timeout(1000)
    page.screenshot(path=str(SCREENS / "server_killed_en.png"))
    no_exception(page, "killed")
    assert page.get_by_role("button", name="Disconnect").is_disabled()
    assert not page_errors, page_errors

"""The dashboard in a real browser: ``streamlit run app.py`` on a free localhost port, loaded in headless
Debian Chromium driven by Playwright, Run pressed, the block-table figure awaited, no page errors, a
screenshot saved (and copied to /tmp/minengine_screenshot.png for a human to look at); then the
language switch redraws the page in Chinese (/tmp/minengine_screenshot_zh.png).

Skips when Playwright or /usr/bin/chromium is missing (``playwright install`` needs the network; Debian's
``chromium`` package is used through ``executable_path`` instead).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.dashboard_model import dashboard_model

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REPO = Path(__file__).resolve().parents[1]
SCREENSHOT_COPY = Path("/tmp/minengine_screenshot.png")

sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("streamlit")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} missing: apt-get install -y chromium", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"streamlit did not answer at {url} within {timeout_s} s")


@pytest.fixture
def server(tmp_path):
    model = dashboard_model()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if model is not None:
        env["MINENGINE_MODEL"] = model
    port = free_port()
    log = open(tmp_path / "streamlit.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(REPO / "app.py"), "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # our own process group only (start_new_session above)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_dashboard_runs_in_chromium(server, tmp_path):
    page_errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1400})
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.goto(server, wait_until="domcontentloaded", timeout=60_000)
            run = page.get_by_role("button", name="Run", exact=True)
            run.wait_for(state="visible", timeout=90_000)
            run.click()
            # the block-table figure is drawn by plotly.js once the engine run is done
            title = page.locator(".js-plotly-plot .gtitle", has_text="Block tables at step")
            title.first.wait_for(state="visible", timeout=240_000)
            pool = page.locator(".js-plotly-plot .gtitle", has_text="KV block pool at step")
            pool.first.wait_for(state="visible", timeout=30_000)
            assert page.locator("[data-testid='stException']").count() == 0
            assert page.locator("[data-testid='stAlertContentError']").count() == 0
            page.wait_for_timeout(1000)  # let plotly finish its layout before the picture
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=False)
            # one switch changes every label: the same (cached) run redrawn in Chinese
            page.get_by_text("中文", exact=True).click()
            page.locator(".js-plotly-plot .gtitle", has_text="块表").first.wait_for(state="visible", timeout=60_000)
            assert page.get_by_role("button", name="运行", exact=True).is_visible()
            # every figure redrawn: no English title left (the animation is the last one to update)
            sync_api.expect(page.locator(".js-plotly-plot .gtitle", has_text="KV block pool")).to_have_count(
                0, timeout=60_000)
            assert page.locator(".js-plotly-plot .gtitle", has_text="KV 块池").count() >= 2
            assert page.locator("[data-testid='stException']").count() == 0
            page.wait_for_timeout(1000)
            shot_zh = tmp_path / "dashboard_zh.png"
            page.screenshot(path=str(shot_zh), full_page=False)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000 and shot_zh.stat().st_size > 10_000
    shutil.copyfile(shot, SCREENSHOT_COPY)
    shutil.copyfile(shot_zh, SCREENSHOT_COPY.with_name("minengine_screenshot_zh.png"))
    assert not page_errors, page_errors

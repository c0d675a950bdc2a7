"""The figure of the dashboard attached to a live server under load (docs/server.md), made the way a user would:

    python3 scripts/live_server_screenshot.py [--out docs/dashboard_live_server.png] [--lang en]

starts ``python -m minengine serve`` (bundled model, a 256-block pool and a 128-token budget so the pictures are
readable) and ``streamlit run app.py``, each on a free loopback port; drives the server with the official
``openai`` client from threads (streaming completions: four chats sharing a long system prompt, so the prefix
cache shares their blocks, and four short ones); opens the dashboard in headless Chromium (Playwright), picks the
"live server" source, types the URL, presses Connect, waits until the figures have grown for a while, takes a
screenshot and saves it as a small palette PNG. Everything it started is stopped at the end.

The pieces (``start_server``, ``start_dashboard``, ``ClientLoad``, ``stop``) are also what
``tests/app/test_app_server_browser.py`` uses.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                 "--no-first-run", "--disable-component-update", "--disable-sync"]
# A small pool and budget, and fewer sequence slots than ClientLoad's 8 clients, so the pictures show a queue,
# chunked prefills against the budget and shared prefix blocks.
SERVER_ARGS = ["--num-kv-blocks", "256", "--max-num-batched-tokens", "128", "--max-num-seqs", "6",
               "--max-model-len", "512", "--uvicorn-log-level", "warning"]
SYSTEM_PROMPT = ("You are the Chorus of a play by William Shakespeare. Answer every question in blank verse, in "
                 "the voice of the Chorus, and name the speaker of each line.\n\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONPATH=str(REPO),
                PYTHONUNBUFFERED="1")


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Until ``url`` answers 200 (raises when ``proc`` exits first or on timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


def start_server(port: int, log, model: str | None = None, extra: list[str] = ()) -> subprocess.Popen:
    """``python -m minengine serve`` on 127.0.0.1:``port`` (its own process group); returns once healthy."""
    cmd = [sys.executable, "-m", "minengine", "serve", *([model] if model else []), "--port", str(port),
           *SERVER_ARGS, *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
    except BaseException:
        stop(proc)
        raise
    return proc


def start_dashboard(port: int, log) -> subprocess.Popen:
    """``streamlit run app.py`` on 127.0.0.1:``port`` with the repository's config; returns once healthy."""
    cmd = [sys.executable, "-m", "streamlit", "run", str(REPO / "app.py"), "--server.port", str(port),
           "--server.address", "127.0.0.1"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", proc)
    except BaseException:
        stop(proc)
        raise
    return proc


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Signal ``proc``'s own process group (started with ``start_new_session``), then wait; SIGKILL after 15 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


class ClientLoad:
    """Streaming completions against ``url`` from ``concurrent`` threads with the official ``openai`` client,
    one after another in each thread until stopped: the first ``shared`` threads prepend ``SYSTEM_PROMPT`` (their
    full blocks are prefix-cache hits), the next ``long`` threads send long prompts of their own (~250 tokens,
    prefilled in chunks under a small budget), the others one short opening line.

    ``ids``: the server's request ids ("cmpl-<hex>-0") of every completion that started; ``errors``: what went
    wrong while not stopping (a test checks it is empty, or expects it after killing the server). ``stop()``
    lets each completion in flight finish.
    """

    def __init__(self, url: str, concurrent: int = 8, shared: int = 4, long: int = 2, max_tokens: int = 48):
        from minengine.workloads import SHAKESPEARE_OPENINGS

        self.openings = SHAKESPEARE_OPENINGS
        self.url, self.shared, self.long, self.max_tokens = url, shared, long, max_tokens
        self.ids: list[str] = []
        self.errors: list[BaseException] = []
        self.stopped = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(concurrent)]

    def _run(self, i: int) -> None:
        import openai

        client = openai.OpenAI(base_url=self.url + "/v1", api_key="EMPTY", timeout=60, max_retries=0)
        k = 0
        try:
            model = client.models.list().data[0].id
            while not self.stopped.is_set():
                first = (3 * i + k) % len(self.openings)
                prompt = self.openings[first]
                if i < self.shared:
                    prompt = SYSTEM_PROMPT + prompt
                elif i < self.shared + self.long:  # every opening, starting from a different one
                    prompt = "".join(self.openings[first:] + self.openings[:first])
                stream = client.completions.create(model=model, prompt=prompt, max_tokens=self.max_tokens + 8 * (i % 3),
                                                   temperature=0, stream=True, extra_body={"ignore_eos": True})
                for n, chunk in enumerate(stream):  # to the end: no aborts, so the server's counts add up
                    if n == 0:
                        self.ids.append(chunk.id + "-0")
                k += 1
        except Exception as exc:  # noqa: BLE001 (reported to the caller, which decides)
            if not self.stopped.is_set():
                self.errors.append(exc)

    def start(self) -> ClientLoad:
        for th in self._threads:
            th.start()
        return self

    def stop(self, timeout_s: float = 60) -> None:
        self.stopped.set()
        for th in self._threads:
            th.join(timeout_s)


def attach(page, url: str, lang: str = "en") -> None:
    """In the dashboard: pick the live-server source, type ``url``, press Connect."""
    source = {"en": "live server", "zh": "实时服务器"}[lang]
    page.get_by_text(source, exact=False).first.click()
    box = page.get_by_label({"en": "Server URL", "zh": "服务器地址"}[lang])
    box.wait_for(timeout=60_000)
    box.fill(url)
    box.press("Enter")
    page.wait_for_timeout(800)  # the value reaches the server
    try:  # and its rerun ends (a loaded machine can take seconds): a click during it could be lost with the old page
        page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=20_000)
    except Exception:  # a live view already running reruns by itself: click anyway
        pass
    page.get_by_role("button", name={"en": "Connect", "zh": "连接"}[lang], exact=True).click()


def live_step(page) -> int | None:
    """The step number of the live-server status line, None before the first step."""
    text = page.evaluate("() => document.body.innerText")
    m = re.search(r"(?:Live server \S+, \w+:|实时服务器 \S+，\S+：) *(?:step|第) (\d+)", text)
    return int(m.group(1)) if m else None


def pool_step(page) -> int | None:
    """The step in the block pool figure's title (plotly redraws after the status line: it may lag a tick)."""
    titles = page.evaluate("() => Array.from(document.querySelectorAll('.js-plotly-plot .gtitle'))"
                           ".map(t => t.textContent)")
    for title in titles:
        m = re.search(r"(?:KV block pool at step|第) (\d+)", title)
        if m:
            return int(m.group(1))
    return None


def shot_when_consistent(page, height: int, timeout_s: float = 60) -> bytes:
    """A screenshot of the top ``height`` px taken when all seven figures are drawn and show the step the status
    line says (on a busy machine plotly can be a redraw behind).

    Raises:
        RuntimeError: that never happened within ``timeout_s`` (no picture is better than an empty one).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        step = live_step(page)
        drawn = page.evaluate("() => document.querySelectorAll('.js-plotly-plot .main-svg').length")
        if step is not None and pool_step(page) == step and drawn >= 7:
            page.wait_for_timeout(300)  # plotly's last layout pass
            png = page.screenshot(clip={"x": 0, "y": 0, "width": 1600, "height": height})
            if live_step(page) == step:
                return png
        page.wait_for_timeout(100)
    raise RuntimeError(f"the figures never settled on the status line's step within {timeout_s:.0f} s "
                       "(a machine too busy for the dashboard?): no screenshot written")


def save_small_png(png: bytes, out: Path, width: int = 1400, colors: int = 128) -> int:
    """``png`` scaled to ``width`` px and quantized to a ``colors``-colour palette (plotly's flat colours survive
    it), written to ``out``; returns its size in bytes."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    if img.width > width:
        img = img.resize((width, round(img.height * width / img.width)), Image.LANCZOS)
    img = img.quantize(colors=colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out.parent.mkdir(parents=True, exist_ok=True)
    img.save(out, optimize=True)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "dashboard_live_server.png"))
    ap.add_argument("--lang", default="en", choices=["en", "zh"])
    ap.add_argument("--steps", type=int, default=150, help="steps the dashboard must have shown first")
    ap.add_argument("--height", type=int, default=2030, help="pixels of the page kept from the top")
    a = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "minengine_screenshot"
    logs.mkdir(parents=True, exist_ok=True)
    server_port, app_port = free_port(), free_port()
    with open(logs / "serve.log", "w") as slog, open(logs / "streamlit.log", "w") as alog:
        server = start_server(server_port, slog)
        dashboard = load = None
        try:
            dashboard = start_dashboard(app_port, alog)
            url = f"http://127.0.0.1:{server_port}"
            load = ClientLoad(url).start()
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                try:
                    page = browser.new_page(viewport={"width": 1600, "height": a.height})
                    page.goto(f"http://127.0.0.1:{app_port}", wait_until="domcontentloaded", timeout=60_000)
                    if a.lang == "zh":
                        page.get_by_text("中文", exact=True).click()
                    attach(page, url, a.lang)
                    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 7",
                                           timeout=120_000)
                    first = live_step(page) or 0
                    deadline = time.monotonic() + 180
                    while (live_step(page) or 0) < first + a.steps and time.monotonic() < deadline:
                        page.wait_for_timeout(500)
                    png = shot_when_consistent(page, a.height)
                finally:
                    browser.close()
        finally:
            if load is not None:
                load.stop()
            if dashboard is not None:
                stop(dashboard)
            stop(server)
    size = save_small_png(png, Path(a.out))
    print(f"wrote {a.out} ({size / 1024:.0f} KB); logs in {logs}")


if __name__ == "__main__":
    main()

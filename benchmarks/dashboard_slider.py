"""How long the dashboard takes to redraw when the block-table step slider moves, in a real browser.

    python benchmarks/dashboard_slider.py [--repo PATH] [--preset c] [--moves 7] [--busy 0]

Starts ``streamlit run PATH/app.py`` (default: this checkout) with one torch / OpenMP thread, opens it in headless
Chromium (Playwright), runs the preset to the end (Finish now), opens the Block tables tab, then moves the step
slider one step at a time (the arrow key) ``--moves`` times and times each move from the key press to the moment
the block tables' title shows the new step and the page has stopped running (Streamlit's status widget gone). Prints
each time, the median and the machine's load average (``os.getloadavg``) before and after; ``--busy N`` runs N
busy loops beside it (a loaded machine). ``--repo`` lets one time another checkout (e.g. an export of an older
commit) under the same conditions.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.live_server_screenshot import CHROMIUM, CHROMIUM_ARGS, free_port, stop, wait_http  # noqa: E402


def _busy(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def start(repo: Path, port: int, log) -> object:
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(repo), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(repo / "app.py"), "--server.port",
                             str(port), "--server.address", "127.0.0.1", "--server.headless", "true"],
                            cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_http(f"http://127.0.0.1:{port}/_stcore/health", proc)
    return proc


def pool_step(page) -> int | None:
    title = page.locator(".js-plotly-plot .gtitle", has_text="KV block pool at step").first
    m = re.search(r"step (\d+)", title.text_content(timeout=120_000) or "")
    return int(m.group(1)) if m else None


def idle(page, timeout_ms: int = 300_000) -> None:
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=timeout_ms)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def measure(repo: Path, preset_label: str, moves: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    times = []
    with tempfile.TemporaryFile("w+") as log:
        port = free_port()
        proc = start(repo, port, log)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                page = browser.new_page(viewport={"width": 1600, "height": 2400})
                page.goto(f"http://127.0.0.1:{port}", wait_until="domcontentloaded", timeout=120_000)
                page.get_by_role("button", name="Run", exact=True).wait_for(timeout=120_000)
                if preset_label:
                    box = page.locator("[data-testid='stSidebar'] [data-testid='stSelectbox']").first
                    box.click()
                    page.get_by_role("option", name=re.compile(re.escape(preset_label))).click()
                    idle(page)
                say("page loaded; Run")
                page.get_by_role("button", name="Run", exact=True).click()
                page.get_by_role("button", name="Finish now").click(timeout=120_000)
                say("Finish now pressed")
                page.get_by_role("tab", name="Block tables").wait_for(timeout=300_000)
                idle(page)
                say("run finished")
                page.get_by_role("tab", name="Block tables").click()
                slider = (page.locator("[data-testid='stMain'] [data-testid='stSlider']")
                          .filter(has=page.get_by_text("Step", exact=True)).first.get_by_role("slider"))
                slider.focus()
                slider.press("Home")
                idle(page)
                page.wait_for_function("() => Array.from(document.querySelectorAll('.js-plotly-plot .gtitle'))"
                                       ".some(e => e.textContent.startsWith('Block tables at step 0:'))",
                                       timeout=300_000)
                say("slider at step 0")
                for k in range(1, moves + 1):
                    slider.focus()  # the rerun may have drawn the slider anew
                    t0 = time.perf_counter()
                    slider.press("ArrowRight")
                    if os.environ.get("SLIDER_DEBUG"):
                        page.wait_for_timeout(5000)
                        say(f"value {slider.get_attribute('aria-valuenow')}; titles " + " | ".join(
                            page.locator(".js-plotly-plot .gtitle").all_text_contents()))
                    page.wait_for_function(
                        "(k) => Array.from(document.querySelectorAll('.js-plotly-plot .gtitle'))"
                        ".some(e => e.textContent.startsWith(`Block tables at step ${k}:`))", arg=k, timeout=300_000)
                    page.wait_for_timeout(50)  # the status widget appears within a frame of the rerun starting
                    idle(page)
                    times.append(time.perf_counter() - t0)
                    say(f"move to step {k}: {times[-1]:.2f} s")
                browser.close()
        finally:
            stop(proc)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout whose app.py is timed")
    ap.add_argument("--preset", default="(c)", help="the preset's label prefix in the dropdown ('' = default)")
    ap.add_argument("--moves", type=int, default=7)
    ap.add_argument("--busy", type=int, default=0, help="busy loops beside the dashboard")
    a = ap.parse_args()
    load_before = os.getloadavg()
    busy = [multiprocessing.Process(target=_busy, args=(time.time() + 3600,), daemon=True) for _ in range(a.busy)]
    for b in busy:
        b.start()
    try:
        times = measure(a.repo.resolve(), a.preset, a.moves)
    finally:
        for b in busy:
            b.terminate()
    load_after = os.getloadavg()
    print(f"repo {a.repo}: slider redraw median {statistics.median(times):.2f} s over {len(times)} moves "
          f"(min {min(times):.2f}, max {max(times):.2f}); load average before {load_before[0]:.1f}, after "
          f"{load_after[0]:.1f} on {os.cpu_count()} CPUs; {a.busy} busy loops beside it")


if __name__ == "__main__":
    main()

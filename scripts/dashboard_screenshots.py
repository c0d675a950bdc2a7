"""The dashboard figures of local runs (docs/*.png: README.md, docs/dashboard.md), made the way a user would:

    python3 scripts/dashboard_screenshots.py [--out-dir docs]

starts ``streamlit run app.py`` on a free loopback port, opens it in headless Chromium (Playwright) and, for each
shot, picks the preset, presses Run and Finish now, opens the tab and saves the page's main column as a small
palette PNG: ``dashboard_batch_a.png`` (preset (a)'s batch tab: the bars and the scheduler's decisions in words),
``dashboard_batch_f.png`` (preset (f): the proposals, zoomed), ``dashboard_ab_d.png`` (preset (d)'s A/B tab: 16 vs 4
sequence slots on the sped-up Azure trace). Everything it started is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.live_server_screenshot import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    free_port,
    save_small_png,
    start_dashboard,
    stop,
)

SHOTS = (  # (file, preset label prefix, tab, figures to wait for)
    ("dashboard_batch_a.png", "(a)", "Batch composition", 1),
    ("dashboard_batch_f.png", "(f)", "Batch composition", 2),
    ("dashboard_ab_d.png", "(d)", "A/B comparison", 6),
)


def idle(page) -> None:
    page.wait_for_timeout(300)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=300_000)


def shoot(page, preset: str, tab: str, figures: int) -> bytes:
    option = page.get_by_role("option", name=re.compile(re.escape(preset)))
    for _ in range(3):  # a click during a rerun can land on a select box about to be redrawn: open it again
        idle(page)
        page.locator("[data-testid='stSidebar'] [data-testid='stSelectbox']").first.click()
        try:
            option.wait_for(timeout=10_000)
            break
        except Exception:
            page.keyboard.press("Escape")
    option.click()
    idle(page)
    page.get_by_role("button", name="Run", exact=True).click()
    finish = page.get_by_role("button", name="Finish now")
    finish.click(timeout=120_000)
    finish.wait_for(state="detached", timeout=300_000)  # the live view is gone: the tabs are this run's
    idle(page)
    page.get_by_role("tab", name=tab).click(timeout=300_000)
    page.wait_for_function("""(n) => Array.from(document.querySelectorAll('.js-plotly-plot'))
        .filter(p => p.offsetParent !== null && p.querySelector('.gtitle')).length >= n""", arg=figures,
                           timeout=300_000)
    idle(page)
    page.wait_for_timeout(1500)  # plotly's last layout pass
    return page.locator("[data-testid='stMainBlockContainer']").screenshot()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=str(REPO / "docs"))
    a = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "minengine_screenshot"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "streamlit_local.log", "w") as log:
        dashboard = start_dashboard(free_port(), log)
        port = dashboard.args[dashboard.args.index("--server.port") + 1]
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                try:
                    page = browser.new_page(viewport={"width": 1600, "height": 3400})
                    page.goto(f"http://127.0.0.1:{port}", wait_until="domcontentloaded", timeout=60_000)
                    page.get_by_role("button", name="Run", exact=True).wait_for(timeout=120_000)
                    for name, preset, tab, figures in SHOTS:
                        size = save_small_png(shoot(page, preset, tab, figures), Path(a.out_dir) / name)
                        print(f"{name}: {size / 1e3:.0f} kB")
                finally:
                    browser.close()
        finally:
            stop(dashboard)


if __name__ == "__main__":
    main()

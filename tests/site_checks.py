"""Open pages of the built course site (``scripts/build_site.py``) in headless Chromium and read what a reader sees.

``figures_drawn(pages)``: for each page, with JavaScript on, the number of figure blocks, of plotly plots drawn and of
SVG paths in each plot, the page's JavaScript errors, and every request that left the site's folder (the site must
work offline). ``images_shown(page)``: with JavaScript off, each figure block's fallback image and whether it loaded.
"""

from __future__ import annotations

from pathlib import Path

from scripts.live_server_screenshot import CHROMIUM, CHROMIUM_ARGS

_DRAWN_JS = """
() => Array.from(document.querySelectorAll('.minengine-figure')).map(f => {
  const plot = f.querySelector('.js-plotly-plot');
  return {drawn: !!plot, paths: plot ? plot.querySelectorAll('svg.main-svg path').length : 0,
          height: f.getBoundingClientRect().height};
})
"""
_IMAGES_JS = """
() => Array.from(document.querySelectorAll('.minengine-figure')).map(f => {
  const img = f.querySelector('img');
  return {image: !!img, loaded: img ? img.complete && img.naturalWidth > 0 : false,
          plotted: !!f.querySelector('.js-plotly-plot')};
})
"""


def _browser(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def figures_drawn(pages: list[Path]) -> dict[str, dict]:
    """{page name: {"figures": [{drawn, paths, height}], "errors": [...], "outside": [urls not under file://]}}."""
    from playwright.sync_api import sync_playwright

    result = {}
    with sync_playwright() as p:
        browser = _browser(p)
        try:
            for page_path in pages:
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                page = context.new_page()
                errors, outside = [], []
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
                page.route("**/*", lambda route, outside=outside: (outside.append(route.request.url), route.abort())
                           if not route.request.url.startswith("file://") else route.continue_())
                page.goto(page_path.resolve().as_uri(), wait_until="load", timeout=60_000)
                try:  # every figure block holds a drawn plot (or give up after a minute and report what is there)
                    page.wait_for_function("() => Array.from(document.querySelectorAll('.minengine-figure'))"
                                           ".every(f => f.querySelector('.js-plotly-plot svg.main-svg'))",
                                           timeout=60_000)
                except Exception as exc:  # noqa: BLE001  (playwright's TimeoutError: the assertions say what is missing)
                    errors.append(f"not every figure was drawn within 60 s: {type(exc).__name__}")
                result[page_path.name] = {"figures": page.evaluate(_DRAWN_JS), "errors": errors, "outside": outside}
                context.close()
        finally:
            browser.close()
    return result


def images_shown(page_path: Path) -> list[dict]:
    """With JavaScript disabled: per figure block, {image, loaded, plotted}."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = _browser(p)
        try:
            context = browser.new_context(java_script_enabled=False, viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.goto(page_path.resolve().as_uri(), wait_until="load", timeout=60_000)
            shown = page.evaluate(_IMAGES_JS)  # Playwright's own evaluation works with the page's scripts off
            context.close()
        finally:
            browser.close()
    return shown

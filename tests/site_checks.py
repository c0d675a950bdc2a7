"""Open the built docs site (``scripts/build_docs.py``) in headless Chromium from disk (file://) and read what a
reader sees.

``visit(site)``: every page of the site with JavaScript on: its JavaScript errors (uncaught or logged to the
console), every request that left the site's folder (the site must work offline), its links, the ids an anchor can
land on, and per plotly figure block whether plotly.js drew it. ``dead_links(visits, site)``: each link to a local
page or anchor that does not resolve. ``images_shown(page)``: with JavaScript off, each figure block's fallback
image and whether it loaded. ``search_hits(page, query)``: the titles Material's search lists for ``query``.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from scripts.live_server_screenshot import CHROMIUM, CHROMIUM_ARGS

_PAGE_JS = """
() => ({
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
  ids: Array.from(document.querySelectorAll('[id], a[name]')).map(e => e.id || e.getAttribute('name')),
  figures: Array.from(document.querySelectorAll('.minengine-figure')).map(f => {
    const plot = f.querySelector('.js-plotly-plot');
    return {drawn: !!plot, paths: plot ? plot.querySelectorAll('svg.main-svg path').length : 0};
  }),
})
"""
_IMAGES_JS = """
() => Array.from(document.querySelectorAll('.minengine-figure')).map(f => {
  const img = f.querySelector('img');
  return {image: !!img, loaded: img ? img.complete && img.naturalWidth > 0 : false,
          plotted: !!f.querySelector('.js-plotly-plot')};
})
"""
_ALL_DRAWN_JS = ("() => Array.from(document.querySelectorAll('.minengine-figure'))"
                 ".every(f => f.querySelector('.js-plotly-plot svg.main-svg'))")


def _browser(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def _watched_page(context, errors: list, outside: list):
    """A new page that records JavaScript errors and aborts (and records) every request not under file://."""
    page = context.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.route("**/*", lambda route: (outside.append(route.request.url), route.abort())
               if not route.request.url.startswith("file://") else route.continue_())
    return page


def _read_page(context, path: Path) -> dict:
    errors, outside = [], []
    page = _watched_page(context, errors, outside)
    page.goto(path.resolve().as_uri(), wait_until="load", timeout=60_000)
    try:  # every figure block holds a drawn plot (or give up after a minute and report what is there)
        page.wait_for_function(_ALL_DRAWN_JS, timeout=60_000)
    except Exception as exc:  # noqa: BLE001  (playwright's TimeoutError: the assertions say what is missing)
        errors.append(f"not every figure was drawn within 60 s: {type(exc).__name__}")
    seen = page.evaluate(_PAGE_JS)
    page.close()
    return {**seen, "errors": errors, "outside": outside}


def visit(site: Path, under: str = "") -> dict[str, dict]:
    """{page path relative to ``site``: {"links": [absolute URLs], "ids": [...], "figures": [{drawn, paths}],
    "errors": [...], "outside": [URLs of requests not under file://]}} for every ``*.html`` under ``site`` but
    ``404.html`` (a web server's not-found page: its links are absolute from the server's root); with ``under``,
    only the pages whose path relative to ``site`` starts with it."""
    from playwright.sync_api import sync_playwright

    pages = sorted(p for p in site.rglob("*.html")
                   if p.relative_to(site).as_posix() != "404.html" and p.relative_to(site).as_posix().startswith(under))
    result = {}
    with sync_playwright() as p:
        browser = _browser(p)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            for path in pages:
                result[path.relative_to(site).as_posix()] = _read_page(context, path)
            context.close()
        finally:
            browser.close()
    return result


def dead_links(visits: dict[str, dict], site: Path) -> list[str]:
    """``"page -> link"`` for each file:// link of the visited pages whose file is missing (or is outside ``site``,
    or is a folder) or whose ``#anchor`` is not an id of the page it points at."""
    root = site.resolve()
    dead = []
    for name, seen in visits.items():
        for link in seen["links"]:
            url = urlsplit(link)
            if url.scheme != "file":
                continue
            target = Path(unquote(url.path)).resolve()
            inside = target.is_relative_to(root)
            key = target.relative_to(root).as_posix() if inside else None
            if not (inside and target.is_file()):
                dead.append(f"{name} -> {link}")
            elif url.fragment and key in visits and unquote(url.fragment) not in visits[key]["ids"]:
                dead.append(f"{name} -> {link}")
    return dead


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


def search_hits(page_path: Path, query: str) -> dict:
    """Type ``query`` into Material's search box on ``page_path`` (from disk, network cut): {"hits": [result
    titles], "errors": [...], "outside": [...]}."""
    from playwright.sync_api import sync_playwright

    errors, outside = [], []
    with sync_playwright() as p:
        browser = _browser(p)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            page = _watched_page(context, errors, outside)
            page.goto(page_path.resolve().as_uri(), wait_until="load", timeout=60_000)
            page.click("input.md-search__input")
            page.keyboard.type(query)
            try:
                page.wait_for_selector(".md-search-result__item", timeout=30_000)
            except Exception as exc:  # noqa: BLE001  (no result within 30 s: the caller's assertion says so)
                errors.append(f"no search result within 30 s: {type(exc).__name__}")
            hits = page.eval_on_selector_all(".md-search-result__item h1, .md-search-result__item h2",
                                             "els => els.map(e => e.textContent.trim())")
            context.close()
        finally:
            browser.close()
    return {"hits": hits, "errors": errors, "outside": outside}

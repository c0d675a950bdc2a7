"""Build the course as a static site from the EXECUTED notebooks: readable without running anything.

    python scripts/build_site.py                 # execute every chapter (full size), then build build/site/
    python scripts/build_site.py --fast          # MINENGINE_FAST=1 workloads, no static images (what CI builds)
    python scripts/build_site.py --executed DIR  # build from notebooks already executed into DIR (NN_name.ipynb)
    python scripts/build_site.py 11_attention_kernels 13_spec_decode_math   # some chapters only

Tool: nbconvert's HTML exporter (JupyterLab's template), one page per chapter, plus an index from
notebooks/README.md. Chosen over Jupyter Book 2 / MyST because its build needs no network (MyST's site themes are
downloaded at build time) and no Node toolchain, it is the exporter Jupyter itself ships, and a page is the notebook
as a learner sees it in JupyterLab. Pinned in requirements.txt (nbconvert==7.17.2, kaleido==1.5.0).

Offline: every script the stock template would load from a CDN (require.js, MathJax, Mermaid, the widget manager) is
left out (``scripts/site_template/minengine``); plotly.js is copied from the installed plotly package into
``_static/``. Each plotly figure is drawn by ``Plotly.newPlot`` from its JSON where JavaScript runs, and shown as a
static SVG (exported by kaleido with a headless Chromium) inside ``<noscript>`` otherwise; ``--fast`` skips the images
(the ``<noscript>`` then says the figure needs JavaScript).

A page shows each exercise as the learner meets it: the answer cell with its ``None`` placeholder, the check without
output (the solution stays in its ``<details>`` block); cells the tests insert (wrong answers, restores) are dropped,
and each ipywidgets control is followed by one run of its experiment with its defaults. The notebooks stay the
source of truth (committed without outputs); the site is a build artifact (``build/`` is git-ignored).
"""

from __future__ import annotations

import argparse
import copy
import html
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
TEMPLATE_DIR = Path(__file__).resolve().parent / "site_template"
DEFAULT_OUT = ROOT / "build" / "site"
CHAPTERS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_RE = re.compile(r"interact_manual\((\w+)")
TEST_TAGS = {"test-wrong-answer", "test-wrong", "test-restore"}  # cells tests/course/test_notebooks.py inserts
WIDGET_RUN_TAGS = {"widget-run", "test-widget-call"}
CHROMIUM = "/usr/bin/chromium"
CSS = """
.minengine-nav { display: flex; gap: 1.5em; padding: 0.6em 1em; margin: 0 0 1em 0; background: #f3f5f8;
                 border-bottom: 1px solid #d0d7de; font-family: sans-serif; font-size: 14px; }
.minengine-nav-bottom { margin: 2em 0 0 0; border-top: 1px solid #d0d7de; border-bottom: none; }
.minengine-figure { width: 100%; margin: 0.5em 0; }
.minengine-figure img { max-width: 100%; }
.minengine-static-note { color: #555; font-style: italic; }
.minengine-index { max-width: 980px; margin: 0 auto; padding: 1em 2em; font-family: sans-serif; line-height: 1.5; }
.minengine-index table { border-collapse: collapse; }
.minengine-index td, .minengine-index th { border: 1px solid #ccc; padding: 4px 8px; }
"""


def tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def with_widget_runs(nb):
    """A copy of ``nb`` with, after each ``interact_manual(fn, ...)`` cell, a cell ``fn()`` (tag ``widget-run``): a
    static page cannot run a control, so it shows the control's experiment once with its defaults."""
    nb = copy.deepcopy(nb)
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        match = WIDGET_RE.search(cell.source) if cell.cell_type == "code" else None
        if match:
            cells.append(nbformat.v4.new_code_cell(f"{match.group(1)}()", metadata={"tags": ["widget-run"]}))
    nb.cells = cells
    return nb


def figure_html(fig: dict, div_id: str, image: str | None) -> str:
    """A plotly figure drawn by plotly.js from its JSON, with a static fallback inside ``<noscript>``."""
    layout = fig.get("layout", {})
    title = layout.get("title", {})
    title = title.get("text", "") if isinstance(title, dict) else str(title or "")
    height = int(layout.get("height") or 450)
    spec = json.dumps({"data": fig.get("data", []), "layout": layout}).replace("</", "<\\/")
    fallback = (f'<img src="{image}" alt="{html.escape(title)}">' if image else
                f'<p class="minengine-static-note">Figure: {html.escape(title or "plotly figure")} '
                "(it needs JavaScript; `python scripts/build_site.py` without --fast adds static images).</p>")
    # The div gets its height from the script, so a page without JavaScript shows no empty box above the image.
    return (f'<div class="minengine-figure"><div id="{div_id}" class="plotly-graph-div" style="width:100%"></div>'
            f'<script type="application/json" id="{div_id}-spec">{spec}</script>'
            f'<script>(function () {{ var s = JSON.parse(document.getElementById("{div_id}-spec").textContent); '
            f'var div = document.getElementById("{div_id}"); div.style.height = "{height}px"; '
            f'Plotly.newPlot(div, s.data, s.layout, {{responsive: true, displaylogo: false}}); }})();</script>'
            f"<noscript>{fallback}</noscript></div>")


def site_notebook(executed, source, chapter: str, figures: list[tuple[dict, str]], with_images: bool):
    """The page's notebook: ``executed`` (a copy of ``source`` after nbclient, possibly instrumented by the tests) as
    the learner meets it. Appends ``(figure, image path)`` to ``figures`` for the images to export."""
    nb = copy.deepcopy(executed)
    originals = {c.get("id"): c for c in source.cells}
    cells = []
    for cell in nb.cells:
        t = tags(cell)
        if t & TEST_TAGS:
            continue
        if t & WIDGET_RUN_TAGS:
            call = cell.source.split("#")[0].strip()
            cell.source = f"# The control above cannot run on a static page: its experiment, once, by default\n{call}"
        elif cell.get("id") not in originals:
            continue
        else:
            cell.source = originals[cell["id"]].source  # answers back to their None placeholder
        if cell.cell_type == "code":
            if t & {"answer", "check"}:
                cell.outputs = []
            outputs = []
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if PLOTLY_MIME in data:
                    n = len(figures)
                    image = f"figures/{chapter}-{n:02d}.svg" if with_images else None
                    figures.append((data[PLOTLY_MIME], image))
                    out = nbformat.v4.new_output("display_data", data={"text/html": figure_html(
                        data[PLOTLY_MIME], f"fig-{n:02d}", image)})
                elif WIDGET_MIME in data:
                    out = nbformat.v4.new_output("display_data", data={"text/html": (
                        '<p class="minengine-static-note">An interactive control (ipywidgets): open the notebook in '
                        "Jupyter to use it; the next cell runs it once.</p>")})
                outputs.append(out)
            cell.outputs = outputs
        cells.append(cell)
    nb.cells = cells
    nb.metadata.pop("widgets", None)
    return nb


def execute(chapter: str, fast: bool, timeout_s: int = 600):
    """Run a chapter top to bottom (plain, as a learner would, plus one run of each widget's experiment)."""
    import nbclient

    nb = with_widget_runs(nbformat.read(NOTEBOOKS / f"{chapter}.ipynb", as_version=4))
    env_fast = os.environ.get("MINENGINE_FAST")
    os.environ["MINENGINE_FAST"] = "1" if fast else "0"
    try:
        nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:
        if env_fast is None:
            os.environ.pop("MINENGINE_FAST", None)
        else:
            os.environ["MINENGINE_FAST"] = env_fast
    return nb


def export_images(figures: list[tuple[dict, str]], out: Path) -> None:
    """SVGs of the figures with kaleido (one headless Chromium for all of them)."""
    import plotly.io as pio

    if Path(CHROMIUM).exists():
        os.environ.setdefault("BROWSER_PATH", CHROMIUM)
    todo = [(fig, out / path) for fig, path in figures if path]
    if todo:
        (out / "figures").mkdir(parents=True, exist_ok=True)
        pio.write_images([{"data": f.get("data", []), "layout": f.get("layout", {})} for f, _ in todo],
                         [str(p) for _, p in todo], width=900)


def chapter_title(nb) -> str:
    first = nb.cells[0].source.splitlines()[0] if nb.cells else ""
    return first.lstrip("# ").strip() or "chapter"


def nav(chapter: str, order: list[str], titles: dict[str, str]) -> str:
    i = order.index(chapter)
    links = ['<a href="index.html">Course index</a>']
    if i > 0:
        links.append(f'<a href="{order[i - 1]}.html">← {html.escape(titles[order[i - 1]])}</a>')
    if i + 1 < len(order):
        links.append(f'<a href="{order[i + 1]}.html">{html.escape(titles[order[i + 1]])} →</a>')
    return " ".join(links)


def index_page(built: list[str]) -> str:
    """notebooks/README.md as the index, its .ipynb links pointing at the pages (chapters not built stay links to
    the notebooks on disk)."""
    from nbconvert.filters.markdown import markdown2html

    text = (NOTEBOOKS / "README.md").read_text()
    for chapter in built:
        text = text.replace(f"({chapter}.ipynb)", f"({chapter}.html)")
    body = markdown2html(text)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>The minengine course</title>'
            f'<link rel="stylesheet" href="_static/site.css"></head><body><main class="minengine-index">{body}'
            "</main></body></html>\n")


def build_site(notebooks: dict, out: Path = DEFAULT_OUT, with_images: bool = True,
               sources: dict | None = None) -> list[Path]:
    """Write the site for ``{chapter: executed notebook}`` into ``out``; returns the pages written
    (``out/NN_name.html``; also ``index.html``, ``_static/`` and, with images, ``figures/``).

    ``sources``: ``{chapter: the notebook as committed}`` (default: read from notebooks/), the reference for the
    cells a page keeps and their sources.

    Raises:
        ValueError: a chapter without its source; kaleido's errors when ``with_images`` and it cannot export.
    """
    from nbconvert import HTMLExporter
    from plotly.offline import get_plotlyjs

    out.mkdir(parents=True, exist_ok=True)
    (out / "_static").mkdir(exist_ok=True)
    (out / "_static" / "plotly.min.js").write_text(get_plotlyjs())
    (out / "_static" / "site.css").write_text(CSS)
    exporter = HTMLExporter(extra_template_basedirs=[str(TEMPLATE_DIR)], template_name="minengine")
    order = sorted(notebooks)
    if sources is None:
        sources = {c: nbformat.read(NOTEBOOKS / f"{c}.ipynb", as_version=4) for c in order}
    missing = sorted(set(order) - set(sources))
    if missing:
        raise ValueError(f"no source notebook for {missing}")
    titles = {c: chapter_title(sources[c]) for c in order}
    figures: list[tuple[dict, str]] = []
    pages = []
    for chapter in order:
        page_nb = site_notebook(notebooks[chapter], sources[chapter], chapter, figures, with_images)
        body, _ = exporter.from_notebook_node(page_nb, resources={"metadata": {"name": titles[chapter]},
                                                                  "site_nav": nav(chapter, order, titles)})
        page = out / f"{chapter}.html"
        page.write_text(body)
        pages.append(page)
    if with_images:
        export_images(figures, out)
    (out / "index.html").write_text(index_page(order))
    return pages


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="*", help=f"chapters to build (default: all of {CHAPTERS[0]} ... {CHAPTERS[-1]})")
    ap.add_argument("--fast", action="store_true", help="MINENGINE_FAST=1 workloads and no static images")
    ap.add_argument("--executed", type=Path, help="a folder of already executed notebooks (NN_name.ipynb)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--images", action=argparse.BooleanOptionalAction, default=None,
                    help="static SVG fallbacks with kaleido (default: on, off with --fast)")
    a = ap.parse_args(argv)
    chapters = a.chapters or CHAPTERS
    unknown = sorted(set(chapters) - set(CHAPTERS))
    if unknown:
        raise SystemExit(f"unknown chapters {unknown}; choose from {CHAPTERS}")
    notebooks = {}
    for chapter in chapters:
        if a.executed:
            notebooks[chapter] = nbformat.read(a.executed / f"{chapter}.ipynb", as_version=4)
            continue
        start = time.perf_counter()
        notebooks[chapter] = execute(chapter, a.fast)
        print(f"executed {chapter} in {time.perf_counter() - start:.0f} s", flush=True)
    if a.out.exists():
        shutil.rmtree(a.out)
    pages = build_site(notebooks, a.out, with_images=not a.fast if a.images is None else a.images)
    print(f"wrote {len(pages)} pages and index.html to {a.out}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()

"""Build the docs site: the manual (docs/*.md) and the course (notebooks/*.ipynb), with Material for MkDocs.

    python scripts/build_docs.py                      # every page and chapter, the notebooks as committed
    python scripts/build_docs.py --strict             # any warning (a dead link, a page missing) fails the build
    python scripts/build_docs.py --only 00_tour       # one chapter (the nav and the course index list only it)
    python scripts/build_docs.py --execute [--fast]   # run the chapters first (MINENGINE_FAST=1 with --fast)
    python scripts/build_docs.py --executed DIR       # chapters already executed into DIR (NN_name.ipynb)

The site is written to ``build/site/`` (git-ignored); open ``build/site/index.html`` from disk, no server needed.
mkdocs.yml holds the theme, the plugins and the nav; this script stages what the site shows into
``build/site_src/`` and points mkdocs at it:

- docs/ as it is, its links into notebooks/ mapped to the course pages (``../notebooks/README.md`` is the course
  index ``course/index.md``, ``../notebooks/05_prefix_caching.ipynb`` the chapter's page); a link to a chapter not
  in this build, or to a file outside docs/ and notebooks/, becomes its plain text, so no link is dead;
- ``course/index.md``: notebooks/README.md, the course index;
- ``course/NN_name.ipynb``: each chapter as the learner meets it (cells the tests insert dropped, answers back to
  their ``None`` placeholder, checks without output, a widget replaced by a note and followed by one run of its
  experiment), rendered by mkdocs-jupyter without executing anything;
- figures offline: each plotly figure becomes a block drawn by ``Plotly.newPlot`` from the site's own plotly.js
  (``assets/plotly.min.js``, copied from the installed plotly package; scripts/docs_hooks.py loads it on the pages
  that have figures), with a static SVG (kaleido, headless Chromium) inside ``<noscript>``;
- the nav of mkdocs.yml less the pages and chapters not staged (listed on stderr; ``--strict`` fails on a page of
  docs/ missing, not on a chapter left out with ``--only``).
"""

from __future__ import annotations

import argparse
import copy
import html
import json
import logging
import os
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NOTEBOOKS = ROOT / "notebooks"
CONFIG = ROOT / "mkdocs.yml"
DEFAULT_OUT = ROOT / "build" / "site"
COURSE = "course"  # the course's folder in the site
PLOTLY_JS = "assets/plotly.min.js"
CHAPTERS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
CHAPTERS += sorted(p.stem for p in NOTEBOOKS.glob("lab[0-9]_*.ipynb"))  # the labs' pages, staged as the chapters
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_RE = re.compile(r"interact_manual\((\w+)")
TEST_TAGS = {"test-wrong-answer", "test-wrong", "test-restore"}  # cells tests/course/test_notebooks.py inserts
WIDGET_RUN_TAGS = {"widget-run", "test-widget-call"}
CHROMIUM = "/usr/bin/chromium"
LINK_RE = re.compile(r"(?<!!)\[([^\]\n]*)\]\(([^)\s]+)(\s+\"[^\"]*\")?\)")  # [text](target "title"), not images
EXTERNAL_RE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#|/)", re.I)  # http:, mailto:, an anchor, a site-absolute path


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
                "(it needs JavaScript; a build with images adds a static one).</p>")
    # The div gets its height from the script, so a page without JavaScript shows no empty box above the image.
    return (f'<div class="minengine-figure"><div id="{div_id}" class="plotly-graph-div" style="width:100%"></div>'
            f'<script type="application/json" id="{div_id}-spec">{spec}</script>'
            f'<script>(function () {{ var s = JSON.parse(document.getElementById("{div_id}-spec").textContent); '
            f'var div = document.getElementById("{div_id}"); div.style.height = "{height}px"; '
            f'Plotly.newPlot(div, s.data, s.layout, {{responsive: true, displaylogo: false}}); }})();</script>'
            f"<noscript>{fallback}</noscript></div>")


def page_outputs(cell, chapter: str, figures: list[tuple[dict, str | None]], with_images: bool) -> list:
    """The cell's outputs for the page: a plotly figure as a figure block (appended to ``figures`` with its image
    path, relative to the course folder), a widget as a note."""
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
    return outputs


def site_notebook(executed, source, chapter: str, figures: list[tuple[dict, str | None]], with_images: bool):
    """The page's notebook: ``executed`` (``source`` after nbclient, possibly instrumented by the tests, or
    ``source`` itself) as the learner meets it. Appends ``(figure, image path or None)`` to ``figures``."""
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
            cell.outputs = [] if t & {"answer", "check"} else page_outputs(cell, chapter, figures, with_images)
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


def export_images(figures: list[tuple[dict, str | None]], course_dir: Path) -> None:
    """SVGs of the figures with kaleido (one headless Chromium for all of them), under ``course_dir``."""
    import plotly.io as pio

    if Path(CHROMIUM).exists():
        os.environ.setdefault("BROWSER_PATH", CHROMIUM)
    todo = [(fig, course_dir / path) for fig, path in figures if path]
    if todo:
        (course_dir / "figures").mkdir(parents=True, exist_ok=True)
        pio.write_images([{"data": f.get("data", []), "layout": f.get("layout", {})} for f, _ in todo],
                         [str(p) for _, p in todo], width=900)


def site_path(target: Path, built: set[str]) -> str | None:
    """Where a repository file is in the staged site (a path relative to the site's root), or None when the site
    does not hold it: docs/X is X, notebooks/README.md the course index, a built chapter its page. A page of docs/
    may also name the course as the site does (``course/index.md``, ``course/NN_name.ipynb``)."""
    if target.is_relative_to(DOCS / COURSE):
        name = target.relative_to(DOCS / COURSE).as_posix()
        target = NOTEBOOKS / ("README.md" if name == "index.md" else name)
    if target.is_relative_to(DOCS):
        return target.relative_to(DOCS).as_posix()
    if target.parent == NOTEBOOKS and target.name == "README.md":
        return f"{COURSE}/index.md"
    if target.parent == NOTEBOOKS and target.suffix == ".ipynb" and target.stem in built:
        return f"{COURSE}/{target.name}"
    return None


def rewrite_links(text: str, src_dir: Path, page_dir: str, built: set[str], as_html: bool = False) -> str:
    """Markdown ``text`` of a file in the repository's ``src_dir``, staged in the site's ``page_dir``, with each
    relative link pointed at the staged file (``as_html``: at its built ``.html`` page, for notebook cells, which
    mkdocs does not rewrite). A link to a file the site does not hold keeps its text and loses the link."""
    def one(m: re.Match) -> str:
        label, target, title = m.group(1), m.group(2), m.group(3) or ""
        if EXTERNAL_RE.match(target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        where = site_path((src_dir / path).resolve(), built)
        if where is None:
            return label
        if as_html:
            where = re.sub(r"\.(md|ipynb)$", ".html", where)
        new = os.path.relpath(where, page_dir or ".").replace(os.sep, "/") + (f"#{anchor}" if anchor else "")
        return f"[{label}]({new}{title})"

    return LINK_RE.sub(one, text)


def stage_docs(stage: Path, built: set[str]) -> None:
    """docs/ into ``stage`` with its links mapped (see ``rewrite_links``), and the course index (also the home page
    where docs/ has no ``index.md``)."""
    shutil.copytree(DOCS, stage, ignore=shutil.ignore_patterns("__pycache__"))
    for page in stage.rglob("*.md"):
        src_dir = DOCS / page.parent.relative_to(stage)
        page_dir = page.parent.relative_to(stage).as_posix()
        page.write_text(rewrite_links(page.read_text(), src_dir, page_dir, built))
    (stage / COURSE).mkdir(exist_ok=True)
    course_index = (NOTEBOOKS / "README.md").read_text()
    (stage / COURSE / "index.md").write_text(rewrite_links(course_index, NOTEBOOKS, COURSE, built))
    if not (stage / "index.md").exists():  # no manual in this checkout: the site opens on the course
        print("docs/index.md missing: the course index is the home page", file=sys.stderr)
        (stage / "index.md").write_text(rewrite_links(course_index, NOTEBOOKS, "", built))


def stage_course(stage: Path, notebooks: dict, sources: dict, with_images: bool) -> int:
    """Each chapter's page notebook into ``stage/course/``, plotly.js and the figures' images; returns the number
    of figures."""
    built = set(notebooks)
    figures: list[tuple[dict, str | None]] = []
    for chapter in sorted(notebooks):
        nb = site_notebook(notebooks[chapter], sources[chapter], chapter, figures, with_images)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = rewrite_links(cell.source, NOTEBOOKS, COURSE, built, as_html=True)
        nbformat.write(nb, stage / COURSE / f"{chapter}.ipynb")
    if figures:
        from plotly.offline import get_plotlyjs

        (stage / PLOTLY_JS).parent.mkdir(parents=True, exist_ok=True)
        (stage / PLOTLY_JS).write_text(get_plotlyjs())
    if with_images:
        export_images(figures, stage / COURSE)
    return len(figures)


def nav_present(nav: list, stage: Path) -> tuple[list, list[str]]:
    """The nav less its pages missing from ``stage`` (and sections left empty); returns (nav, missing pages)."""
    kept, missing = [], []
    for item in nav:
        title, value = next(iter(item.items())) if isinstance(item, dict) else (None, item)
        if isinstance(value, list):
            sub, gone = nav_present(value, stage)
            missing += gone
            if sub:
                kept.append({title: sub})
        elif (stage / value).exists():
            kept.append(item)
        else:
            missing.append(value)
    return kept, missing


def build(notebooks: dict, out: Path = DEFAULT_OUT, *, sources: dict | None = None, with_images: bool = True,
          strict: bool = False, stage: Path | None = None) -> Path:
    """Build the site for ``{chapter: notebook}`` (executed or as committed) and the pages of docs/ into ``out``;
    returns ``out`` (``out/index.html``, the manual's pages, ``out/course/NN_name.html``).

    ``sources``: ``{chapter: the notebook as committed}`` (default: read from notebooks/), the reference for the
    cells a page keeps and their sources. ``stage``: the staging folder (default ``out`` + ``_src``; emptied).

    Raises:
        ValueError: a chapter without its source, or with ``strict``, a page of mkdocs.yml's nav missing.
        mkdocs.exceptions.Abort: with ``strict``, any warning of mkdocs (a link to a missing page or anchor).
    """
    from mkdocs.commands.build import build as mkdocs_build
    from mkdocs.config import load_config

    if sources is None:
        sources = {c: nbformat.read(NOTEBOOKS / f"{c}.ipynb", as_version=4) for c in notebooks}
    missing_sources = sorted(set(notebooks) - set(sources))
    if missing_sources:
        raise ValueError(f"no source notebook for {missing_sources}")
    stage = stage or out.with_name(out.name + "_src")
    for folder in (stage, out):
        if folder.exists():
            shutil.rmtree(folder)
    stage_docs(stage, set(notebooks))
    stage_course(stage, notebooks, sources, with_images)
    config = load_config(config_file=str(CONFIG), docs_dir=str(stage), site_dir=str(out), strict=strict)
    config["nav"], missing = nav_present(config["nav"], stage)
    pages_missing = [page for page in missing if not page.startswith(f"{COURSE}/")]  # chapters: left out on purpose
    if missing:
        print(f"not in this build, left out of the nav: {', '.join(missing)}", file=sys.stderr)
    if strict and pages_missing:
        raise ValueError(f"--strict: pages of mkdocs.yml's nav missing from docs/: {pages_missing}")
    mkdocs_build(config)
    return out


def load_chapters(chapters: list[str], executed: Path | None, run: bool, fast: bool) -> dict:
    """{chapter: notebook}: executed now (``run``), read from the folder ``executed``, or as committed."""
    notebooks = {}
    for chapter in chapters:
        if executed:
            notebooks[chapter] = nbformat.read(executed / f"{chapter}.ipynb", as_version=4)
        elif run:
            start = time.perf_counter()
            notebooks[chapter] = execute(chapter, fast)
            print(f"executed {chapter} in {time.perf_counter() - start:.0f} s", flush=True)
        else:
            notebooks[chapter] = nbformat.read(NOTEBOOKS / f"{chapter}.ipynb", as_version=4)
    bare = [c for c, nb in notebooks.items() if not any(cell.get("outputs") for cell in nb.cells)]
    if bare:
        print(f"{len(bare)} chapter(s) without outputs (the notebooks are committed without them; --execute runs "
              f"them first): {', '.join(bare)}", file=sys.stderr)
    return notebooks


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="CHAPTER", default=None,
                    help=f"chapters to build (default: all of {CHAPTERS[0]} ... {CHAPTERS[-1]})")
    ap.add_argument("--strict", action="store_true",
                    help="fail on any warning of mkdocs and on a page of the nav missing from docs/")
    ap.add_argument("--execute", action="store_true", help="run the chapters first (nbclient, kernel python3)")
    ap.add_argument("--fast", action="store_true", help="with --execute: MINENGINE_FAST=1 workloads")
    ap.add_argument("--executed", type=Path, help="a folder of already executed notebooks (NN_name.ipynb)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("-v", "--verbose", action="store_true", help="mkdocs's progress too, not only its warnings")
    ap.add_argument("--images", action=argparse.BooleanOptionalAction, default=True,
                    help="static SVG fallbacks of the figures with kaleido (default: on)")
    a = ap.parse_args(argv)
    if a.fast and not a.execute:
        ap.error("--fast sets the workloads of --execute: give both")
    if a.execute and a.executed:
        ap.error("--execute runs the chapters, --executed reads them already run: give one")
    chapters = a.only or CHAPTERS
    unknown = sorted(set(chapters) - set(CHAPTERS))
    if unknown:
        raise SystemExit(f"unknown chapters {unknown}; choose from {CHAPTERS}")
    log = logging.getLogger("mkdocs")  # mkdocs's warnings (a dead link or anchor) on stderr, as its CLI shows them
    log.addHandler(logging.StreamHandler())
    log.setLevel(logging.INFO if a.verbose else logging.WARNING)
    notebooks = load_chapters(chapters, a.executed, a.execute, a.fast)
    from mkdocs.exceptions import Abort

    try:
        out = build(notebooks, a.out, with_images=a.images, strict=a.strict)
    except (Abort, ValueError) as exc:
        raise SystemExit(f"build_docs: {exc}") from exc
    print(f"wrote the site ({len(notebooks)} chapters) to {out}; open {out / 'index.html'}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()

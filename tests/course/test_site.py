"""The docs site (``scripts/build_docs.py``, ``mkdocs.yml``): Material for MkDocs with the manual's pages of docs/
and the course's notebooks, built and opened from disk in headless Chromium.

One build per module, as CI can afford it: every page of docs/ that exists, the course index, two committed
chapters (as committed: prose and code) and a small executed chapter made here (figures, a widget, the cells the
notebook tests insert), so it is a partial build. Every page is opened with JavaScript on and the network cut:
no JavaScript error, no request outside the site's folder, no dead link or anchor, every plotly figure drawn by the
site's own plotly.js; with JavaScript off each figure shows its static SVG; the search finds a chapter offline.
The real chapters, executed, are built and opened the same way by
``tests/course/test_notebooks.py::test_site_from_executed_notebooks``.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("mkdocs_jupyter")
pytest.importorskip("material")

from scripts import build_docs  # noqa: E402
from scripts.docs_hooks import offline_notebook_html  # noqa: E402

PLACEHOLDER = "answer_1 = None  # replace None with your answer"
BUILT = ("00_tour", "02_paged_attention", "lab1_block_pool")  # committed chapters and a lab page (a partial build)
TEST_CHAPTER = "99_test"
HEADING_RE = re.compile(r"<h[1-6][^>]*>(.*?)</h[1-6]>", re.S)
HISTORY_RE = re.compile(r"\bissue\s*#?\d+|\bedition\b", re.I)


def _figure() -> dict:
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2], mode="lines+markers"))
    fig.update_layout(title="A test figure", height=380)
    return fig.to_plotly_json()


def _display(data: dict):
    return nbformat.v4.new_output("display_data", data=data)


def _notebooks():
    """(source as committed, an executed copy the way tests/course/test_notebooks.py instruments it)."""
    v4 = nbformat.v4
    source = v4.new_notebook(cells=[
        v4.new_markdown_cell("# 99 · A test chapter\n\n## Learning goals\n\nBack to [the tour](00_tour.ipynb), on to "
                             "[chapter 5](05_prefix_caching.ipynb), the [engine](../minengine/engine.py)."),
        v4.new_code_cell("fig.show()"),
        v4.new_code_cell(PLACEHOLDER, metadata={"tags": ["answer"]}),
        v4.new_code_cell("check('Exercise 1', answer_1, 3)", metadata={"tags": ["check"]}),
        v4.new_code_cell("widgets.interact_manual(run_it, n=widgets.IntSlider())"),
    ])
    for i, cell in enumerate(source.cells):
        cell["id"] = f"c{i:03d}"
    executed = nbformat.from_dict(source)
    executed.cells[1].outputs = [_display({"application/vnd.plotly.v1+json": _figure(), "text/html": "<div>cdn</div>",
                                           "text/plain": "Figure()"})]
    executed.cells[2].source = "answer_1 = 3"
    executed.cells[3].outputs = [nbformat.v4.new_output("stream", name="stdout", text="PASS  Exercise 1\n")]
    executed.cells[4].outputs = [_display({"application/vnd.jupyter.widget-view+json": {"model_id": "x"},
                                           "text/plain": "interactive(...)"})]
    wrong = v4.new_code_cell("answer_1 = 4", metadata={"tags": ["test-wrong-answer"]})
    probe = v4.new_code_cell("check('Exercise 1', answer_1, 3)", metadata={"tags": ["test-wrong"]})
    restore = v4.new_code_cell("answer_1 = 3", metadata={"tags": ["test-restore"]})
    run = v4.new_code_cell("run_it()  # test: the widget's experiment", metadata={"tags": ["test-widget-call"]})
    run.outputs = [_display({"application/vnd.plotly.v1+json": _figure()})]
    executed.cells[4:4] = [wrong, probe, restore]
    executed.cells.append(run)
    executed.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    return source, executed


def _chromium():
    pytest.importorskip("playwright.sync_api")
    from tests.site_checks import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} missing: apt-get install -y chromium")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The partial build: docs/, the course index, BUILT as committed and the executed test chapter (images on)."""
    pytest.importorskip("kaleido")
    _chromium()
    source, executed = _notebooks()
    notebooks = {c: nbformat.read(build_docs.NOTEBOOKS / f"{c}.ipynb", as_version=4) for c in BUILT}
    sources = {**notebooks, TEST_CHAPTER: source}
    out = tmp_path_factory.mktemp("docs") / "site"
    return build_docs.build({**notebooks, TEST_CHAPTER: executed}, out, sources=sources, with_images=True)


@pytest.fixture(scope="module")
def visits(site) -> dict[str, dict]:
    from tests.site_checks import visit

    return visit(site)


def test_a_page_is_the_learner_view_with_figures_as_blocks():
    source, executed = _notebooks()
    figures = []
    page = build_docs.site_notebook(executed, source, TEST_CHAPTER, figures, with_images=True)
    sources = [c.source for c in page.cells]
    assert PLACEHOLDER in sources and "answer_1 = 3" not in sources and "answer_1 = 4" not in sources
    inserted = {"test-wrong", "test-wrong-answer", "test-restore"}
    assert not any(inserted & set(c.metadata.get("tags", [])) for c in page.cells)
    check = next(c for c in page.cells if "check" in c.metadata.get("tags", []))
    assert check.outputs == []  # the reader's check runs on the reader's answer
    html_out = [o["data"]["text/html"] for c in page.cells if c.cell_type == "code" for o in c.outputs]
    plots = [h for h in html_out if "Plotly.newPlot" in h]
    assert len(plots) == 2 == len(figures)
    assert all(f'<noscript><img src="figures/{TEST_CHAPTER}-' in h for h in plots) and "cdn" not in "".join(html_out)
    assert any("open the notebook in Jupyter" in h for h in html_out)  # the widget, replaced by a note
    assert page.cells[-1].source.endswith("run_it()") and "test:" not in page.cells[-1].source
    assert "widgets" not in page.metadata
    without = build_docs.site_notebook(executed, source, TEST_CHAPTER, [], with_images=False)
    note = [o["data"]["text/html"] for o in without.cells[1].outputs][0]
    assert "<img" not in note and "needs JavaScript" in note


@settings(max_examples=60, deadline=None)
@given(built=st.sets(st.sampled_from(build_docs.CHAPTERS)), chapter=st.sampled_from(build_docs.CHAPTERS),
       in_features=st.booleans(), anchor=st.sampled_from(["", "#a-section"]))
def test_links_point_into_the_site_or_lose_their_link(built, chapter, in_features, anchor):
    """From any page of docs/ (top level or features/): a chapter link (into notebooks/, or to course/ as the site
    names it) goes to its course page when the chapter is built and becomes plain text when it is not; the course
    index, a docs page, an image and a web link stay links; a repository file outside the site becomes plain text."""
    up = "../.." if in_features else ".."
    src_dir = build_docs.DOCS / "features" if in_features else build_docs.DOCS
    page_dir = "features" if in_features else ""
    here = "../" if in_features else ""
    text = (f"[ch]({up}/notebooks/{chapter}.ipynb{anchor}) [idx]({up}/notebooks/README.md) "
            f"[ro]({here}reading_order.md#the-path) ![pic]({here}dashboard_ab_d.png) [web](https://vllm.ai) "
            f"[src]({up}/minengine/engine.py) [top](#top) [ch]({here}course/{chapter}.ipynb{anchor}) "
            f"[idx]({here}course/index.md)")
    out = build_docs.rewrite_links(text, src_dir, page_dir, built)
    chapter_link = f"[ch]({here}course/{chapter}.ipynb{anchor})" if chapter in built else "ch"
    assert out == (f"{chapter_link} [idx]({here}course/index.md) [ro]({here}reading_order.md#the-path) "
                   f"![pic]({here}dashboard_ab_d.png) [web](https://vllm.ai) src [top](#top) {chapter_link} "
                   f"[idx]({here}course/index.md)")
    in_course = build_docs.rewrite_links(f"[ch]({chapter}.ipynb)", build_docs.NOTEBOOKS, "course", built,
                                         as_html=True)
    assert in_course == (f"[ch]({chapter}.html)" if chapter in built else "ch")


def test_the_nav_holds_the_manual_and_every_chapter_and_lab_page_and_is_offline():
    config = yaml.safe_load(build_docs.CONFIG.read_text())
    chapters = [c for c in build_docs.CHAPTERS if c[:2].isdigit()]
    lab_pages = [c for c in build_docs.CHAPTERS if c.startswith("lab")]
    course = next(item["Course"] for item in config["nav"] if "Course" in item)
    assert course == ["course/index.md"] + [f"course/{c}.ipynb" for c in chapters]
    labs = next(item["Lab pages"] for item in config["nav"] if "Lab pages" in item)
    assert labs == [f"course/{c}.ipynb" for c in lab_pages]
    assert len(chapters) == 18 and len(lab_pages) == 7 and chapters + lab_pages == build_docs.CHAPTERS
    assert config["docs_dir"] == "docs" and config["use_directory_urls"] is False
    assert config["theme"]["font"] is False and "analytics" not in config.get("extra", {})
    jupyter = next(p["mkdocs-jupyter"] for p in config["plugins"] if isinstance(p, dict) and "mkdocs-jupyter" in p)
    assert jupyter["execute"] is False and jupyter["include_requirejs"] is False
    polyfills = [build_docs.DOCS / p for p in config["extra"]["polyfills"]]
    assert polyfills and all(p.is_file() and "http" not in p.read_text().split("*/", 1)[1] for p in polyfills)


def test_nav_present_leaves_out_missing_pages_and_empty_sections(tmp_path):
    (tmp_path / "a.md").write_text("# a")
    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "00_tour.ipynb").write_text("{}")
    nav = [{"Home": "a.md"}, {"Gone": ["b.md", "c.md"]}, {"Course": ["course/index.md", "course/00_tour.ipynb"]}]
    kept, missing = build_docs.nav_present(nav, tmp_path)
    assert kept == [{"Home": "a.md"}, {"Course": ["course/00_tour.ipynb"]}]
    assert missing == ["b.md", "c.md", "course/index.md"]


def test_the_hook_takes_the_cdn_loaders_out_and_loads_the_local_plotly():
    page = ('<!-- Load mathjax -->\n<script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/x.js"> </script>\n'
            "<!-- End of mathjax configuration -->"
            '<script type="module">\n const m = (await import("https://cdnjs.cloudflare.com/mermaid.mjs"));</script>'
            '<p>text</p><div class="minengine-figure">a</div><div class="minengine-figure">b</div>')
    out = offline_notebook_html(page, "../assets/plotly.min.js")
    assert "cdnjs" not in out and "mathjax" not in out.lower() and "mermaid" not in out
    assert out.count("plotly.min.js") == 1 and out.index("plotly.min.js") < out.index("minengine-figure")
    assert offline_notebook_html("<p>no figure</p>", "x.js") == "<p>no figure</p>"
    with pytest.raises(ValueError, match="cdnjs"):
        offline_notebook_html('<script src="https://cdnjs.cloudflare.com/other.js"></script>', "x.js")


def test_dead_links_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    from tests.site_checks import dead_links

    (tmp_path / "a.html").write_text("a")
    (tmp_path / "b.html").write_text("b")
    base = tmp_path.resolve().as_uri()
    visits = {"a.html": {"links": [f"{base}/b.html#here", f"{base}/b.html#gone", f"{base}/c.html",
                                   f"{base}/../outside.html", "https://example.org/x"], "ids": []},
              "b.html": {"links": [f"{base}/a.html"], "ids": ["here"]}}
    dead = dead_links(visits, tmp_path)
    assert dead == [f"a.html -> {base}/b.html#gone", f"a.html -> {base}/c.html", f"a.html -> {base}/../outside.html"]


def test_every_page_opens_offline_with_no_dead_link(site, visits):
    from tests.site_checks import dead_links

    docs_pages = {p.relative_to(build_docs.DOCS).with_suffix(".html").as_posix() for p in build_docs.DOCS.rglob("*.md")}
    chapters = {f"course/{c}.html" for c in (*BUILT, TEST_CHAPTER)}
    assert set(visits) == docs_pages | chapters | {"index.html", "course/index.html"}
    problems = {name: (seen["errors"], seen["outside"]) for name, seen in visits.items()
                if seen["errors"] or seen["outside"]}
    assert problems == {}
    assert dead_links(visits, site) == []
    assert sum(len(seen["links"]) for seen in visits.values()) > 10 * len(visits)  # the nav's links were read


def test_figures_are_drawn_by_the_local_plotly_and_only_where_there_are_figures(site, visits):
    figures = visits[f"course/{TEST_CHAPTER}.html"]["figures"]
    assert len(figures) == 2 and all(f["drawn"] and f["paths"] > 0 for f in figures)
    assert (site / "assets" / "plotly.min.js").stat().st_size > 1_000_000
    loads_plotly = {p.relative_to(site).as_posix() for p in site.rglob("*.html") if "plotly.min.js" in p.read_text()}
    assert loads_plotly == {f"course/{TEST_CHAPTER}.html"}
    assert not any(seen["figures"] for name, seen in visits.items() if name != f"course/{TEST_CHAPTER}.html")


def test_figures_show_their_static_image_without_javascript(site):
    from tests.site_checks import images_shown

    shown = images_shown(site / "course" / f"{TEST_CHAPTER}.html")
    assert len(shown) == 2 and all(s["image"] and s["loaded"] and not s["plotted"] for s in shown)


def test_a_partial_build_lists_only_the_chapters_built(site, visits):
    index_links = {Path(link).name for link in visits["course/index.html"]["links"] if "/course/" in link}
    chapter_pages = {name for name in index_links if re.match(r"\d\d_|lab\d_", name)}
    assert chapter_pages == {f"{c}.html" for c in BUILT}  # the nav and the tables (the test chapter is in neither)
    text = (site / "course" / "index.html").read_text()
    assert "Prefix caching" in text and 'href="05_prefix_caching.html"' not in text  # its name, no link
    page = (site / "course" / f"{TEST_CHAPTER}.html").read_text()
    assert 'href="00_tour.html"' in page and "05_prefix_caching" not in page and "engine.py" not in page


def _markdown_headings() -> dict[str, list[str]]:
    """{file: its markdown headings} for every page of docs/, the course index and every chapter's markdown cells."""
    texts = {p.name: p.read_text() for p in [*build_docs.DOCS.rglob("*.md"), build_docs.NOTEBOOKS / "README.md"]}
    for chapter in build_docs.CHAPTERS:
        nb = nbformat.read(build_docs.NOTEBOOKS / f"{chapter}.ipynb", as_version=4)
        texts[chapter] = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return {name: re.findall(r"^#+ (.*)$", text, re.M) for name, text in texts.items()}


def test_no_heading_speaks_of_issues_or_editions(site):
    """Every heading of the built site, and of every source page and chapter (built here or not)."""
    headings = {p.relative_to(site).as_posix(): [re.sub(r"<[^>]+>", "", h) for h in HEADING_RE.findall(p.read_text())]
                for p in site.rglob("*.html")}
    headings.update(_markdown_headings())
    assert sum(map(len, headings.values())) > len(headings)
    assert {name: [h for h in hs if HISTORY_RE.search(h)] for name, hs in headings.items()
            if any(HISTORY_RE.search(h) for h in hs)} == {}


def test_search_finds_a_chapter_offline(site):
    from tests.site_checks import search_hits

    found = search_hits(site / "course" / "index.html", "PagedAttention")
    assert found["errors"] == [] and found["outside"] == []
    assert any(hit.startswith("02 · PagedAttention") for hit in found["hits"]), found["hits"]


def _nav_pages(nav: list) -> list[str]:
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


@pytest.mark.parametrize("anchor, fails", [("#no-such-section", True), ("#exercise-1", False)])
def test_strict_build_fails_on_a_dead_anchor_into_a_chapter(tmp_path, monkeypatch, anchor, fails):
    """A docs tree made here with every page of the nav: ``--strict`` stops on a link to a section a chapter does
    not have (mkdocs learns a notebook page's ids from scripts/docs_hooks.py) and passes the same link to one it
    has."""
    from mkdocs.exceptions import Abort

    config = yaml.safe_load(build_docs.CONFIG.read_text())
    docs = tmp_path / "docs"
    shutil.copytree(build_docs.DOCS / "assets", docs / "assets")
    for page in _nav_pages(config["nav"]):
        if not page.startswith("course/"):
            (docs / page).parent.mkdir(parents=True, exist_ok=True)
            (docs / page).write_text(f"# {page}\n")
    (docs / "index.md").write_text(f"# Home\n\nSee [the tour's first exercise](../notebooks/00_tour.ipynb{anchor}).\n")
    (tmp_path / "notebooks").symlink_to(build_docs.NOTEBOOKS)  # so that ../notebooks/ from docs/ is the course
    monkeypatch.setattr(build_docs, "DOCS", docs)
    tour = {"00_tour": nbformat.read(build_docs.NOTEBOOKS / "00_tour.ipynb", as_version=4)}
    if fails:
        with pytest.raises(Abort, match="warning"):
            build_docs.build(tour, tmp_path / "site", with_images=False, strict=True)
    else:
        site = build_docs.build(tour, tmp_path / "site", with_images=False, strict=True)
        assert f'href="course/00_tour.html{anchor}"' in (site / "index.html").read_text()


def test_the_site_names_only_scripts_that_exist():
    """Every ``scripts/...`` file a page of the site names (docs/, the course index) is in the repository, so a
    reader's command runs (the site's builder is scripts/build_docs.py)."""
    pages = [*build_docs.DOCS.rglob("*.md"), build_docs.NOTEBOOKS / "README.md"]
    named = {(p.relative_to(build_docs.ROOT).as_posix(), m) for p in pages
             for m in re.findall(r"\bscripts/[\w/.-]+\.(?:py|sh)\b", p.read_text())}
    assert any(m == "scripts/build_docs.py" for _, m in named)
    assert sorted((page, m) for page, m in named if not (build_docs.ROOT / m).exists()) == []

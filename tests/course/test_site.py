"""The course site (``scripts/build_site.py``) on a small executed notebook made here, no kernel needed: a page shows
what a learner meets (the tests' inserted cells gone, answers back to their placeholder, checks without output, a
widget replaced by a note and followed by its experiment), every plotly figure becomes a block drawn by the site's
own plotly.js, with a static SVG inside ``<noscript>``; in headless Chromium the figure is drawn with JavaScript on,
its image shown with JavaScript off, and nothing is requested from outside the site's folder.

The real chapters are built and opened the same way by
``tests/course/test_notebooks.py::test_site_from_executed_notebooks`` from the notebooks that test executes."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbconvert")

from scripts import build_site  # noqa: E402

PLACEHOLDER = "answer_1 = None  # replace None with your answer"


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
        v4.new_markdown_cell("# 99 · A test chapter\n\n## Learning goals"),
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


def test_a_page_is_the_learner_view_with_figures_as_blocks():
    source, executed = _notebooks()
    figures = []
    page = build_site.site_notebook(executed, source, "99_test", figures, with_images=True)
    sources = [c.source for c in page.cells]
    assert PLACEHOLDER in sources and "answer_1 = 3" not in sources and "answer_1 = 4" not in sources
    inserted = {"test-wrong", "test-wrong-answer", "test-restore"}
    assert not any(inserted & set(c.metadata.get("tags", [])) for c in page.cells)
    check = next(c for c in page.cells if "check" in c.metadata.get("tags", []))
    assert check.outputs == []  # the reader's check runs on the reader's answer
    html_out = [o["data"]["text/html"] for c in page.cells if c.cell_type == "code" for o in c.outputs]
    plots = [h for h in html_out if "Plotly.newPlot" in h]
    assert len(plots) == 2 == len(figures)
    assert all("<noscript><img src=\"figures/99_test-" in h for h in plots) and "cdn" not in "".join(html_out)
    assert any("open the notebook in Jupyter" in h for h in html_out)  # the widget, replaced by a note
    assert page.cells[-1].source.endswith("run_it()") and "test:" not in page.cells[-1].source
    assert "widgets" not in page.metadata
    without = build_site.site_notebook(executed, source, "99_test", [], with_images=False)
    note = [o["data"]["text/html"] for o in without.cells[1].outputs][0]
    assert "<img" not in note and "needs JavaScript" in note


def test_the_site_draws_offline_with_and_without_javascript(tmp_path):
    pytest.importorskip("playwright.sync_api")
    pytest.importorskip("kaleido")
    from tests.site_checks import CHROMIUM, figures_drawn, images_shown

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} missing")
    source, executed = _notebooks()
    pages = build_site.build_site({"99_test": executed}, tmp_path, with_images=True, sources={"99_test": source})
    assert [p.name for p in pages] == ["99_test.html"] and (tmp_path / "index.html").exists()
    text = pages[0].read_text()
    assert "cdnjs" not in text and "unpkg" not in text and "mathjax" not in text.lower()
    seen = figures_drawn(pages)["99_test.html"]
    assert seen["errors"] == [] and seen["outside"] == []
    assert len(seen["figures"]) == 2 and all(f["drawn"] and f["paths"] > 0 for f in seen["figures"])
    shown = images_shown(pages[0])
    assert len(shown) == 2 and all(s["image"] and s["loaded"] and not s["plotted"] for s in shown)

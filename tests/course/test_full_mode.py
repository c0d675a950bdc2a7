"""Every chapter run top to bottom in full mode (``MINENGINE_FAST`` unset: what a learner's *Run All* does).

``test_notebooks.py`` runs the chapters in fast mode, with the solutions and the wrong answers put in; a conclusion
that holds there may still fail on full mode's larger workloads (chapter 07 once did: its claim needed a rate that
full mode's sweep did not reach). Here each chapter runs as the learner gets it, in full mode: no cell may end in an
error, so every conclusion's checks (``ConclusionError``) hold on full mode's own numbers, and every conclusion cell
must render its sentence.

Every chapter runs here, chapters 04 and 10 included: their full modes were made light enough for CI (chapter 10's
once replayed a 1,000-request window through eight routers and a goodput search, 16 to 21 minutes on the 2-core CI
machine under load; chapter 04's swept an 8,000-token prompt over six chunk sizes), while staying larger than, and
different from, their fast modes. Chapter 07, whose full mode once broke, runs here. The chapters are split over two
test classes of about equal time, so ``pytest -n 2 --dist loadscope`` runs the two halves on two workers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.course.test_notebooks import CELL_TIMEOUT_S, CHAPTERS, NOTEBOOKS_DIR, all_outputs, load, tags

SOURCES_DIR = NOTEBOOKS_DIR.parent / "scripts" / "course"
# Two halves of about equal time: alternate chapters, then move chapter 04 (among the longest in full mode) to the
# half without chapter 10 (the longest).
FIRST_HALF = [c for c in CHAPTERS[0::2] if c != "04_chunked_prefill"]
SECOND_HALF = [c for c in CHAPTERS if c not in FIRST_HALF]


def run_full(chapter: str, monkeypatch) -> None:
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("ipywidgets")
    from minengine.config import BUNDLED_MODEL

    if not os.environ.get("MINENGINE_MODEL") and not (Path(BUNDLED_MODEL) / "config.json").exists():
        pytest.fail("bundled model missing: run scripts/train_tiny_model.py or set MINENGINE_MODEL")
    monkeypatch.delenv("MINENGINE_FAST", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    nb = load(chapter)
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}).execute()
    errors = [o for o in all_outputs(nb) if o.get("output_type") == "error"]
    assert not errors, f"{chapter} in full mode: {[e.get('ename') + ': ' + e.get('evalue', '') for e in errors]}"
    for cell in nb.cells:
        if "conclusion" in tags(cell):
            kinds = [o.get("output_type") for o in cell.get("outputs", [])]
            rendered = [k for k in kinds if k in ("display_data", "execute_result")]
            assert rendered, f"{chapter} in full mode: a conclusion cell rendered nothing: {cell.source[:120]!r}"


@pytest.mark.slow
class TestFullModeFirstHalf:
    @pytest.mark.parametrize("chapter", FIRST_HALF)
    def test_runs_in_full_mode(self, chapter, monkeypatch):
        run_full(chapter, monkeypatch)


@pytest.mark.slow
class TestFullModeSecondHalf:
    @pytest.mark.parametrize("chapter", SECOND_HALF)
    def test_runs_in_full_mode(self, chapter, monkeypatch):
        run_full(chapter, monkeypatch)


def test_every_chapter_runs_here():
    """Each chapter source (scripts/course/chNN_*.py) has its notebook, and each notebook runs in exactly one half."""
    sources = sorted(p.stem[2:] for p in SOURCES_DIR.glob("ch[0-9][0-9]_*.py"))
    assert sources, f"no chapter sources in {SOURCES_DIR}"
    missing = sorted(set(sources) - set(CHAPTERS))
    assert sources == CHAPTERS, f"chapters without a notebook: {missing}: run scripts/build_notebooks.py"
    assert sorted(FIRST_HALF + SECOND_HALF) == CHAPTERS and not set(FIRST_HALF) & set(SECOND_HALF)
    assert "10_fleet" in FIRST_HALF and "04_chunked_prefill" in SECOND_HALF, "the two longest full modes share a worker"

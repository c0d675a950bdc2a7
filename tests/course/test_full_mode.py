"""Every chapter run top to bottom in full mode (``MINENGINE_FAST`` unset: what a learner's *Run All* does).

``test_notebooks.py`` runs the chapters in fast mode, with the solutions and the wrong answers put in; a conclusion
that holds there may still fail on full mode's larger workloads (chapter 07 once did: its claim needed a rate that
full mode's sweep did not reach). Here each chapter runs as the learner gets it, in full mode: no cell may end in an
error, so every conclusion's checks (``ConclusionError``) hold on full mode's own numbers, and every conclusion cell
must render its sentence.

Two chapters' full modes run only with ``MINENGINE_COURSE_FULL_ALL=1`` (``scripts/test_course_full.sh``), not in
every CI run, to keep CI's time: chapter 10's replays a long trace window through a real fleet and simulates eight
routers (16 to 21 minutes of wall time on the 2-core CI machine under load), chapter 04's sweeps long prompts
(2.5 minutes there). Chapter 07, whose full mode once broke, runs here. The chapters are split over two test
classes, so ``pytest -n 2 --dist loadscope`` runs the two halves on two workers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.course.test_notebooks import CELL_TIMEOUT_S, CHAPTERS, NOTEBOOKS_DIR, all_outputs, load, tags

HEAVY = {"04_chunked_prefill", "10_fleet"}  # minutes in full mode: only with MINENGINE_COURSE_FULL_ALL=1
RUN = [c for c in CHAPTERS if c not in HEAVY or os.environ.get("MINENGINE_COURSE_FULL_ALL") == "1"]


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
    @pytest.mark.parametrize("chapter", RUN[0::2])
    def test_runs_in_full_mode(self, chapter, monkeypatch):
        run_full(chapter, monkeypatch)


@pytest.mark.slow
class TestFullModeSecondHalf:
    @pytest.mark.parametrize("chapter", RUN[1::2])
    def test_runs_in_full_mode(self, chapter, monkeypatch):
        run_full(chapter, monkeypatch)


def test_every_chapter_but_the_heavy_ones_runs_here():
    assert HEAVY <= set(CHAPTERS), "a renamed chapter would silently leave the full-mode runs"
    assert set(RUN) >= set(CHAPTERS) - HEAVY

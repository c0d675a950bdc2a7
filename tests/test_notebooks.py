"""The notebook course: structure of every chapter, and every chapter executed top to bottom.

Structure (fast): learning goals, 2-4 exercises each with an answer placeholder, a PASS/FAIL check and a
revealable solution, an ipywidgets control, a summary, a bilingual glossary, no stored outputs.

Execution (nbclient, kernel python3, ``MINENGINE_FAST=1``): each exercise's answer cell is replaced by the
solution shown to the learner, so the run proves that the solutions are right and the checks print PASS; each
widget's callback is called once with its defaults; any error output, in a cell or inside a widget's output,
fails the test.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
CHAPTERS = ["00_tour", "01_prefill_decode", "02_paged_attention", "03_continuous_batching",
            "04_chunked_prefill", "05_prefix_caching", "06_admission_preemption", "07_scheduler_slos",
            "08_interview"]
CELL_TIMEOUT_S = 600
SOLUTION_RE = re.compile(r"```python\n(.*?)\n```", re.S)
CJK_RE = re.compile(r"[\u4e00-\u9fff]")
WIDGET_RE = re.compile(r"interact_manual\((\w+)")


def load(chapter: str):
    path = NOTEBOOKS_DIR / f"{chapter}.ipynb"
    assert path.exists(), f"{path} missing: run python scripts/build_notebooks.py"
    return nbformat.read(path, as_version=4)


def tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def exercises(nb) -> list[tuple[int, int, int]]:
    """(answer, check, solution) cell indices of each exercise, in order."""
    out = []
    for i, cell in enumerate(nb.cells):
        if "answer" in tags(cell):
            check = next(j for j in range(i + 1, len(nb.cells)) if "check" in tags(nb.cells[j]))
            solution = next(j for j in range(i + 1, len(nb.cells)) if "solution" in tags(nb.cells[j]))
            out.append((i, check, solution))
    return out


def with_solutions(nb):
    """A copy of ``nb`` whose answer cells hold the solution code from the solution cells."""
    nb = nbformat.from_dict(nb)
    for answer, _, solution in exercises(nb):
        match = SOLUTION_RE.search(nb.cells[solution].source)
        assert match, f"solution cell {solution} has no ```python block"
        nb.cells[answer].source = match.group(1)
    return nb


def with_widget_calls(nb):
    """A copy of ``nb`` where each ``interact_manual(fn, ...)`` cell is followed by a cell calling ``fn()`` with its
    defaults: under nbclient nobody presses *Run*, so this is how the widgets' experiments get executed."""
    nb = nbformat.from_dict(nb)
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        match = WIDGET_RE.search(cell.source) if cell.cell_type == "code" else None
        if match:
            cells.append(nbformat.v4.new_code_cell(f"{match.group(1)}()  # test: the widget's experiment"))
    nb.cells = cells
    return nb


def all_outputs(nb):
    """Every output of every code cell, plus outputs stored in widget state (Output widgets)."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            yield from cell.get("outputs", [])
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    for model in state.values():
        yield from model.get("state", {}).get("outputs", []) or []


def output_text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    return data.get("text/plain", "") + data.get("text/markdown", "")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_structure(chapter):
    nb = load(chapter)
    md = [c.source for c in nb.cells if c.cell_type == "markdown"]
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert "## Learning goals" in nb.cells[0].source, "the first cell must state the learning goals"
    assert any(s.startswith("## Summary") for s in md), "no ## Summary section"
    glossary = [s for s in md if s.startswith("## Glossary")]
    assert glossary and CJK_RE.search(glossary[0]) and "| English | 中文 |" in glossary[0], "no bilingual glossary"
    assert glossary[0].count("\n|") >= 5, "the glossary needs at least 4 terms"
    found = exercises(nb)
    assert 2 <= len(found) <= 4, f"{len(found)} exercises, want 2-4"
    for answer, check, solution in found:
        assert "= None" in nb.cells[answer].source, "an answer cell must start as a None placeholder"
        assert re.search(r"\bcheck(_close)?\(", nb.cells[check].source), "a check cell must call check()"
        assert "<details>" in nb.cells[solution].source and SOLUTION_RE.search(nb.cells[solution].source)
        assert "<details><summary>Hint" in nb.cells[answer - 1].source, "each exercise needs a hint"
    assert any("ipywidgets" in s and WIDGET_RE.search(s) for s in code), "no ipywidgets control (interact_manual)"
    assert any("viz." in s for s in code), "no figure from minengine.viz"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "notebooks are committed without outputs"


I18N_TERMS = ["chunked_prefill", "head_of_line_blocking", "admission", "victim", "sequence_slot", "prefill", "decode",
              "prefix_cache_hit", "preemption", "block_table", "slot_mapping", "token_budget"]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_glossary_matches_dashboard_terms(chapter):
    """A glossary term that the dashboard also names gets the same Chinese term (minengine.viz.i18n)."""
    from minengine.viz.i18n import t

    terms = {t(key, "en"): t(key, "zh") for key in I18N_TERMS}
    glossary = next(c.source for c in load(chapter).cells
                    if c.cell_type == "markdown" and c.source.startswith("## Glossary"))
    for row in glossary.splitlines()[4:]:
        english, chinese = (x.strip() for x in row.strip("|").split("|")[:2])
        english = re.sub(r"\s*\(.*\)$", "", english).strip().lower()
        if english in terms:
            assert terms[english] in chinese, f"{english!r}: glossary {chinese!r}, dashboard {terms[english]!r}"


def test_placeholder_answers_fail(capsys):
    """The checks the exercises use really fail on an unanswered or wrong answer."""
    from minengine.course import check, check_close

    assert not check("x", None, 3) and not check("x", 4, 3) and check("x", 3, 3)
    assert not check_close("x", 1.1, 1.0) and check_close("x", 1.01, 1.0)
    out = capsys.readouterr().out
    assert out.count("FAIL") == 3 and out.count("PASS") == 2


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_executes_with_solutions(chapter, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("ipywidgets")
    from minengine.config import BUNDLED_MODEL

    if not os.environ.get("MINENGINE_MODEL") and not (Path(BUNDLED_MODEL) / "config.json").exists():
        pytest.fail("bundled model missing: run scripts/train_tiny_model.py or set MINENGINE_MODEL")
    monkeypatch.setenv("MINENGINE_FAST", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    nb = with_widget_calls(with_solutions(load(chapter)))
    start = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}).execute()
    print(f"{chapter}: {time.perf_counter() - start:.1f} s")
    outputs = list(all_outputs(nb))
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"error outputs: {[e.get('ename') + ': ' + e.get('evalue', '') for e in errors]}"
    for _, check, _ in exercises(nb):
        text = "".join(output_text(o) for o in nb.cells[check].outputs)
        assert "PASS" in text and "FAIL" not in text, f"check cell {check} with the solution printed: {text!r}"


class _CountdownEngine:
    """Stands in for LLMEngine in the driver tests: a request finishes after ``params`` steps (an int)."""

    def __init__(self):
        self.left: dict[str, int] = {}
        self.added_at: dict[str, int] = {}
        self.steps = 0

    def add_request(self, request_id, prompt, params):
        self.left[request_id] = params
        self.added_at[request_id] = self.steps

    def has_unfinished_requests(self):
        return bool(self.left)

    def step(self):
        from types import SimpleNamespace

        self.steps += 1
        for rid in list(self.left):
            self.left[rid] -= 1
        done = [rid for rid, n in self.left.items() if n <= 0]
        for rid in done:
            del self.left[rid]
        return [SimpleNamespace(request_id=rid, finished=True) for rid in done]


def test_run_with_arrivals_adds_requests_before_their_step():
    from minengine.course import run_to_completion, run_with_arrivals

    engine = _CountdownEngine()
    finished = run_with_arrivals(engine, [(3, "late", None, 2), (0, "early", None, 1), (5, "idle-gap", None, 1)])
    assert engine.added_at == {"early": 0, "late": 3, "idle-gap": 5}  # a gap with nothing running still counts steps
    assert set(finished) == {"early", "late", "idle-gap"}
    assert run_to_completion(_CountdownEngine()) == {}
    with pytest.raises(ValueError, match="step indices"):
        run_with_arrivals(_CountdownEngine(), [(-1, "x", None, 1)])
    with pytest.raises(RuntimeError, match="max_steps"):
        run_with_arrivals(_CountdownEngine(), [(0, "slow", None, 10)], max_steps=3)


def test_pick_and_check_close_validate():
    from minengine.course import check_close, pick

    assert pick("full", "fast", fast_mode=False) == "full" and pick("full", "fast", fast_mode=True) == "fast"
    with pytest.raises(ValueError, match="rel_tol"):
        check_close("x", 1.0, 1.0, rel_tol=-1)
    with pytest.raises(ValueError, match="expected"):
        check_close("x", 1.0, float("nan"))

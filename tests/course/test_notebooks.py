"""The notebook course: structure of every chapter, and every chapter executed top to bottom.

Structure (fast): learning goals, 2-4 exercises each with an answer placeholder, typical wrong answers, a
PASS/FAIL check and a revealable solution, open "why / what if" questions with model answers, conclusion cells,
an ipywidgets control, a summary, a bilingual glossary, no stored outputs.

Execution (nbclient, kernel python3, ``MINENGINE_FAST=1``, one kernel per chapter): each exercise's answer cell is
replaced by the solution shown to the learner and its check must print PASS; then each typical wrong answer is
submitted to a copy of the check, which must print FAIL (so a check cannot accept the mistakes it is there to
catch), and the solution is run again; each widget's callback is called once with its defaults; every conclusion
cell must render its sentence (a ``show`` hidden inside an ``if`` renders nothing), and a conclusion whose numbers
contradict it raises ``ConclusionError``; any error output, in a cell or inside a widget's output, fails the test.
Each cell has ``CELL_TIMEOUT_S``; the whole course's time is a benchmark (``benchmarks/course_time.py``, which
executes the same instrumented notebooks and prints the total against the 600 s budget), not a test: a time limit
fails when the machine is busy, whatever the code.
"""

from __future__ import annotations

import ast
import os
import re
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
CHAPTERS = sorted(p.stem for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT_S = 600
SOLUTION_RE = re.compile(r"```python\n(.*?)\n```", re.S)
CJK_RE = re.compile(r"[\u4e00-\u9fff]")
WIDGET_RE = re.compile(r"interact_manual\((\w+)")
EXECUTED: dict = {}  # chapter -> its executed (instrumented) notebook, for the site test at the end


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


def wrong_answers(cell) -> list[str]:
    return cell.get("metadata", {}).get("minengine", {}).get("wrong_answers", [])


def solution_source(nb, solution: int) -> str:
    match = SOLUTION_RE.search(nb.cells[solution].source)
    assert match, f"solution cell {solution} has no ```python block"
    return match.group(1)


def instrumented(nb):
    """A copy of ``nb`` to execute: answers hold the solutions; after each check, every wrong answer followed by
    a copy of the check (tag ``test-wrong``), then the solution again; after each ``interact_manual(fn, ...)``
    cell, a call ``fn()`` with its defaults (under nbclient nobody presses *Run*)."""
    nb = nbformat.from_dict(nb)
    found = exercises(nb)
    solution_of = {check: solution_source(nb, solution) for _, check, solution in found}
    wrong_of = {check: wrong_answers(nb.cells[answer]) for answer, check, _ in found}
    for answer, _, solution in found:
        nb.cells[answer].source = solution_source(nb, solution)
    cells = []
    for i, cell in enumerate(nb.cells):
        cells.append(cell)
        if i in solution_of:
            for wrong in wrong_of[i]:
                cells.append(nbformat.v4.new_code_cell(wrong, metadata={"tags": ["test-wrong-answer"]}))
                probe = nbformat.v4.new_code_cell(cell.source, metadata={"tags": ["test-wrong"]})
                probe.metadata["wrong"] = {"check": i, "answer": wrong}
                cells.append(probe)
            cells.append(nbformat.v4.new_code_cell(solution_of[i], metadata={"tags": ["test-restore"]}))
        match = WIDGET_RE.search(cell.source) if cell.cell_type == "code" else None
        if match:
            cells.append(nbformat.v4.new_code_cell(f"{match.group(1)}()  # test: the widget's experiment",
                                                   metadata={"tags": ["test-widget-call"]}))
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


def cell_text(cell) -> str:
    return "".join(output_text(o) for o in cell.get("outputs", []))


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
        assert re.search(r"\bcheck(_close|_function)?\(", nb.cells[check].source), "a check cell must call check()"
        assert "<details>" in nb.cells[solution].source and SOLUTION_RE.search(nb.cells[solution].source)
        assert "<details><summary>Hint" in nb.cells[answer - 1].source, "each exercise needs a hint"
        assert wrong_answers(nb.cells[answer]), f"exercise at cell {answer} lists no typical wrong answer"
    questions = [c for c in nb.cells if "question" in tags(c)]
    assert len(questions) >= 2, "want at least 2 open 'why / what if' questions"
    for q in questions:
        assert "<details><summary>Model answer" in q.source, "an open question needs a revealable model answer"
    conclusions = [c for c in nb.cells if "conclusion" in tags(c)]
    assert conclusions, "no conclusion cell (tag 'conclusion')"
    for c in conclusions:  # its sentence must be the cell's value: a show() inside an if renders nothing
        last = ast.parse(c.source).body[-1]
        ends_with_sentence = isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and getattr(
            last.value.func, "id", "") in ("conclude", "show")
        assert ends_with_sentence, f"a conclusion cell must end with conclude(...) at top level: {c.source}"
    assert any("ipywidgets" in s and WIDGET_RE.search(s) for s in code), "no ipywidgets control (interact_manual)"
    assert any("viz." in s for s in code), "no figure from minengine.viz"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "notebooks are committed without outputs"


def test_notebooks_are_built_from_their_sources(tmp_path, monkeypatch):
    """Each committed notebook is byte for byte what ``scripts/build_notebooks.py`` writes from its source
    ``scripts/course/chNN_*.py`` (so no cell lives only in a notebook), and every source has its notebook."""
    from scripts import build_notebooks

    monkeypatch.syspath_prepend(str(build_notebooks.COURSE_DIR))
    assert build_notebooks.CHAPTERS == CHAPTERS, "a chapter source without its notebook, or the reverse"
    for chapter in CHAPTERS:
        rebuilt = tmp_path / f"{chapter}.ipynb"
        nbformat.write(build_notebooks.build(chapter), rebuilt)
        committed = (NOTEBOOKS_DIR / f"{chapter}.ipynb").read_bytes()
        assert rebuilt.read_bytes() == committed, (
            f"notebooks/{chapter}.ipynb differs from its source: edit scripts/course/ch{chapter}.py and run "
            "python scripts/build_notebooks.py")


def test_chinese_terms_follow_the_glossary_rules():
    """令牌 is not the Chinese for token (词元 is, or "token"); chunk is 分块 (块 alone is the KV block)."""
    for chapter in CHAPTERS:
        text = "\n".join(c.source for c in load(chapter).cells if c.cell_type == "markdown")
        assert "令牌" not in text, f"{chapter}: 令牌 -> 词元"
        for row in re.findall(r"^\| chunk[^|]*\|([^|]*)\|", text, re.M):
            assert "分块" in row and "块 /" not in row, f"{chapter}: chunk -> 分块, got {row!r}"


I18N_TERMS = ["chunked_prefill", "head_of_line_blocking", "admission", "victim", "sequence_slot", "prefill", "decode",
              "prefix_cache_hit", "preemption", "block_table", "slot_mapping", "token_budget"]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_glossary_matches_dashboard_terms(chapter):
    """A glossary term that the dashboard also names gets the same Chinese term (minengine.viz.i18n), read with
    the course's rule that token is 词元."""
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
    from minengine.course import check, check_close, check_function

    assert not check("x", None, 3) and not check("x", 4, 3) and check("x", 3, 3)
    assert not check_close("x", 1.1, 1.0) and check_close("x", 1.01, 1.0)
    cases = [((8, 4), 2), ((9, 4), 3)]
    assert check_function("f", lambda a, b: -(-a // b), cases)
    assert not check_function("f", lambda a, b: a // b, cases)  # right on the first case only
    assert not check_function("f", None, cases) and not check_function("f", 3, cases)
    assert not check_function("f", lambda a, b: 1 / 0, cases)  # an exception is a FAIL, not a crash
    float_cases = [((3, 10), 3 * 0.1)]  # 0.30000000000000004; 3 / 10 rounds to 0.3
    assert check_function("g", lambda a, b: a / b, float_cases, rel_tol=1e-12)  # rounding, within the tolerance
    assert not check_function("g", lambda a, b: a / b, float_cases)  # exact without a tolerance
    assert not check_function("g", lambda a, b: a / b + 1e-9, float_cases, rel_tol=1e-12)
    with pytest.raises(ValueError, match="rel_tol"):
        check_function("g", lambda a, b: a / b, float_cases, rel_tol=-1)
    out = capsys.readouterr().out
    assert out.count("FAIL") == 9 and out.count("PASS") == 4
    assert "wrong for (9, 4): got 2\n" in out  # names the input, not the expected value


def test_conclusions_raise_when_their_numbers_disagree():
    from minengine.course import ConclusionError, claim, conclude

    assert conclude("it holds", [("1 < 2", 1 < 2)]).data == "it holds"
    with pytest.raises(ConclusionError, match="chunking cut the worst gap"):
        conclude("chunking cut the worst gap", [("chunking cut the worst gap", 3.0 < 2.0)])
    with pytest.raises(ValueError, match="must be a bool"):
        claim("a number is not a check", 0.5)


def test_instrumented_notebook_submits_every_wrong_answer():
    """The executed copy really runs each wrong answer before a copy of its check, then restores the solution."""
    nb = load(CHAPTERS[0])
    inst = instrumented(nb)
    n_wrong = sum(len(wrong_answers(nb.cells[a])) for a, _, _ in exercises(nb))
    probes = [c for c in inst.cells if "test-wrong" in tags(c)]
    assert len(probes) == n_wrong > 0
    for i, cell in enumerate(inst.cells):
        if "test-wrong" in tags(cell):
            assert inst.cells[i - 1].source == cell.metadata["wrong"]["answer"]


# The chapters whose execution here takes more than about 20 s of CPU (kernel included, ``--durations``): marked slow,
# so ``-m "not slow"`` is a quick loop; CI runs them all.
SLOW_CHAPTERS = {"04_chunked_prefill", "06_admission_preemption", "07_scheduler_slos", "09_serving", "10_fleet"}


def test_the_slow_chapters_are_chapters():
    assert SLOW_CHAPTERS <= set(CHAPTERS), "a renamed chapter would lose its slow mark"


@pytest.mark.parametrize("chapter", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CHAPTERS else c
                                     for c in CHAPTERS])
def test_executes_with_solutions_and_rejects_wrong_answers(chapter, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("ipywidgets")
    from minengine.config import BUNDLED_MODEL

    if not os.environ.get("MINENGINE_MODEL") and not (Path(BUNDLED_MODEL) / "config.json").exists():
        pytest.fail("bundled model missing: run scripts/train_tiny_model.py or set MINENGINE_MODEL")
    monkeypatch.setenv("MINENGINE_FAST", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    nb = instrumented(load(chapter))
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}).execute()
    EXECUTED[chapter] = nb
    outputs = list(all_outputs(nb))
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"error outputs: {[e.get('ename') + ': ' + e.get('evalue', '') for e in errors]}"
    checks = {check for _, check, _ in exercises(load(chapter))}
    solved = [c for i, c in enumerate(load(chapter).cells) if i in checks]
    executed_checks = [c for c in nb.cells if "check" in tags(c)]
    assert len(executed_checks) == len(solved)
    for cell in executed_checks:
        text = cell_text(cell)
        assert "PASS" in text and "FAIL" not in text, f"check with the solution printed: {text!r}"
    for cell in nb.cells:
        if "test-wrong" in tags(cell):
            text = cell_text(cell)
            assert "FAIL" in text and "PASS" not in text, (
                f"the check accepted the wrong answer {cell.metadata['wrong']['answer']!r}: {text!r}")
    for cell in nb.cells:
        if "conclusion" in tags(cell):
            rendered = [o for o in cell.get("outputs", []) if o.get("output_type") in ("display_data", "execute_result")
                        and ("text/markdown" in o.get("data", {}) or "text/html" in o.get("data", {}))]
            assert rendered, f"a conclusion cell rendered nothing: {cell.source[:120]!r}"


def test_site_from_executed_notebooks(tmp_path):
    """The docs site (``scripts/build_docs.py``) built from the notebooks executed above, without static images,
    every course page opened from disk in headless Chromium: every figure block of the chapters drawn by the site's own
    plotly.js (SVG paths present), no JavaScript error, no request outside the site's folder, no dead link or
    anchor; each figure block carries its ``<noscript>`` fallback and no page shows a cell the tests inserted."""
    if not EXECUTED:
        pytest.skip("no chapter was executed in this session")
    from scripts import build_docs

    start = time.perf_counter()
    site = build_docs.build(dict(EXECUTED), tmp_path / "site", with_images=False)
    built_s = time.perf_counter() - start
    pages = {c: site / "course" / f"{c}.html" for c in EXECUTED}
    assert all(p.exists() for p in pages.values()) and (site / "course" / "index.html").exists()
    index = (site / "course" / "index.html").read_text()
    assert all(f'href="{c}.html"' in index for c in pages), "the course index links every chapter built"
    for chapter, page in pages.items():
        text = page.read_text()
        assert "cdnjs" not in text and "unpkg.com" not in text, f"{chapter}: a script from a CDN"
        blocks = text.count('class="minengine-figure"')
        assert blocks == text.count("<noscript>"), f"{chapter}: a figure without its fallback"
        assert "test-wrong" not in text and "# test: the widget" not in text
    print(f"site: {len(pages)} chapters in {built_s:.1f} s")
    pytest.importorskip("playwright.sync_api")
    from tests.site_checks import CHROMIUM, dead_links, visit

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} missing: apt-get install -y chromium")
    seen = visit(site, under="course/")  # the manual's pages: tests/course/test_site.py opens every one
    for name, page in seen.items():
        assert page["errors"] == [] and page["outside"] == [], f"{name}: {page['errors']} {page['outside']}"
        undrawn = [i for i, f in enumerate(page["figures"]) if not (f["drawn"] and f["paths"] > 0)]
        assert not undrawn, f"{name}: figures {undrawn} not drawn"
    assert dead_links(seen, site) == []
    assert any(seen[f"course/{c}.html"]["figures"] for c in EXECUTED), "no chapter drew a figure"
    print("drawn:", {c: len(seen[f"course/{c}.html"]["figures"]) for c in EXECUTED})


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


def test_pick_median_and_check_close_validate():
    from minengine.course import check_close, median_of, pick

    assert pick("full", "fast", fast_mode=False) == "full" and pick("full", "fast", fast_mode=True) == "fast"
    calls = iter([100.0, 3.0, 1.0, 2.0])  # the first is the warm-up, thrown away
    assert median_of(lambda: next(calls), repeats=3, warmup=1) == 2.0
    with pytest.raises(ValueError, match="repeats"):
        median_of(lambda: 1.0, repeats=0)
    with pytest.raises(ValueError, match="rel_tol"):
        check_close("x", 1.0, 1.0, rel_tol=-1)
    with pytest.raises(ValueError, match="expected"):
        check_close("x", 1.0, float("nan"))

"""The labs' notebook pages (``notebooks/labN_<lab>.ipynb``, built from ``scripts/course/labN_<lab>.py``).

Structure (fast): one page per lab of the registry, in course order; the learning goals first; the cell the learner
edits (tag ``lab-submission``) points ``MY_FILE`` at the lab's skeleton and names the reference solution the tests
substitute; the grader cell (tag ``lab-grade``) grades ``MY_FILE``; a conclusion cell; a figure of
``minengine.viz``; the live dashboard's ``MINENGINE_LABS`` command; a summary; no stored outputs; byte for byte what
its source builds.

Execution (nbclient, ``MINENGINE_FAST=1``): the pages share one kernel, its names cleared before each page
(``%reset``) so a page cannot lean on another's variables, while the modules it imported, the loaded weights and
transformers' reference tokens (cached per prompt by ``minengine.labs.end_to_end``) are loaded once for all seven.
Each page runs top to bottom as committed, on the skeleton: the grader must say what to implement (not crash the
notebook) and the engine section runs on the engine's own part; then the reference solution is submitted
(``MY_FILE`` set as its metadata says) and every cell from the grader on runs again: the grade must pass and the
engine must run on the learner's part, named as such. Any error output fails; every conclusion cell must render its
sentence in both runs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

from tests.course.test_notebooks import CELL_TIMEOUT_S, all_outputs, cell_text, load, tags  # noqa: E402

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
LAB_PAGES = sorted(p.stem for p in NOTEBOOKS_DIR.glob("lab[0-9]_*.ipynb"))
SUBMISSION_RE = re.compile(r'^MY_FILE = "([^"]+)"', re.M)


def lab_of(page: str) -> str:
    return page.split("_", 1)[1]


def submission_cell(nb) -> int:
    [index] = [i for i, c in enumerate(nb.cells) if "lab-submission" in tags(c)]
    return index


def grade_cell(nb) -> int:
    [index] = [i for i, c in enumerate(nb.cells) if "lab-grade" in tags(c)]
    return index


def reference_source(nb) -> str:
    return nb.cells[submission_cell(nb)].metadata["minengine"]["reference"]


def instrumented_lab(nb):
    """A copy of ``nb`` to execute: as committed (on the skeleton), then the reference submitted (tag
    ``test-reference-submission``) and a copy of every code cell from the grader on (tag ``test-reference``,
    ``metadata.original`` = the index of the cell it copies)."""
    nb = nbformat.from_dict(nb)
    again = [nbformat.v4.new_code_cell(reference_source(nb), metadata={"tags": ["test-reference-submission"]})]
    for i in range(grade_cell(nb), len(nb.cells)):
        if nb.cells[i].cell_type == "code":
            again.append(nbformat.v4.new_code_cell(nb.cells[i].source,
                                                   metadata={"tags": ["test-reference"], "original": i}))
    nb.cells = list(nb.cells) + again
    return nb


@pytest.fixture(scope="module")
def kernel():
    """One python3 kernel for every page of this module, in notebooks/ (``MINENGINE_FAST=1``, one torch thread)."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(NOTEBOOKS_DIR), env={**os.environ, "MINENGINE_FAST": "1",
                                                 "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    yield km
    km.shutdown_kernel(now=True)


def test_one_page_per_lab_in_course_order():
    from minengine.labs import LABS

    assert LAB_PAGES == [f"lab{spec.order}_{name}" for name, spec in LABS.items()]


@pytest.mark.parametrize("page", LAB_PAGES)
def test_structure(page):
    from minengine.labs import LABS

    spec, nb = LABS[lab_of(page)], load(page)
    md = [c.source for c in nb.cells if c.cell_type == "markdown"]
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert "## Learning goals" in nb.cells[0].source and nb.cells[0].source.startswith(f"# Lab {spec.order} · ")
    assert any(s.startswith("## Summary") for s in md), "no ## Summary section"
    assert f'LAB = "{spec.name}"' in code[0], "the setup cell names the lab"
    submission = nb.cells[submission_cell(nb)].source
    path = SUBMISSION_RE.search(submission).group(1)
    assert (NOTEBOOKS_DIR / path).resolve() == spec.skeleton, "MY_FILE must start as the lab's skeleton"
    assert SUBMISSION_RE.search(reference_source(nb)).group(1) == spec.solution
    assert submission_cell(nb) < grade_cell(nb), "the learner's file is set before the grader runs"
    assert "grade(LAB, MY_FILE)" in nb.cells[grade_cell(nb)].source
    shown = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and re.search(r"\.show\(\)|print\(", c.source)]
    assert any(1 < i < submission_cell(nb) for i in shown), "a picture of the part before the skeleton"
    dashboard = [i for i in shown if i > grade_cell(nb) and re.search(r"viz\.\w+_figure\(", nb.cells[i].source)]
    assert dashboard, "the dashboard's figures on the learner's part, after the grader"
    assert any("conclusion" in tags(c) for c in nb.cells[:submission_cell(nb)]), "the picture's conclusion"
    assert any("conclusion" in tags(c) for c in nb.cells[grade_cell(nb):]), "the engine run's conclusion"
    assert any(f"MINENGINE_LABS={spec.name}=" in s for s in md), "the live dashboard's command"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "notebooks are committed without outputs"


def test_lab_pages_are_built_from_their_sources(tmp_path, monkeypatch):
    from scripts import build_notebooks

    monkeypatch.syspath_prepend(str(build_notebooks.COURSE_DIR))
    assert build_notebooks.LAB_PAGES == LAB_PAGES, "a lab page's source without its notebook, or the reverse"
    for page in LAB_PAGES:
        rebuilt = tmp_path / f"{page}.ipynb"
        nbformat.write(build_notebooks.build(page), rebuilt)
        assert rebuilt.read_bytes() == (NOTEBOOKS_DIR / f"{page}.ipynb").read_bytes(), (
            f"notebooks/{page}.ipynb differs from its source: edit scripts/course/{page}.py and run "
            "python scripts/build_notebooks.py")


def test_instrumented_page_submits_the_reference_after_the_skeleton():
    nb = load(LAB_PAGES[0])
    inst = instrumented_lab(nb)
    assert [c.source for c in inst.cells[:len(nb.cells)]] == [c.source for c in nb.cells]
    [submitted] = [i for i, c in enumerate(inst.cells) if "test-reference-submission" in tags(c)]
    assert submitted == len(nb.cells) and "solutions" in inst.cells[submitted].source
    assert inst.cells[submitted + 1].metadata["original"] == grade_cell(nb)


@pytest.mark.parametrize("page", LAB_PAGES)
def test_runs_on_the_skeleton_then_on_the_reference(page, kernel):
    import nbclient

    from minengine.config import BUNDLED_MODEL

    if not (Path(BUNDLED_MODEL) / "config.json").exists():
        pytest.fail("bundled model missing: run scripts/train_tiny_model.py")
    source = load(page)
    nb = instrumented_lab(source)
    reset = nbformat.v4.new_code_cell('get_ipython().run_line_magic("reset", "-f")', metadata={"tags": ["test-reset"]})
    nb.cells.insert(0, reset)
    client = nbclient.NotebookClient(nb, km=kernel, timeout=CELL_TIMEOUT_S)
    try:
        client.execute()
    finally:
        if client.kc is not None:  # the kernel is the module's; this page's client is its own
            client.kc.stop_channels()
    nb.cells.pop(0)
    errors = [o for o in all_outputs(nb) if o.get("output_type") == "error"]
    assert not errors, f"error outputs: {[e.get('ename') + ': ' + e.get('evalue', '') for e in errors]}"
    skeleton_grade = cell_text(nb.cells[grade_cell(source)])
    assert "not implemented yet: implement" in skeleton_grade and "score 0/" in skeleton_grade, skeleton_grade
    copies = {c.metadata["original"]: c for c in nb.cells if "test-reference" in tags(c)}
    reference_grade = cell_text(copies[grade_cell(source)])
    assert "every check passed" in reference_grade, reference_grade
    engine_runs = [i for i in copies if "describe_parts(mine)" in nb.cells[i].source]
    assert engine_runs, "no cell names the engine's parts"
    for i in engine_runs:
        assert "every part is the engine's own" in cell_text(nb.cells[i])
        assert "learner's parts: " in cell_text(copies[i])
    conclusions = [i for i, c in enumerate(source.cells) if "conclusion" in tags(c)]
    for cell in [nb.cells[i] for i in conclusions] + [copies[i] for i in conclusions if i in copies]:
        rendered = [o for o in cell.get("outputs", []) if "text/markdown" in o.get("data", {})]
        assert rendered, f"a conclusion cell rendered nothing: {cell.source[:120]!r}"
    site_page_is_the_learners_first_run(page, nb, source)


def site_page_is_the_learners_first_run(page: str, executed, source) -> None:
    """The docs site's page of the executed lab page (``scripts/build_docs.py``; without a browser, to keep CI short:
    ``test_site.py`` opens a lab page as committed in Chromium) is the learner's first run: every cell of the source
    once, the tests' reference run left out, the grader's words on the skeleton, each figure a figure block."""
    from scripts import build_docs

    figures: list = []
    site = build_docs.site_notebook(executed, source, page, figures, with_images=False)
    assert [c.source for c in site.cells] == [c.source for c in source.cells]
    assert "not implemented yet: implement" in cell_text(site.cells[grade_cell(source)])
    blocks = sum('class="minengine-figure"' in o.get("data", {}).get("text/html", "")
                 for c in site.cells if c.cell_type == "code" for o in c.outputs)
    assert blocks == len(figures) >= 2, f"{page}: {blocks} figure blocks, {len(figures)} figures"


def _raising_functions(path: Path) -> dict[str, bool]:
    """Each function and method of ``path`` (``Class.method``): whether its body raises (a ``raise`` other than the
    skeleton's ``NotImplementedError``), and whether its docstring (a constructor's: or its class's) has a ``Raises:``
    section."""
    import ast

    found = {}
    tree = ast.parse(path.read_text())
    scopes = [("", tree)] + [(f"{c.name}.", c) for c in tree.body if isinstance(c, ast.ClassDef)]
    for prefix, scope in scopes:
        for f in (n for n in scope.body if isinstance(n, ast.FunctionDef)):
            raises = any(isinstance(n, ast.Raise) and "NotImplementedError" not in ast.unparse(n) for n in ast.walk(f))
            doc = ast.get_docstring(f) or ""
            if f.name == "__init__" and isinstance(scope, ast.ClassDef):
                doc += ast.get_docstring(scope) or ""  # a class's docstring documents its constructor
            found[prefix + f.name] = (raises, "Raises:" in doc)
    return found


def test_the_skeletons_list_the_errors_their_references_raise():
    """The pages promise a ``Raises:`` section for each function that must raise: a function of a lab's reference
    that raises has one in its skeleton, and a skeleton lists none its reference does not raise."""
    from minengine.labs import LABS

    for spec in LABS.values():
        reference = NOTEBOOKS_DIR.parent / (spec.solution.replace(".", "/") + ".py")
        raising = {name: raises for name, (raises, _) in _raising_functions(reference).items()}
        listed = {name: lists for name, (_, lists) in _raising_functions(spec.skeleton).items()}
        assert {name for name in listed if listed[name]} == {name for name in raising if raising[name]}, spec.name
    assert any(lists for _, lists in _raising_functions(LABS["block_pool"].skeleton).values())  # it can fail

"""No number or direction in the course's prose that the chapter does not set, check or cite.

Static, executes nothing: reads the committed notebooks (equal to their sources: ``test_notebooks.py`` checks it)
and scans every markdown cell with ``tests/course_prose.py``, whose docstring gives the rules (what counts as a
number or a direction, what is skipped and why, what backs each: a literal of a code cell, a check in the same
section, a ``(checked: section)`` pointer, or a cited fact marked ``(source: ...)``). ``EXCEPTIONS`` lists the few
things the rules cannot see, each with its reason. The other tests show the scanner can fail: a synthetic chapter
with an unbacked number and an unbacked direction fails; the same backed by a code cell, a check or a citation
passes; and any number typed into prose that no code cell holds is flagged (hypothesis).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.course_prose import Finding, code_values, numbers_in, scan

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
CHAPTERS = sorted(p.stem for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
CHAPTERS += sorted(p.stem for p in NOTEBOOKS_DIR.glob("lab[0-9]_*.ipynb"))  # the labs' pages, after the chapters

# chapter -> {(kind, token): reason}: things the rules cannot see (kept small; each needs a reason).
EXCEPTIONS: dict[str, dict[tuple[str, str], str]] = {}


def cells_of(chapter: str) -> list[dict]:
    return json.loads((NOTEBOOKS_DIR / f"{chapter}.ipynb").read_text())["cells"]


@functools.lru_cache(maxsize=1)
def course() -> dict[str, list[dict]]:
    # a chapter by its number (``(checked: ch05 · ...)`` names it so), a lab's page by its name
    return {chapter[:2] if chapter[:2].isdigit() else chapter: cells_of(chapter) for chapter in CHAPTERS}


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_number_and_direction_is_backed(chapter):
    allowed = EXCEPTIONS.get(chapter, {})
    findings = [f for f in scan(chapter, cells_of(chapter), course()) if (f.kind, f.token) not in allowed]
    assert not findings, "prose states what no cell of the chapter sets, checks or cites:\n" + "\n".join(
        map(str, findings))


def test_exceptions_are_still_needed():
    """An exception whose finding is gone (the prose was fixed) must be removed, so the list stays small."""
    for chapter, allowed in EXCEPTIONS.items():
        found = {(f.kind, f.token) for f in scan(chapter, cells_of(chapter), course())}
        assert set(allowed) <= found, f"{chapter}: stale exceptions {set(allowed) - found}"


# ---------------------------------------------------------------- the scanner can fail
def md(src: str, tags: tuple[str, ...] = ()) -> dict:
    return {"cell_type": "markdown", "source": src, "metadata": {"tags": list(tags)}}


def code(src: str) -> dict:
    return {"cell_type": "code", "source": src, "metadata": {}}


PROSE = "## Batching\nContinuous batching serves 37 requests in this run and its throughput is higher."
SETUP = code("requests = 12\nprint(requests)")


def kinds(findings: list[Finding]) -> set[tuple[str, str]]:
    return {(f.kind, f.token) for f in findings}


def test_synthetic_chapter_with_an_unbacked_number_and_direction_fails():
    found = scan("99_synthetic", [SETUP, md(PROSE)])
    assert kinds(found) == {("number", "37"), ("direction", "higher")}
    assert all(f.chapter == "99_synthetic" and f.cell == 1 and "37 requests" in f.sentence for f in found)
    assert "99_synthetic cell 1" in str(found[0])


def test_backed_by_a_code_cell_or_a_citation_passes():
    checked = code("requests = 37\nsummary = run(requests)\nclaim('higher throughput', summary.gain > 1.0)")
    assert scan("99", [SETUP, md(PROSE), checked]) == []
    cited = PROSE.replace("higher.", "higher (source: Yu et al., *Orca*, OSDI 2022, figure 12).")
    assert scan("99", [SETUP, md(cited)]) == []
    # a check in another section does not back the sentence; a pointer to it does, and it must exist
    other = [SETUP, md(PROSE.replace("37", "12")), md("## Elsewhere"), code("assert 1 + 1 == 2")]
    assert kinds(scan("99", other)) == {("direction", "higher")}
    other[1] = md(PROSE.replace("37", "12").replace("higher.", "higher (checked: Elsewhere)."))
    assert scan("99", other) == []
    other[1] = md(PROSE.replace("37", "12").replace("higher.", "higher (checked: Nowhere at all)."))
    assert kinds(scan("99", other)) == {("direction", "higher")}


def test_questions_instructions_and_names_are_not_claims():
    cells = [SETUP, md("## Try it\nIs it faster with 12 slots? Set a higher budget and watch the TTFT.\n"
                       "Llama-3-8B on an H100 in fp8 (chapter 4, exercise 3; Kwon et al., SOSP 2023).")]
    assert scan("99", cells) == []
    assert [t for t, _, _ in numbers_in("about 65 % of 8,000 tokens, 3x faster, in 10 ms")] == [
        "65 %", "8,000", "3x", "10 ms"]
    values = code_values([code("share = 0.65\nn = 8_000\nratio = 3\nt = 10e-3")])
    cells = [md("## R\nAbout 65 % of 8,000 tokens, 3x, in 10 ms."),
             code("share = 0.65\nn = 8_000\nratio = 3\nt = 10e-3"), code("assert ratio > 1")]
    assert {0.65, 8000.0, 3.0, 0.01} <= values and scan("99", cells) == []


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.integers(min_value=2, max_value=10**7), st.decimals(min_value=0, max_value=10**4, places=2)),
       st.sampled_from(["", " %", " ms", "x", " GB"]))
def test_any_number_no_code_cell_holds_is_flagged(value, unit):
    """A number typed into a prose cell is flagged unless a code cell of the chapter holds it (with its unit)."""
    text = f"{value:,}" if isinstance(value, int) else str(value)
    if re.fullmatch(r"\d{4}", text) and 1950 <= int(text) <= 2039 and not unit:
        text = f"{text} tokens"  # a bare year is skipped on purpose
    cells = [md(f"## A\nThe run took {text}{unit} in the end."), code("x = 1\ny = 0.5\nassert y < x")]
    found = scan("99", cells)
    holds = {1.0, 0.5}
    as_value = float(str(value))
    factors = {"": (1,), " %": (1, 0.01), " ms": (1, 1e-3), "x": (1,), " GB": (1, 1e9, 2 ** 30)}[unit]
    if any(abs(as_value * f - h) < 1e-12 for f in factors for h in holds):
        assert found == []
    else:
        assert [f.kind for f in found] == ["number"], (text + unit, found)
    cells[1] = code(f"x = {as_value!r}\nassert x >= 0")
    assert scan("99", cells) == []

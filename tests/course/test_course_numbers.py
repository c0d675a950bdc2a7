"""No number or direction in the course's prose that the chapter does not set, check or cite.

Static, executes nothing: reads the committed notebooks (equal to their sources: ``test_notebooks.py`` checks it)
and scans every markdown cell with ``tests/course_prose.py``, whose docstring gives the rules (what counts as a
number or a direction, what is skipped and why, what backs each: a literal of a code cell, a check in the same
section, a ``(checked: label)`` pointer to the check itself, or a cited fact marked ``(source: ...)``). ``EXCEPTIONS``
lists the few things the rules cannot see, each with its reason. The other tests show the scanner can fail: a
synthetic chapter with an unbacked number and an unbacked direction fails; the same backed by a code cell, a check or a
citation passes; numbers in words, digit-free absolutes, a recommendation and a pointer to a section, a missing label
or an unrelated check are each flagged; and any number typed into prose that no code cell holds is flagged
(hypothesis).
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
    # a check in another section does not back the sentence; a pointer to its label does, and it must exist
    other = [SETUP, md(PROSE.replace("37", "12")), md("## Elsewhere"),
             code("claim('batching gives a higher throughput', 2 > 1)")]
    assert kinds(scan("99", other)) == {("direction", "higher")}
    other[1] = md(PROSE.replace("37", "12").replace("higher.", "higher (checked: batching gives a higher throughput)."))
    assert scan("99", other) == []
    for pointer in ("Elsewhere", "Nowhere at all"):  # a section's heading is not a check; a missing label is none
        other[1] = md(PROSE.replace("37", "12").replace("higher.", f"higher (checked: {pointer})."))
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


def test_number_words_are_read():
    """A number said in words is a number: a ratio ("three times", "a third") or a vague magnitude ("a few hundred
    thousand") needs a check like a direction; a count in words ("forty-eight") must be a literal of the chapter."""
    found = scan("99", [SETUP, md("## A\nThe run took three times as long, a third of its steps were prefills and "
                                  "a few hundred thousand tokens went by.")])
    assert kinds(found) == {("ratio", "three times, a third"), ("quantity", "a few hundred thousand")}
    assert kinds(scan("99", [SETUP, md("## A\nThe run had forty-eight requests and twelve slots.")])) == {
        ("number", "forty-eight")}  # twelve is the literal 12 of SETUP
    assert scan("99", [code("n = 48"), md("## A\nThe run had forty-eight requests and one budget.")]) == []
    checked = [SETUP, md("## A\nThe run took three times as long."), code("claim('three times as long', 3 > 2)")]
    assert scan("99", checked) == []


@pytest.mark.parametrize("sentence, word", [
    ("Chunked prefill dominates every other policy.", "dominates"),
    ("A victim is never re-admitted after a newcomer.", "never"),
    ("Only the last chunk samples.", "Only"),
    ("Prefix caching removes the prefill of a shared prompt.", "removes"),
])
def test_digit_free_absolutes_are_claims(sentence, word):
    """An absolute with no digit in it is a claim about every case: it needs a check like a direction."""
    assert kinds(scan("99", [SETUP, md(f"## A\n{sentence}")])) == {("absolute", word)}
    assert scan("99", [SETUP, md(f"## A\n{sentence}"), code("claim('it holds', 1 < 2)")]) == []
    assert scan("99", [SETUP, md(f"## A\n{sentence.rstrip('.')} (source: vLLM's scheduler.py).")]) == []


def test_technical_phrases_with_an_absolute_word_are_names():
    """The allow-list is phrases where the word names a thing: a prefill-only step, "not only", a quoted value."""
    cells = [SETUP, md('## A\nA prefill-only step and a decode only step run; the profile "none" adds no host time, '
                       "not only in fast mode but in full mode.")]
    assert scan("99", cells) == []


def test_a_recommendation_from_one_run_is_a_claim():
    """"should", "best", "recommend": what to choose in general needs a check even when said as an instruction;
    a plain instruction to the learner is not a claim."""
    assert kinds(scan("99", [SETUP, md("## A\nFor chat you should pick budget 12.")])) == {
        ("recommendation", "should")}
    assert kinds(scan("99", [SETUP, md("## A\nPick budget 12: it is the best for chat.")])) == {
        ("recommendation", "best")}
    assert scan("99", [SETUP, md("## A\nPick budget 12 and watch the TTFT.")]) == []


def test_a_pointer_names_a_related_check_label():
    """``(checked: label)`` must name a check's label (``claim``/``conclude`` statement, ``check*`` name, ``assert``
    message), here or in ``chNN · label``, equal or a prefix of 12 characters or more, sharing a word with the
    sentence: a section's heading, a missing label or a check about something else does not back it."""
    sentence = "Chunked prefill lowers the worst decode gap (checked: {})."
    checks = code("claim('chunking lowers the worst gap', 1 < 2)\nassert 2 > 1, 'the pool has free blocks'")
    cells = lambda ref: [SETUP, md("## Chunking\n" + sentence.format(ref)), md("## Checks"), checks]  # noqa: E731
    assert scan("99", cells("chunking lowers the worst gap")) == []
    assert scan("99", cells("Chunking lowers the")) == []  # a prefix of 12 characters or more
    for ref in ("Checks", "chunking", "the pool has free blocks", "chunking raises the worst gap"):
        assert kinds(scan("99", cells(ref))) == {("direction", "lowers")}, ref
    other = {"98": [checks]}
    assert scan("99", cells("ch98 · chunking lowers the worst gap")[:2], other) == []
    assert kinds(scan("99", cells("ch97 · chunking lowers the worst gap")[:2], other)) == {("direction", "lowers")}


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

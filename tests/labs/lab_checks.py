"""What every lab's test module checks: the reference solution passes its grader, the skeleton fails with "not
implemented", and each wrong implementation under ``tests/labs/wrong/<lab>/`` fails at the stage and with the
words its test module expects."""

from __future__ import annotations

import ast
from pathlib import Path

from minengine.labs import LABS, grade

WRONG = Path(__file__).resolve().parent / "wrong"


def wrong_files(lab: str) -> dict[str, Path]:
    """The wrong implementations of ``lab``, by bug name (the file's stem)."""
    return {p.stem: p for p in sorted((WRONG / lab).glob("*.py"))}


def assert_reference_passes(lab: str) -> None:
    report = grade(lab, LABS[lab].solution)
    assert report.passed, report.format()
    assert report.score == 1.0


def assert_skeleton_not_implemented(lab: str) -> None:
    report = grade(lab)  # the learner's starting file
    assert not report.passed and report.score == 0.0, report.format()
    assert report.first_failure.message.startswith("not implemented yet: implement "), report.format()
    assert all(r.status == "skipped" for r in report.results if r.stage != "unit"), report.format()


def assert_wrong_fails(lab: str, bug: str, stage: str, words: str) -> None:
    """The wrong implementation ``bug`` fails ``lab``'s grader first at ``stage`` with ``words`` in the message."""
    report = grade(lab, wrong_files(lab)[bug])
    assert not report.passed, f"the grader accepted the wrong implementation {bug}:\n{report.format()}"
    failure = report.first_failure
    assert failure.stage == stage, report.format()
    assert words in failure.message, report.format()
    assert "not implemented" not in failure.message, report.format()


def assert_wrong_set_is_complete(lab: str, expected: dict) -> None:
    """At least five wrong implementations, every file listed in ``expected``, each naming its bug."""
    files = wrong_files(lab)
    assert len(files) >= 5 and set(files) == set(expected), sorted(set(files) ^ set(expected))
    for path in files.values():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert doc.startswith("A wrong ") and "The bug: " in doc, path

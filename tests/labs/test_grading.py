"""The grader's machinery: stages, words, loading, the CLI, and batch grading of a class in subprocesses with a
timeout (a submission that loops forever, one that raises, one that kills its process, one that does not import)."""

from __future__ import annotations

import csv
import re
import shutil
import time
from pathlib import Path

import pytest

from minengine.__main__ import main
from minengine.labs import LABS, Check, LabFailure, grade
from minengine.labs.cli import SubmissionGrade, format_class, grade_class, grade_in_subprocess
from minengine.labs.grading import run_checks
from minengine.labs.loading import load_submission
from tests.labs.lab_checks import wrong_files

SKELETON_HEAD = "from minengine.core.block_pool import KVBlock\n\n\n"


def test_every_lab_is_registered_in_course_order():
    assert list(LABS)[:3] == ["block_pool", "prefix_cache", "chunked_prefill"]
    orders = [spec.order for spec in LABS.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    for spec in LABS.values():
        assert spec.skeleton.is_file() and spec.minutes > 0 and spec.checks and callable(spec.install)
        assert {c.stage for c in spec.checks} == {"unit", "property", "end_to_end"}, spec.name
        load_submission(spec.solution)  # importable


def test_a_failing_stage_skips_the_later_stages_and_words_come_through():
    def broken(_):
        raise LabFailure("block 3 leaked after step 2: expected 0, got 1")

    def raises(_):
        return {}["missing"]

    def exits(_):
        raise SystemExit(3)

    checks = [Check("a", "unit", lambda m: None), Check("b", "unit", broken), Check("c", "unit", raises),
              Check("x", "unit", exits), Check("d", "property", lambda m: None),
              Check("e", "end_to_end", lambda m: None)]
    results = run_checks(checks, object())
    assert [r.status for r in results] == ["passed", "failed", "failed", "failed", "skipped", "skipped"]
    assert results[3].message.startswith("raised SystemExit: 3")
    assert results[1].message == "block 3 leaked after step 2: expected 0, got 1"
    assert results[2].message.startswith("raised KeyError: 'missing'") and "test_grading.py" in results[2].message
    with pytest.raises(ValueError, match="stage"):
        Check("x", "integration", lambda m: None)


def test_loading_names_the_file_and_line_of_a_broken_submission(tmp_path):
    bad = tmp_path / "pool.py"
    bad.write_text("x = 1\ndef f(:\n    pass\n")
    report = grade("block_pool", bad)
    assert report.score == 0.0 and not report.passed
    assert f"{bad}" in report.first_failure.message and ":2" in report.first_failure.message
    assert report.import_error == report.first_failure.message and "SyntaxError" in report.import_error
    assert [r.name for r in report.results] == [c.name for c in LABS["block_pool"].checks]  # 0 of the lab's checks
    assert all(r.status == "skipped" for r in report.results)
    assert "score 0/14 (0%)" in report.format() and "the submission does not import, so no check ran:" in (
        report.format())
    (tmp_path / "raises.py").write_text("import math\nmath.nonexistent()\n")
    with pytest.raises(LabFailure, match=r"AttributeError.*raises.py:2"):
        load_submission(tmp_path / "raises.py")
    first, second = load_submission(wrong_files("block_pool")["lifo_reuse"]), load_submission(
        wrong_files("block_pool")["lifo_reuse"])
    assert first is not second and first.__name__ != second.__name__  # a fresh module per load


def test_report_format_is_a_table_and_the_first_failure():
    text = grade("block_pool", wrong_files("block_pool")["lifo_reuse"]).format()
    assert "stage" in text and "score 2/14 (14%)" in text
    assert "first failure, unit check 'get_new_blocks takes the free queue's head, ref count 1':" in text
    assert "expected [0, 1], got [4, 3]" in text


def write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SKELETON_HEAD + body)
    return path


LOOPS = "class BlockPool:\n    def __init__(self, n):\n        while True:\n            pass\n"
RAISES = "class BlockPool:\n    def __init__(self, n):\n        self.n = n / 0\n"
KILLS = "import os\n\nos._exit(3)\n"


def test_a_submission_that_loops_forever_is_killed_at_the_timeout(tmp_path):
    start = time.perf_counter()
    result = grade_in_subprocess("block_pool", "loops", write(tmp_path, "loops.py", LOOPS), timeout_s=4)
    assert result.status == "timeout" and result.score == 0.0 and "no grade within 4 s" in result.first_failure
    assert (result.checks_passed, result.checks_total) == (0, 14)  # none of the lab's 14 checks
    assert time.perf_counter() - start < 15


def test_grade_class_grades_each_submission_alone(tmp_path):
    class_dir = tmp_path / "class"
    write(class_dir, "ada.py", RAISES)
    write(class_dir, "bob.py", KILLS)
    (class_dir / "cy.py").write_text("def broken(:\n")
    (class_dir / "dee").mkdir()  # a folder per learner works too
    shutil.copy(wrong_files("block_pool")["lifo_reuse"], class_dir / "dee" / "block_pool.py")
    grades = {g.submission: g for g in grade_class("block_pool", class_dir, timeout_s=120)}
    assert list(grades) == ["ada", "bob", "cy", "dee"]
    assert grades["ada"].status == "graded" and grades["ada"].score == 0.0
    assert "raised ZeroDivisionError: division by zero" in grades["ada"].first_failure
    assert grades["bob"].status == "crashed" and "exited with code 3" in grades["bob"].first_failure
    assert grades["cy"].status == "import error" and "does not import: SyntaxError" in grades["cy"].first_failure
    assert {name: (g.checks_passed, g.checks_total) for name, g in grades.items() if name != "dee"} == {
        "ada": (0, 14), "bob": (0, 14), "cy": (0, 14)}
    assert grades["dee"].status == "graded" and (grades["dee"].checks_passed, grades["dee"].checks_total) == (2, 14)
    assert "expected [0, 1], got [4, 3]" in grades["dee"].first_failure


def test_the_command_line(tmp_path, capsys):
    main(["lab", "list"])
    out = capsys.readouterr().out
    assert "1. block_pool" in out and "3. chunked_prefill" in out
    titles = [line.index(" min ") for line in out.splitlines() if " min " in line]
    assert len(titles) == len(LABS) and len(set(titles)) == 1, out  # one column, whatever the longest name
    with pytest.raises(SystemExit) as exit_code:
        main(["lab", "grade", "prefix_cache"])  # the skeleton
    assert exit_code.value.code == 1 and "not implemented yet: implement hash_block" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_code:
        main(["lab", "grade", "no_such_lab"])
    assert exit_code.value.code == 2 and "no lab called 'no_such_lab'" in capsys.readouterr().err
    write(tmp_path / "class", "ada.py", RAISES)
    with pytest.raises(SystemExit) as exit_code:  # every submission graded (whatever its score): 0
        main(["lab", "grade-class", "block_pool", str(tmp_path / "class"), "--timeout", "120",
              "--csv", str(tmp_path / "grades.csv")])
    assert exit_code.value.code == 0 and "ada" in capsys.readouterr().out
    rows = list(csv.DictReader((tmp_path / "grades.csv").open()))
    assert [(r["submission"], r["status"], float(r["score"])) for r in rows] == [("ada", "graded", 0.0)]
    (tmp_path / "class" / "cy.py").write_text("def broken(:\n")
    with pytest.raises(SystemExit) as exit_code:  # a submission without a grade: 1, the CSV still has every row
        main(["lab", "grade-class", "block_pool", str(tmp_path / "class"), "--csv", str(tmp_path / "grades.csv")])
    captured = capsys.readouterr()
    assert exit_code.value.code == 1 and "1 of 2 submissions got no grade (their checks did not run): cy" in (
        captured.err)
    rows = list(csv.DictReader((tmp_path / "grades.csv").open()))
    assert [(r["submission"], r["status"], r["checks_total"]) for r in rows] == [("ada", "graded", "14"),
                                                                                 ("cy", "import error", "14")]
    with pytest.raises(SystemExit) as exit_code:
        main(["lab", "grade-class", "block_pool", str(tmp_path / "nowhere"), "--timeout", "5"])
    assert exit_code.value.code == 2 and "is not a folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_code:
        main(["lab", "grade-class", "block_pool", str(tmp_path / "empty")])
    assert exit_code.value.code == 2 and "holds no submission" in capsys.readouterr().err


def test_an_exception_names_the_learners_line_not_the_library_it_called(tmp_path):
    """An error raised deep in a library the learner called is reported at the learner's own line (the last frame
    in their file), even in a folder named like the package."""
    path = tmp_path / "minengine" / "mine.py"
    path.parent.mkdir()
    path.write_text("import json\n\n\ndef parse(text):\n    return json.loads(text)\n")
    module = load_submission(path)
    [result] = run_checks([Check("parses", "unit", lambda m: m.parse("{"))], module)
    assert result.status == "failed" and result.message.startswith("raised JSONDecodeError"), result.message
    assert f"at {path}:5 in parse: return json.loads(text)" in result.message, result.message


def test_the_class_table_keeps_every_column_and_every_word():
    """Score columns whole on every row, however long the name; each first failure in full below the table."""
    failure = ("the engine on your pool matches transformers: preemption: workload 'preemption', request "
               "pass0-req3 (prompt of 25 tokens): output token 4 differs from transformers\n  at pool.py:12 in touch")
    grades = [SubmissionGrade("a_learner_with_a_very_long_folder_name", "x.py", "graded", 13 / 14, 13, 14, failure,
                              42.0), SubmissionGrade("bo", "y.py", "timeout", checks_total=14,
                                                     first_failure="no grade within 4 s"),
              SubmissionGrade("cy", "z.py", "import error", checks_total=14, first_failure="z.py does not import")]
    text = format_class(grades)
    rows = text.splitlines()
    assert rows[1].split()[1:] == ["graded", "93%", "13/14", "42.0"], rows
    assert rows[2].split()[1:] == ["timeout", "0%", "0/14", "0.0"], rows
    assert rows[3].split()[1:] == ["import", "error", "0%", "0/14", "0.0"], rows
    assert len({row.index("%") for row in rows[1:4]}) == 1, rows  # the columns line up
    assert failure.splitlines()[0] in text and "at pool.py:12 in touch" in text
    assert max(len(row) for row in rows[:4]) < 100


def test_a_wrong_exception_type_names_the_line_that_raised_it(tmp_path):
    from minengine.labs.grading import expect_raises

    path = tmp_path / "mine.py"
    path.write_text("def make(n):\n    if n < 1:\n        raise TypeError('too few')\n")
    module = load_submission(path)
    with pytest.raises(LabFailure, match=rf"make\(0\) must raise ValueError, but raised TypeError: too few \(at "
                                         rf"{re.escape(str(path))}:3 in make"):
        expect_raises(ValueError, "make(0)", lambda: module.make(0))

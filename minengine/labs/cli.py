"""``python -m minengine lab list | grade | grade-class``: the labs, one grade, and a class's grades in a batch.

``grade-class`` grades each submission in its own Python process with a time limit, so a submission that loops
forever, exhausts memory or kills its process costs its own grade only; the batch goes on. Its exit code tells a
teacher's script whether every submission got a grade (0), some got none (1: "import error", "timeout" or
"crashed" rows, still in the table and the CSV) or the batch could not run (2: an unknown lab, no such folder, no
submission in it).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from minengine.labs.grading import grade
from minengine.labs.registry import LABS, get_lab


@dataclass
class SubmissionGrade:
    """One submission's line of a class's table.

    Attributes:
        submission: the learner's name: the file's stem, or the folder's name for ``<folder>/<lab>.py``.
        path: the graded file.
        status: "graded" (its checks ran), "import error" (the file does not import: a syntax error, or an
            exception at import), "timeout" (killed after ``--timeout`` seconds) or "crashed" (its process died or
            printed no grade).
        score: checks passed / checks (0.0 unless graded).
        checks_passed, checks_total: the counts behind ``score``; ``checks_total`` is the lab's number of checks
            whatever the status.
        first_failure: the first failing check's words (or why there is no grade).
        seconds: wall time of its grading process.
    """

    submission: str
    path: str
    status: str
    score: float = 0.0
    checks_passed: int = 0
    checks_total: int = 0
    first_failure: str = ""
    seconds: float = 0.0


def find_submissions(lab: str, folder: Path) -> list[tuple[str, Path]]:
    """(name, file) for every ``*.py`` directly in ``folder`` and every ``<folder>/<name>/<lab>.py``, by name."""
    found = [(p.stem, p) for p in folder.glob("*.py")]
    found += [(d.name, d / f"{lab}.py") for d in folder.iterdir() if d.is_dir() and (d / f"{lab}.py").is_file()]
    return sorted(found)


UNGRADED = ("import error", "timeout", "crashed")  # statuses of a submission whose checks did not run


def grade_in_subprocess(lab: str, name: str, path: Path, timeout_s: float) -> SubmissionGrade:
    """Grade ``path`` in a child ``python -m minengine lab grade --json`` killed (with its process group) after
    ``timeout_s`` seconds."""
    total = len(get_lab(lab).checks)
    command = [sys.executable, "-m", "minengine", "lab", "grade", lab, str(path), "--json"]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)  # its own process group: a timeout kills what it started too
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return SubmissionGrade(name, str(path), "timeout", checks_total=total, first_failure=f"no grade within "
                               f"{timeout_s:g} s (an endless loop?): killed", seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return SubmissionGrade(name, str(path), "crashed", checks_total=total, first_failure=f"the grading process "
                               f"exited with code {child.returncode} without a grade: {tail}", seconds=seconds)
    report = json.loads(lines[-1])
    if report["import_error"]:
        return SubmissionGrade(name, str(path), "import error", checks_total=total,
                               first_failure=report["import_error"], seconds=seconds)
    results = report["results"]
    passed = sum(r["status"] == "passed" for r in results)
    failure = next((r for r in results if r["status"] == "failed"), None)
    return SubmissionGrade(name, str(path), "graded", passed / len(results) if results else 0.0, passed, len(results),
                           f"{failure['name']}: {failure['message']}" if failure else "", seconds)


def grade_class(lab: str, folder: Path, timeout_s: float) -> list[SubmissionGrade]:
    """Every submission of ``folder`` (``find_submissions``) graded in its own process.

    Raises:
        KeyError: an unknown lab. ValueError: ``folder`` is not a folder or holds no submission, or
            ``timeout_s`` is not > 0.
    """
    get_lab(lab)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of submissions")
    if not timeout_s > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {timeout_s}")
    submissions = find_submissions(lab, folder)
    if not submissions:
        raise ValueError(f"{folder} holds no submission: no *.py file in it and no <learner>/{lab}.py folder")
    return [grade_in_subprocess(lab, name, path, timeout_s) for name, path in submissions]


def format_class(grades: list[SubmissionGrade]) -> str:
    """The class's table, one row per submission with every score column whole, then each submission's first
    failure in full below it (a row stays short enough to read; no words are cut)."""
    width = max([len(g.submission) for g in grades] + [10])
    lines = [f"{'submission':<{width}}  {'status':<12} {'score':>6}  {'checks':>7}  {'seconds':>7}"]
    for g in grades:
        checks = f"{g.checks_passed}/{g.checks_total}"
        lines.append(f"{g.submission:<{width}}  {g.status:<12} {g.score:>6.0%}  {checks:>7}  {g.seconds:>7.1f}")
    failures = [g for g in grades if g.first_failure]
    if failures:
        lines += ["", "first failures:"]
        for g in failures:
            first, *rest = g.first_failure.splitlines()
            lines.append(f"{g.submission}: {first}")
            lines += [f"{'':<{len(g.submission) + 2}}{line.strip()}" for line in rest if line.strip()]
    return "\n".join(lines)


def cmd_list(a: argparse.Namespace) -> None:
    width = max(len(name) for name in LABS)
    for spec in LABS.values():
        print(f"{spec.order}. {spec.name:<{width}} {spec.minutes:>3} min  {spec.title}")
        print(f"   {'':<{width}}          you write {spec.part}; start from {os.path.relpath(spec.skeleton)}")


def _known_lab(name: str) -> str:
    """``name`` if it is a lab; else a ValueError listing the labs (the command line prints it)."""
    try:
        return get_lab(name).name
    except KeyError as error:
        raise ValueError(error.args[0]) from None


def cmd_grade(a: argparse.Namespace) -> None:
    report = grade(_known_lab(a.lab), a.path)
    if a.json:
        print(json.dumps({"lab": report.lab, "submission": report.submission, "passed": report.passed,
                          "score": report.score, "import_error": report.import_error,
                          "results": [asdict(r) for r in report.results]}))
    else:
        print(report.format())
    sys.exit(0 if report.passed else 1)


def cmd_grade_class(a: argparse.Namespace) -> None:
    grades = grade_class(_known_lab(a.lab), Path(a.folder), a.timeout)
    print(format_class(grades))
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(SubmissionGrade.__dataclass_fields__))
            writer.writeheader()
            writer.writerows(asdict(g) for g in grades)
    ungraded = [g.submission for g in grades if g.status in UNGRADED]
    if ungraded:
        print(f"\n{len(ungraded)} of {len(grades)} submissions got no grade (their checks did not run): "
              f"{', '.join(ungraded)}", file=sys.stderr)
    sys.exit(1 if ungraded else 0)


def add_lab_parser(sub) -> None:
    """``lab list | grade | grade-class`` under the main parser's subcommands."""
    lab = sub.add_parser("lab", help="the labs: list them, grade a learner's part, grade a class")
    cmds = lab.add_subparsers(dest="lab_command", required=True)
    cmds.add_parser("list", help="the labs in course order").set_defaults(func=cmd_list)
    g = cmds.add_parser("grade", help="grade one learner's file (exit code 0 when every check passes)")
    g.add_argument("lab", help="the lab's name (see `lab list`)")
    g.add_argument("path", nargs="?", default=None, help="the learner's file (default: the lab's skeleton)")
    g.add_argument("--json", action="store_true", help="print the report as one JSON line")
    g.set_defaults(func=cmd_grade)
    c = cmds.add_parser("grade-class", help="grade a folder of submissions, each in its own process (exit code 0 "
                        "when every submission was graded, 1 when some got no grade: import error, timeout or "
                        "crashed; the table and CSV list them all)")
    c.add_argument("lab", help="the lab's name")
    c.add_argument("folder", help="*.py files, or one folder per learner holding <lab>.py")
    c.add_argument("--timeout", type=float, default=300.0, help="seconds per submission before it is killed")
    c.add_argument("--csv", default=None, help="also write the table to this CSV file")
    c.set_defaults(func=cmd_grade_class)

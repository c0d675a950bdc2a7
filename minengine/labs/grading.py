"""Grading a lab: checks in three stages (unit, property, end to end), a report a learner can read.

A check is a function of the learner's module that returns quietly when the part keeps its contract and raises
``LabFailure`` with words (which invariant, which request, which step, expected vs got) when it does not. A
stage runs only when every check of the stages before it passed: an end-to-end run on a part that fails its
unit checks would only say less clearly what the unit check said.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from minengine.labs.check import (
    STAGES,
    Check,
    LabFailure,
    expect_equal,
    expect_raises,
    hypothesis_settings,
    learner_files,
    where_raised,
)

__all__ = ["STAGES", "Check", "CheckResult", "GradeReport", "LabFailure", "expect_equal", "expect_raises", "grade",
           "hypothesis_settings", "learner_files", "run_checks", "where_raised"]


@dataclass
class CheckResult:
    """What one check said: ``status`` is "passed", "failed" or "skipped" (an earlier stage failed)."""

    name: str
    stage: str
    status: str
    message: str = ""
    seconds: float = 0.0


@dataclass
class GradeReport:
    """The grade of one submission of one lab.

    Attributes:
        lab: the lab's name.
        submission: where the learner's part came from (a path or a module name).
        results: one ``CheckResult`` per check of the lab, in the order they ran (stage order).
        import_error: why the submission does not import ("" when it does); then every check is skipped.
    """

    lab: str
    submission: str
    results: list[CheckResult] = field(default_factory=list)
    import_error: str = ""

    @property
    def passed(self) -> bool:
        """Every check passed."""
        return bool(self.results) and all(r.status == "passed" for r in self.results)

    @property
    def score(self) -> float:
        """Checks passed / checks in all (0.0 to 1.0; skipped checks count as not passed)."""
        return sum(r.status == "passed" for r in self.results) / len(self.results) if self.results else 0.0

    @property
    def first_failure(self) -> CheckResult | None:
        """The first failed check; for a submission that does not import, a result named "the submission imports"
        with ``import_error`` as its words (no check of the lab ran)."""
        if self.import_error:
            return CheckResult("the submission imports", "unit", "failed", self.import_error)
        return next((r for r in self.results if r.status == "failed"), None)

    def format(self) -> str:
        """A table of the checks (stage, status, name) and the words of the first failure."""
        lines = [f"lab {self.lab}: {self.submission}", f"{'stage':<11} {'status':<8} check"]
        lines += [f"{r.stage:<11} {r.status:<8} {r.name}" for r in self.results]
        passed = sum(r.status == "passed" for r in self.results)
        lines.append(f"score {passed}/{len(self.results)} ({self.score:.0%})")
        failure = self.first_failure
        if self.import_error:
            lines += ["", "the submission does not import, so no check ran:", self.import_error]
        elif failure is not None:
            lines += ["", f"first failure, {failure.stage} check '{failure.name}':", failure.message]
        elif self.passed:
            lines.append("every check passed: the real engine runs on your part")
        return "\n".join(lines)


def describe_exception(error: BaseException, module: ModuleType | None = None) -> str:
    """Words for an exception raised by a check: a ``LabFailure``'s own message; "not implemented yet" for the
    skeleton's ``NotImplementedError``; for anything else, its type, message and the line of the learner's file
    (``module``'s) it came through."""
    if isinstance(error, LabFailure):
        return str(error)
    if isinstance(error, NotImplementedError):
        return f"not implemented yet: {error}"
    return f"raised {type(error).__name__}: {error}\n  at {where_raised(error, learner_files(module))}"


def run_checks(checks: list[Check], module: ModuleType) -> list[CheckResult]:
    """Run ``checks`` on ``module`` stage by stage; a stage after a failing stage is skipped."""
    results, failed_stage = [], None
    for stage in STAGES:
        for check in (c for c in checks if c.stage == stage):
            if failed_stage is not None:
                results.append(CheckResult(check.name, stage, "skipped", f"skipped: a {failed_stage} check failed"))
                continue
            start = time.perf_counter()
            try:
                check.run(module)
            except (Exception, SystemExit) as error:  # the learner's code may raise anything (or exit): graded
                results.append(CheckResult(check.name, stage, "failed", describe_exception(error, module),
                                           time.perf_counter() - start))
            else:
                results.append(CheckResult(check.name, stage, "passed", "", time.perf_counter() - start))
        if failed_stage is None and any(r.stage == stage and r.status == "failed" for r in results):
            failed_stage = stage
    return results


def grade(lab_name: str, submission: str | Path | ModuleType | None = None) -> GradeReport:
    """Grade ``submission`` (a file path, a module name, a module; None: the lab's skeleton) for ``lab_name``.

    Returns:
        a ``GradeReport``; for a submission that does not import, its ``import_error`` names the file and line
        and every check of the lab is skipped (score 0 of the lab's checks).

    Raises:
        KeyError: ``lab_name`` is not a lab (the message lists the labs).
    """
    from minengine.labs.loading import load_submission
    from minengine.labs.registry import get_lab

    spec = get_lab(lab_name)
    submission = spec.skeleton if submission is None else submission
    shown = submission.__name__ if isinstance(submission, ModuleType) else str(submission)
    report = GradeReport(spec.name, shown)
    try:
        module = load_submission(submission)
    except LabFailure as error:
        report.import_error = str(error)
        report.results = [CheckResult(c.name, c.stage, "skipped", "skipped: the submission does not import")
                          for c in spec.checks]
        return report
    report.results = run_checks(spec.checks, module)
    return report

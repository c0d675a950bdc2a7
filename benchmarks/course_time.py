"""The whole course's run time: every notebook executed top to bottom in fast mode (``MINENGINE_FAST=1``), exactly
as ``tests/course/test_notebooks.py`` executes it (the solutions in the answer cells, each typical wrong answer against
a copy of its check, each widget's callback once: ``instrumented``), one kernel per chapter, 1 torch thread.

It prints each chapter's wall time and its CPU time (the kernels are other processes, so this process's CPU time
would miss them: the CPU time is that of the finished child processes, ``resource.getrusage(RUSAGE_CHILDREN)``,
which takes in the kernel and every process it waited for, such as chapter 10's fleet), the totals, the bound the
course is held to (``--budget-s``, 600 s: "the whole course within 10 minutes on the CI machine") and the load
average before and after, since a shared machine stretches every wall time. The
time limit lives here and not in the test suite (issue 21: a suite that fails because the machine is busy says
nothing about the code); the suite keeps each cell's timeout.

    python benchmarks/course_time.py                       # every chapter
    python benchmarks/course_time.py --chapters 00_tour,02_paged_attention --json /tmp/course.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.course.test_notebooks import CELL_TIMEOUT_S, CHAPTERS, NOTEBOOKS_DIR, all_outputs, instrumented, load  # noqa: E402

BUDGET_S = 600.0


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's finished and waited-for child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_chapter(chapter: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of its kernel) to execute ``chapter`` (instrumented, fast mode). On a shared
    machine the wall time counts the turns other processes take on the cores; the CPU time does not.

    Raises:
        RuntimeError: a cell's output is an error (the time of a broken chapter means nothing).
    """
    import nbclient

    nb = instrumented(load(chapter))
    start, cpu_start = time.perf_counter(), children_cpu_s()
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}).execute()
    seconds, cpu_seconds = time.perf_counter() - start, children_cpu_s() - cpu_start
    errors = [o for o in all_outputs(nb) if o.get("output_type") == "error"]
    if errors:
        raise RuntimeError(f"{chapter}: {errors[0].get('ename')}: {errors[0].get('evalue', '')}")
    return seconds, cpu_seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chapters", default=",".join(CHAPTERS), help="comma-separated notebook names")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="the bound for the chapters run (seconds)")
    p.add_argument("--json", default=None, help="also write the numbers here")
    a = p.parse_args(argv)
    chapters = [c for c in a.chapters.split(",") if c]
    unknown = sorted(set(chapters) - set(CHAPTERS))
    if unknown:
        p.error(f"unknown chapters {unknown}; known: {', '.join(CHAPTERS)}")
    os.environ["MINENGINE_FAST"] = "1"  # the kernels inherit both
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    before = load_average()
    times, cpu_times = {}, {}
    print(f"{'chapter':28s} {'wall':>9s} {'CPU':>9s}")
    for chapter in chapters:
        times[chapter], cpu_times[chapter] = time_chapter(chapter)
        print(f"{chapter:28s} {times[chapter]:7.1f} s {cpu_times[chapter]:7.1f} s", flush=True)
    total, total_cpu = sum(times.values()), sum(cpu_times.values())
    after = load_average()
    verdict = "within" if total <= a.budget_s else "OVER"
    cpu_verdict = "within" if total_cpu <= a.budget_s else "OVER"
    print(f"{'total':28s} {total:7.1f} s {total_cpu:7.1f} s (wall {verdict}, CPU {cpu_verdict} the {a.budget_s:.0f} s "
          f"budget; load average before {before}, after {after}; {os.cpu_count()} cores)")
    if a.json:
        Path(a.json).write_text(json.dumps({"seconds": times, "cpu_seconds": cpu_times, "total_s": total,
                                            "total_cpu_s": total_cpu, "budget_s": a.budget_s,
                                            "load_before": before, "load_after": after}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

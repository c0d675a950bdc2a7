"""``docs/reading_order.md`` stays true: the files it names exist, its line counts are near the real ones, and its
two tables list exactly the minengine files whose code runs while the default engine serves one prompt.

The counts are written by hand, not generated: the page is prose around a table, and a count within 10 % (or 5
lines) of the file's non-blank lines survives the small edits other work makes to these files, while a file that
grew or shrank by more fails here and its row gets updated (with its "what it holds").
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reading_order.md"
ROW = re.compile(r"^\|(?:\s*\d+\s*\|)?\s*`(minengine/[^`]+)`\s*\|\s*([\d,]+)\s*\|", re.MULTILINE)


def sections() -> dict[str, str]:
    """Heading -> text of each ``## `` section of the page."""
    parts = re.split(r"^## (.+)$", DOC.read_text(), flags=re.MULTILINE)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def rows(section: str) -> dict[str, int]:
    """File -> the line count its row states, for the table of one section."""
    found = ROW.findall(sections()[section])
    table = {path: int(count.replace(",", "")) for path, count in found}
    assert len(table) == len(found), f"a file is listed twice in '{section}'"
    return table


def non_blank_lines(path: str) -> int:
    return sum(1 for line in (ROOT / path).read_text().splitlines() if line.strip())


PATH, ALSO = "The path", "Also runs in this step (read later)"


def test_every_named_file_exists():
    named = set(re.findall(r"`((?:minengine|tests|docs|scripts)/[\w/.]+)`", DOC.read_text()))
    assert len(named) > 30
    assert not [p for p in sorted(named) if not (ROOT / p).exists()]


def test_line_counts_are_close_and_the_total_is_the_sum():
    path, also = rows(PATH), rows(ALSO)
    assert path and also and not set(path) & set(also)
    off = {p: (stated, non_blank_lines(p)) for p, stated in {**path, **also}.items()
           if abs(stated - non_blank_lines(p)) > max(5, 0.1 * non_blank_lines(p))}
    assert not off, f"update these rows (stated, real): {off}"
    total = re.search(r"\*\*(\d+) files, ([\d,]+) non-blank lines\*\*", DOC.read_text())
    assert total and (int(total[1]), int(total[2].replace(",", ""))) == (len(path), sum(path.values()))


def test_the_tables_are_the_files_one_default_step_runs():
    """Profile ``LLM.generate`` of one prompt in the default configuration (on the CPU) and collect the minengine
    files whose functions ran: the two tables must name exactly those."""
    from minengine import LLM, SamplingParams
    from minengine.layers import cpu_attention

    cpu_attention.get_kernel()  # the default CPU step runs the C++ kernel once built (the reference meanwhile)
    llm = LLM(device="cpu")
    package = str(ROOT / "minengine") + os.sep
    ran: set[str] = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            ran.add(Path(frame.f_code.co_filename).relative_to(ROOT).as_posix())

    sys.setprofile(profile)
    try:
        out = llm.generate(["To be, or not to be"], SamplingParams(max_tokens=4, seed=0), use_tqdm=False)
    finally:
        sys.setprofile(None)
    assert len(out[0].outputs[0].token_ids) == 4
    listed = set(rows(PATH)) | set(rows(ALSO))
    assert not ran - listed, f"these files run in a default step but the page does not list them: {ran - listed}"
    assert not listed - ran, f"the page lists files a default step does not run: {listed - ran}"

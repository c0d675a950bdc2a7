"""The labs' tables in labs/README.md and docs/labs.md are the registry's: every lab, its order and minutes, and
(docs/labs.md) how many checks of each stage its grader runs."""

from __future__ import annotations

import re
from pathlib import Path

from minengine.labs import LABS

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (\d+) \| `(\w+)` \| (\d+) \|(.*)\|\s*$", re.M)


def rows(page: Path) -> list[tuple]:
    return ROW.findall(page.read_text())


def test_the_teachers_table_is_the_registry():
    found = [(int(n), name, int(minutes)) for n, name, minutes, _ in rows(ROOT / "labs" / "README.md")]
    assert found == [(s.order, s.name, s.minutes) for s in LABS.values()]


def test_the_docs_table_is_the_registry_with_its_checks():
    found = [(int(n), name, int(minutes), rest.rsplit("|", 1)[-1].strip()) for n, name, minutes, rest in
             rows(ROOT / "docs" / "labs.md")]
    expected = [(s.order, s.name, s.minutes, " / ".join(str(sum(c.stage == stage for c in s.checks))
                                                          for stage in ("unit", "property", "end_to_end")))
                for s in LABS.values()]
    assert found == expected


def test_the_row_reader_can_fail(tmp_path):
    page = tmp_path / "x.md"
    page.write_text("| 1 | `block_pool` | 61 | the pool | 11 / 1 / 2 |\n")
    assert [(int(n), name, int(m)) for n, name, m, _ in rows(page)] != [(1, "block_pool", 60)]

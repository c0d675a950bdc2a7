"""Build notebooks/00_tour.ipynb ... 08_interview.ipynb from the chapter sources in scripts/course/.

The notebooks are written without outputs; edit the chapter sources and re-run:
    python scripts/build_notebooks.py
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ["00_tour", "01_prefill_decode", "02_paged_attention", "03_continuous_batching",
            "04_chunked_prefill", "05_prefix_caching", "06_admission_preemption", "07_scheduler_slos",
            "08_interview"]


def build(chapter: str) -> nbformat.NotebookNode:
    """The notebook of one chapter: ``scripts/course/ch<chapter>.py`` defines ``CELLS``."""
    module = importlib.import_module(f"ch{chapter}")
    nb = nbformat.v4.new_notebook(cells=module.CELLS)
    for i, cell in enumerate(nb.cells):  # stable ids keep git diffs to real edits
        cell["id"] = f"c{i:03d}"
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    return nb


def main(argv: list[str]) -> None:
    sys.path.insert(0, str(ROOT / "scripts" / "course"))
    wanted = argv or CHAPTERS
    for chapter in wanted:
        if chapter not in CHAPTERS:
            raise ValueError(f"unknown chapter {chapter!r}; choose from {CHAPTERS}")
        path = ROOT / "notebooks" / f"{chapter}.ipynb"
        nbformat.write(build(chapter), path)
        print("wrote", path.relative_to(ROOT))


if __name__ == "__main__":
    main(sys.argv[1:])

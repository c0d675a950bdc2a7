"""Build notebooks/NN_name.ipynb from the chapter sources scripts/course/chNN_name.py (every chapter found there).

The notebooks are written without outputs; edit the chapter sources and re-run:
    python scripts/build_notebooks.py            # every chapter
    python scripts/build_notebooks.py 04_chunked_prefill
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
COURSE_DIR = ROOT / "scripts" / "course"
CHAPTERS = sorted(p.stem[2:] for p in COURSE_DIR.glob("ch[0-9][0-9]_*.py"))


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
    sys.path.insert(0, str(COURSE_DIR))
    wanted = argv or CHAPTERS
    for chapter in wanted:
        if chapter not in CHAPTERS:
            raise ValueError(f"unknown chapter {chapter!r}; choose from {CHAPTERS}")
        path = ROOT / "notebooks" / f"{chapter}.ipynb"
        nbformat.write(build(chapter), path)
        print("wrote", path.relative_to(ROOT))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Build notebooks/NN_name.ipynb from the chapter sources scripts/course/chNN_name.py (every chapter found there),
and each lab's page notebooks/labN_name.ipynb from scripts/course/labN_name.py.

The notebooks are written without outputs; edit the chapter sources and re-run:
    python scripts/build_notebooks.py            # every chapter
    python scripts/build_notebooks.py 04_chunked_prefill
    python scripts/build_notebooks.py lab1_block_pool
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
COURSE_DIR = ROOT / "scripts" / "course"
CHAPTERS = sorted(p.stem[2:] for p in COURSE_DIR.glob("ch[0-9][0-9]_*.py"))
LAB_PAGES = sorted(p.stem for p in COURSE_DIR.glob("lab[0-9]_*.py"))  # a lab's page: its source is its name


def source_module(name: str) -> str:
    """The module under scripts/course/ that builds notebooks/<name>.ipynb."""
    return name if name in LAB_PAGES else f"ch{name}"


def build(chapter: str) -> nbformat.NotebookNode:
    """The notebook of one chapter or lab page: ``scripts/course/ch<chapter>.py`` (a lab page:
    ``scripts/course/<chapter>.py``) defines ``CELLS``."""
    module = importlib.import_module(source_module(chapter))
    nb = nbformat.v4.new_notebook(cells=module.CELLS)
    for i, cell in enumerate(nb.cells):  # stable ids keep git diffs to real edits
        cell["id"] = f"c{i:03d}"
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    return nb


def main(argv: list[str]) -> None:
    sys.path.insert(0, str(COURSE_DIR))
    known = CHAPTERS + LAB_PAGES
    for chapter in argv or known:
        if chapter not in known:
            raise ValueError(f"unknown chapter {chapter!r}; choose from {known}")
        path = ROOT / "notebooks" / f"{chapter}.ipynb"
        nbformat.write(build(chapter), path)
        print("wrote", path.relative_to(ROOT))


if __name__ == "__main__":
    main(sys.argv[1:])

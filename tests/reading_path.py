"""What the default step executes, measured as a reader would follow it: ``sys.settrace`` over one default
``LLM().generate`` of a few prompts after a warm-up, recording every minengine function called.

``python -m tests.reading_path`` prints the files (non-blank lines each) and the longest executed functions.
"""

from __future__ import annotations

import inspect
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

PACKAGE = Path(__file__).resolve().parents[1] / "minengine"
PROMPTS = ["ROMEO:", "To be, or not to be", "First Citizen:\nBefore we proceed any further, hear me speak."]


def non_blank(lines: list[str]) -> int:
    return sum(1 for line in lines if line.strip())


@dataclass
class ReadingPath:
    files: dict[str, int]  # path relative to the repository -> non-blank lines
    functions: dict[str, int]  # "path:qualname" -> non-blank lines of its source

    @property
    def total_lines(self) -> int:
        return sum(self.files.values())

    def longer_than(self, limit: int) -> dict[str, int]:
        return {name: n for name, n in self.functions.items() if n > limit}


def trace_default_generate(max_tokens: int = 8) -> ReadingPath:
    """Run ``LLM().generate`` twice (a warm-up, then traced) and return what the traced call executed: default
    sampling settings (temperature 1, seeded for repeatability), ``max_tokens`` tokens per prompt."""
    from minengine import LLM, SamplingParams
    from minengine.layers import cpu_attention

    # The default CPU step runs the C++ attention kernel once it is built: wait for the build (cached after the
    # first), so the path measured is the one an engine settles into, not the reference's while it compiles.
    cpu_attention.get_kernel()
    llm = LLM()
    params = SamplingParams(max_tokens=max_tokens, seed=0)
    llm.generate(PROMPTS, params, use_tqdm=False)
    called: set[CodeType] = set()
    root = str(PACKAGE)

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            called.add(frame.f_code)
        return None  # no line events: calls only

    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return _measure(called)


def _measure(called: set[CodeType]) -> ReadingPath:
    repo = PACKAGE.parent
    files, functions = {}, {}
    for code in called:
        path = Path(code.co_filename)
        rel = str(path.relative_to(repo))
        if rel not in files:
            files[rel] = non_blank(path.read_text().splitlines())
        if code.co_name.startswith("<"):  # a module, a comprehension, a lambda: part of what encloses it
            continue
        try:
            lines, _ = inspect.getsourcelines(code)
        except OSError:
            continue
        functions[f"{rel}:{code.co_qualname}"] = non_blank(lines)
    return ReadingPath(files, functions)


if __name__ == "__main__":
    path = trace_default_generate()
    for rel, n in sorted(path.files.items(), key=lambda kv: -kv[1]):
        print(f"{n:6d}  {rel}")
    print(f"{path.total_lines:6d}  in {len(path.files)} files")
    for name, n in sorted(path.longer_than(40).items(), key=lambda kv: -kv[1]):
        print(f"  {n:4d}  {name}")

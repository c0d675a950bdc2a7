"""The engine stands alone: ``LLM().generate`` and ``python -m minengine --help`` run with the packages around it
(the dashboard's ``viz``, the fleet simulator, the course, the workloads) and the timing cost model impossible to
import. A meta-path finder raises ImportError for each of them, in a fresh interpreter, so a module-level import
anywhere on the engine's path fails the test."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("minengine.viz", "minengine.fleet", "minengine.course", "minengine.workloads")
# minengine.timing's package (its names are imported on first use) and the wall clock are all the engine reads
TIMING_ALLOWED = ("minengine.timing", "minengine.timing.wall_clock")

BLOCKER = textwrap.dedent(f"""
    import importlib.abc, sys

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.startswith({BLOCKED!r}) or (name.startswith("minengine.timing.")
                                                   and name not in {TIMING_ALLOWED!r}):
                raise ImportError(f"blocked for this test: {{name}}")
            return None

    sys.meta_path.insert(0, Blocker())
""")


def run_blocked(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


def test_the_blocker_blocks():
    """The finder really refuses each package (else the tests below prove nothing)."""
    for module in (*BLOCKED, "minengine.timing.cost_model", "minengine.timing.clocks"):
        p = run_blocked(f"import {module}")
        assert p.returncode != 0 and "blocked for this test" in p.stderr, (module, p.stderr)


def test_llm_generate_runs_without_the_packages_around_the_engine(bundled_model):
    p = run_blocked("""
        import sys
        from minengine import LLM, SamplingParams

        outs = LLM().generate(["ROMEO:", "JULIET:"], SamplingParams(max_tokens=8), use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
        loaded = sorted(m for m in sys.modules if m.startswith("minengine.timing."))
        print("timing modules:", loaded)
    """)
    assert p.returncode == 0, p.stderr
    assert "timing modules: ['minengine.timing.wall_clock']" in p.stdout


@pytest.mark.parametrize("args", [["--help"], ["generate", "--help"], ["serve", "--help"]])
def test_the_command_line_help_runs_without_them(args):
    p = run_blocked(f"""
        import runpy, sys
        sys.argv = ["minengine", *{args!r}]
        runpy.run_module("minengine", run_name="__main__")
    """)
    assert p.returncode == 0, p.stderr
    assert "usage:" in p.stdout

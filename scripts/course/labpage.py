# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Cell builders for the labs' notebook pages (``scripts/course/labN_<lab>.py`` -> ``notebooks/labN_<lab>.ipynb``).

A lab page has four parts, in this order (tests/course/test_lab_pages.py relies on the tags):
1. the part explained with a picture computed from the real engine's state (the lab's own cells);
2. where the skeleton is and how to start: one cell (tag ``lab-submission``) the learner edits, ``MY_FILE``
   defaulting to the skeleton, so a fresh run shows the grader's "not implemented yet" message; its metadata
   ``minengine.reference`` names the reference solution that the tests substitute;
3. the grader on ``MY_FILE`` (tag ``lab-grade``);
4. the engine running on the learner's part (``EngineConfig.labs``) when it passes, drawn with the dashboard's own
   figures (``minengine.viz``), a conclusion naming the learner's parts, and the command for the live dashboard.
"""

from __future__ import annotations

from cells import code, conclusion, md

LAB_SETUP = """\
# Setup: the real engine, the labs' grader, the course helpers and the dashboard's figure builders.
import ast
from pathlib import Path

import minengine.viz as viz
from minengine import SamplingParams
from minengine.course import CLOCK_LABEL, FAST, conclude, modelled_engine, run_to_completion, titled
from minengine.labs import LABS, grade
from minengine.labs.door import describe_parts
from minengine.labs.end_to_end import WORKLOADS, Workload, prompt_ids
from minengine.viz.template import use_course_template

use_course_template()
LAB = "{lab}"
spec = LABS[LAB]
print(f"lab {{spec.order}}: {{spec.title}} ({{spec.minutes}} minutes) | fast mode: {{FAST}} | teaching clock: {{CLOCK_LABEL}}")
print("you write:", spec.part)


def serve(workload: Workload, labs: dict | None = None):
    \"\"\"Run ``workload``'s prompts (greedy, pass after pass) on an engine built with ``labs`` (``EngineConfig.labs``:
    lab name -> the learner's file) on the modelled clock; returns (engine, {{request id: output token ids}}).\"\"\"
    engine = modelled_engine(labs=labs, max_model_len=256, seed=0, **workload.settings)
    params = SamplingParams(temperature=0, max_tokens=workload.max_tokens, ignore_eos=True)
    tokens = {{}}
    for p in range(workload.passes):
        for i, cut in enumerate(workload.prompts):
            engine.add_request(f"pass{{p}}-req{{i}}", {{"prompt_token_ids": prompt_ids(cut)}}, params)
        tokens.update({{rid: list(out.outputs[0].token_ids) for rid, out in run_to_completion(engine).items()}})
    return engine, tokens
"""


def header(number: int, lab: str, title: str, goals: list[str], before: str) -> list:
    """Title, learning goals, the chapter to read first, and the setup cell."""
    lines = [f"# Lab {number} · {title}", "", "## Learning goals", ""] + [f"- {g}" for g in goals]
    lines += ["", f"**Read first**: {before}. The lab's page in the manual: [docs/labs.md](../docs/labs.md); for "
              "teachers, [labs/README.md](../labs/README.md)."]
    return [md("\n".join(lines)), code(LAB_SETUP.format(lab=lab))]


def your_file(lab: str, steps: str) -> list:
    """Where the skeleton is, how to start, the cell the learner edits, and what the skeleton asks for."""
    submission = code(f"""
    # Your file: the skeleton as it is, until you point this at your copy (e.g. "../my_{lab}.py").
    MY_FILE = "../labs/{lab}/{lab}.py"
    """, tags=("lab-submission",))
    submission.metadata["minengine"] = {"reference": f'MY_FILE = "minengine.labs.solutions.{lab}"'}
    return [
        md(f"""
        ## Your file
        The skeleton is `labs/{lab}/{lab}.py`: the public interface with docstrings (shapes, units, and a `Raises:`
        section for each function that must raise), every body a `NotImplementedError` that says what to implement. Work on a copy, never on a file
        inside `minengine/`: from the repository's root, `cp labs/{lab}/{lab}.py my_{lab}.py`, then set `MY_FILE`
        below to `"../my_{lab}.py"` (this notebook runs in `notebooks/`).

        {steps}
        """),
        submission,
        code("""
        # What the skeleton asks for: each function and method of your file, with the first line of its docstring.
        def outline(path):
            for node in ast.walk(ast.parse(Path(path).read_text())):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    doc = (ast.get_docstring(node) or "").split("\\n")[0]
                    print(f"{'class' if isinstance(node, ast.ClassDef) else 'def':5} {node.name:24} {doc}")


        outline(spec.skeleton)
        """),
    ]


def grade_it(lab: str) -> list:
    """The grader on the learner's file."""
    return [
        md(f"""
        ## Grade it
        The grader runs its stages in order, each after the ones before it passed: **unit** (the contract, case by
        case), **property** (hypothesis drives random workloads through your part and the reference side by side)
        and **end to end** (the real engine built on your part must give transformers' greedy tokens, and every KV
        block must be free at the end). A failure says what broke in words. On the skeleton it says what to
        implement first; run this cell again after each change (the same as
        `python -m minengine lab grade {lab} my_{lab}.py` in a terminal, from the repository's root).
        """),
        code("""
        report = grade(LAB, MY_FILE)
        print(report.format())
        """, tags=("lab-grade",)),
    ]


ENGINE_RUN = """\
# The engine on your part once it passes the grader (EngineConfig.labs), beside the engine on its own part.
WORKLOAD = {workload}
if not report.passed:
    print("Your part does not pass the grader yet, so both runs below use the engine's own part; run this cell "
          "again once the grade above passes.")
mine, mine_tokens = serve(WORKLOAD, labs={{LAB: MY_FILE}} if report.passed else None)
own, own_tokens = serve(WORKLOAD)
print(describe_parts(mine))
"""

ENGINE_CONCLUSION = """\
generated = sum(map(len, mine_tokens.values()))
conclude(f"{describe_parts(mine)}. On the workload {WORKLOAD.name!r} ({len(mine_tokens)} requests) the engine generated "
         f"**{generated} tokens**, each equal to the engine's own run's, and every one of its {mine.num_kv_blocks} KV "
         "blocks is free at the end.",
         [("the same tokens as the engine on its own part", mine_tokens == own_tokens),
          ("every request finished", len(mine_tokens) == len(WORKLOAD.prompts) * WORKLOAD.passes),
          ("every KV block is free", mine.kv_cache_manager.num_free_blocks == mine.num_kv_blocks),
          ("the parts named are the learner's exactly when the grade passed",
           (LAB in {p.lab for p in getattr(mine, "lab_parts", [])}) == report.passed)])
"""


def engine_on_your_part(lab: str, workload: str, what: str, figures: str, watch: str) -> list:
    """The engine on the learner's part, its tokens against the engine's own, the dashboard's figures and the
    command that opens the live dashboard on the learner's file."""
    return [
        md(f"""
        ## The engine on your part
        `EngineConfig(labs={{"{lab}": MY_FILE}})` builds the real engine and puts your part in place of its own
        ({what}); nothing inside `minengine/` is edited. The run below is a workload the grader also uses, on the
        modelled clock, next to the engine on its own part: the tokens must be the same.
        """),
        code(ENGINE_RUN.format(workload=workload)),
        conclusion(ENGINE_CONCLUSION),
        md(f"""
        The dashboard's own figures, drawn from the run on your part ({watch}):
        """),
        code(figures),
        md(f"""
        **The live dashboard on your part.** From the repository's root:
        `MINENGINE_LABS={lab}=my_{lab}.py streamlit run app.py`; under each run it prints which parts are yours, the
        line the engine run above printed. The server takes the same part: `python -m minengine serve --lab {lab}=my_{lab}.py`.
        """),
    ]


def summary(points: list[str]) -> list:
    return [md("## Summary\n\n" + "\n".join(f"- {p}" for p in points))]

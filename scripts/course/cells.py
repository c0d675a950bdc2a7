"""Cell builders for the course notebooks: every chapter is a list of nbformat cells made with these.

Conventions the tests rely on (tests/course/test_notebooks.py):
- the first cell holds ``## Learning goals``; the chapter ends with ``## Summary`` and ``## Glossary``;
- an exercise is four cells: question (markdown), answer (code, tag ``answer``, a ``None`` placeholder, and in
  its metadata ``minengine.wrong_answers``: typical wrong answers, each a code snippet that the tests run
  before the check and expect to FAIL), check (code, tag ``check``, prints PASS/FAIL), solution (markdown, tag
  ``solution``, a ``<details>`` block with one fenced python block that the tests substitute for the answer);
- a conclusion cell (tag ``conclusion``) ends with ``conclude(...)`` (or ``show(...)``) so its sentence renders,
  and asserts what the sentence says; the tests require that every one produced output;
- an open question (``question``: "why...?", "what if...?") is markdown with a revealable model answer.
"""

from __future__ import annotations

from textwrap import dedent

import nbformat.v4 as nbf


def _text(s: str) -> str:
    return dedent(s).strip("\n")


def md(s: str, tags: tuple[str, ...] = ()):
    cell = nbf.new_markdown_cell(_text(s))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def code(s: str, tags: tuple[str, ...] = ()):
    cell = nbf.new_code_cell(_text(s))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def conclusion(s: str):
    """A code cell whose last expression renders a conclusion sentence checked against its numbers."""
    return code(s, tags=("conclusion",))


def header(number: int, title: str, goals: list[str], sources: list[str]) -> list:
    """Title, learning goals and the sources the chapter's claims come from."""
    lines = [f"# {number:02d} · {title}", "", "## Learning goals", ""] + [f"- {g}" for g in goals]
    lines += ["", "**Sources**: " + "; ".join(sources)]
    return [md("\n".join(lines))]


def exercise(number: int, question: str, hint: str, variable: str, solution: str, check_src: str,
             wrong: list[str] | tuple[str, ...] = ()) -> list:
    """Question, answer placeholder, PASS/FAIL check, and the solution hidden in a ``<details>`` block.

    ``wrong``: typical wrong answers (code assigning ``variable``), kept in the answer cell's metadata; the
    tests submit each one and require the check to print FAIL.
    """
    q = md(f"### Exercise {number}\n\n{_text(question)}\n\n<details><summary>Hint</summary>\n\n{_text(hint)}\n\n"
           "</details>")
    answer = code(f"{variable} = None  # replace None with your answer", tags=("answer",))
    answer.metadata["minengine"] = {"wrong_answers": [_text(w) for w in wrong]}
    check_cell = code(check_src, tags=("check",))
    sol = md(f"<details><summary>Solution (try first!)</summary>\n\n```python\n{_text(solution)}\n```\n\n"
             "</details>", tags=("solution",))
    return [q, answer, check_cell, sol]


def question(title: str, text: str, answer: str) -> list:
    """An open "why...? / what if...?" question (d2l style) with a model answer the learner can reveal."""
    return [md(f"#### Think about it: {title}\n\n{_text(text)}\n\n<details><summary>Model answer</summary>\n\n"
               f"{_text(answer)}\n\n</details>", tags=("question",))]


def summary(points: list[str]) -> list:
    return [md("## Summary\n\n" + "\n".join(f"- {p}" for p in points))]


def glossary(terms: list[tuple[str, str, str]]) -> list:
    """The bilingual glossary: English | 中文 | meaning."""
    rows = ["## Glossary · 术语表", "", "| English | 中文 | meaning |", "|---|---|---|"]
    rows += [f"| {en} | {zh} | {meaning} |" for en, zh, meaning in terms]
    return [md("\n".join(rows))]


SETUP = """\
# Setup: the real engine, the course helpers and the shared figure builders.
import os
import time

import plotly.graph_objects as go

import minengine.viz as viz
from minengine import LLM, EngineConfig, LLMEngine, SamplingParams
from minengine.course import (CLOCK_LABEL, COURSE_MODEL, FAST, check, check_close, check_function, claim, conclude,
                              modelled_engine, pick, run_to_completion, run_with_arrivals, show, titled)
from minengine.viz.template import use_course_template

use_course_template()   # log axes label their decades only (no stray "2", "5" between them)

print("fast mode (MINENGINE_FAST=1):", FAST, "| model:", COURSE_MODEL or "bundled tiny Shakespeare Llama",
      "| teaching clock:", CLOCK_LABEL)
"""

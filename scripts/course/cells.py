"""Cell builders for the course notebooks: every chapter is a list of nbformat cells made with these.

Conventions the tests rely on (tests/test_notebooks.py):
- the first cell holds ``## Learning goals``; the chapter ends with ``## Summary`` and ``## Glossary``;
- an exercise is four cells: question (markdown), answer (code, tag ``answer``, a ``None`` placeholder),
  check (code, tag ``check``, prints PASS/FAIL), solution (markdown, tag ``solution``, a ``<details>`` block
  with one fenced python block that the tests substitute for the answer cell).
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


def header(number: int, title: str, goals: list[str], sources: list[str]) -> list:
    """Title, learning goals and the sources the chapter's claims come from."""
    lines = [f"# {number:02d} · {title}", "", "## Learning goals", ""] + [f"- {g}" for g in goals]
    lines += ["", "**Sources**: " + "; ".join(sources)]
    return [md("\n".join(lines))]


def exercise(number: int, question: str, hint: str, variable: str, solution: str, check_src: str) -> list:
    """Question, answer placeholder, PASS/FAIL check, and the solution hidden in a ``<details>`` block."""
    q = md(f"### Exercise {number}\n\n{_text(question)}\n\n<details><summary>Hint</summary>\n\n{_text(hint)}\n\n"
           "</details>")
    answer = code(f"{variable} = None  # replace None with your answer", tags=("answer",))
    check_cell = code(check_src, tags=("check",))
    sol = md(f"<details><summary>Solution (try first!)</summary>\n\n```python\n{_text(solution)}\n```\n\n"
             "</details>", tags=("solution",))
    return [q, answer, check_cell, sol]


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
from minengine.course import COURSE_MODEL, FAST, check, check_close, pick, run_to_completion, run_with_arrivals, show

print("fast mode (MINENGINE_FAST=1):", FAST, "| model:", COURSE_MODEL or "bundled tiny Shakespeare Llama")
"""

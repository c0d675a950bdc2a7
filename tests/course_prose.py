"""Static scan of the course's prose: every number and every direction stated in a markdown cell must be backed.

Used by ``tests/test_course_numbers.py``; reads notebook cells (dicts with ``cell_type``, ``source``, ``metadata``),
executes nothing. The rules (also in ``notebooks/README.md``, *Numbers and directions in the prose*):

**What is scanned.** The text of every markdown cell, after removing what is not prose:
fenced code blocks (they are code), inline code in backticks (it quotes code: names, expressions, literals of the
cells), ``$...$`` math (definitions), HTML tags and link targets, the ``**Sources**:`` line of the header (the
citation list itself), and the heading's own numbering (``# 03 · ...``).

**Numbers.** A run of digits (``8,000``, ``0.65``, ``65 %``, ``3x``, ``8k``, ``10 ms``) is a number unless it is
- part of a name: letters right before it (``H100``, ``fp8``, ``int8``, ``ch07``, ``P99``, ``Llama-3-8B``,
  ``Qwen2``) or a ``B`` right after it (``8B``, ``70B``: parameter counts are part of model names), or letters
  after it that are not a unit (``2D``);
- numbering: after *chapter(s)*, *section(s)*, *exercise(s)*, *quiz*, *question*, *part*, *figure*, *table*,
  *page(s)*, *issue*, *equation*, *lesson* (and the list that follows: "chapters 4 and 5"), a list item's own
  number (``1. ``);
- a year (1950-2039 without a thousands separator, not followed by a unit or a counted noun), or ``'24``: years
  belong to citations.
A number passes when (a) its value is a numeric literal, or a constant expression of literals (``8 * 1024``), in a
code cell of the same chapter or in the python block of one of its solutions (a parameter, a threshold of an
assert / claim / check), read with its unit (``65 %`` matches ``65`` or ``0.65``, ``10 ms`` matches ``10`` or
``0.01``, ``8k`` matches ``8000`` or ``8192``); or (b) its sentence carries the cited-fact marker. A number the
prose states that the chapter neither sets nor checks (a measured result typed into the text) fails.

**Directions.** A comparison word (``DIRECTION_WORDS``: faster, slower, higher, lower, more, fewer, less, better,
worse, larger, smaller, bigger, longer, shorter, cheaper, grows, falls, drops, rises, wins, beats, increases,
decreases, shrinks, outperforms, twice, doubles, halves, and an ``Nx`` multiplier) must be backed: (a) a code
cell of the same section (the cells up to the next markdown heading) calls ``claim``/``conclude``/``check*`` or
``assert``; or (b) the sentence points to a section of the course that does, with ``(checked: <section>)`` (this
chapter) or ``(checked: chNN · <section>)`` (another chapter), and that section exists and has such a check; or
(c) the sentence carries the cited-fact marker; or (d) it talks to the learner: a question (ends in ``?``), an
instruction (starts with an imperative verb, ``INSTRUCTION_VERBS``), the prompt of an exercise (its question and
hint), the question part of a *Think about it* cell (before its model answer), or a learning goal.
The section rule is pragmatic: it cannot read whether the check says what the sentence says (the conclusion
cells do that, at run time); it finds prose with no check near it at all.

**The cited-fact marker** is a parenthesis starting ``source:`` in the sentence, naming where the fact comes from,
e.g. ``(source: Leviathan et al., ICML 2023, section 3.1)`` or ``(source: vLLM docs, *Engine arguments*)``.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

DIRECTION_WORDS = ("faster", "slower", "higher", "lower", "more", "fewer", "less", "better", "worse", "larger",
                   "smaller", "bigger", "longer", "shorter", "cheaper", "grows", "grow", "growing", "falls",
                   "drops", "rises", "wins", "beats", "increases", "decreases", "shrinks", "outperforms", "twice",
                   "doubles", "halves")
DIRECTION_RE = re.compile(r"\b(" + "|".join(DIRECTION_WORDS) + r")\b|(?<![\w.])\d+(?:\.\d+)?[x×](?![\w])", re.I)
NOT_A_DIRECTION_RE = re.compile(r"\b(no longer|any longer|once more|one more|more or less)\b", re.I)  # idioms, no comparison
INSTRUCTION_VERBS = ("predict", "guess", "try", "compare", "change", "set", "run", "re-run", "rerun", "find", "give",
                     "compute", "answer", "look", "watch", "pick", "move", "increase", "decrease", "raise", "lower",
                     "drag", "use", "explain", "measure", "see", "know", "read", "derive", "count", "build", "draw",
                     "estimate", "write", "make", "add", "replace", "choose", "name", "start", "turn", "double",
                     "halve", "vary", "plot", "check", "decide", "sketch", "list", "take", "keep", "say", "tell",
                     "state", "recompute", "simulate", "show", "reproduce", "size", "work", "call", "open", "follow",
                     "fill", "submit", "drop", "shrink", "grow", "remove", "switch", "imagine", "suppose", "assume")
CHECK_CALL_RE = re.compile(r"\b(?:claim|conclude|check|check_close|check_function)\(|\bassert\b")
CITED_RE = re.compile(r"\(\s*sources?\s*:\s*[^)\s][^)]*\)|\([^()]*\bet al\.[^()]*\)", re.I)
CHECKED_REF_RE = re.compile(r"\(\s*checked\s*:\s*([^)]+?)\s*\)", re.I)
HEADING_RE = re.compile(r"^\s{0,3}(#{1,6})\s+(.*)$", re.M)

UNITS = {"%": (1, 0.01), "x": (1,), "×": (1,), "k": (1e3, 1024), "m": (1e6, 2 ** 20), "ms": (1, 1e-3),
         "s": (1,), "µs": (1, 1e-6), "us": (1, 1e-6), "ns": (1, 1e-9), "gb": (1, 1e9, 2 ** 30),
         "gib": (1, 2 ** 30), "mb": (1, 1e6, 2 ** 20), "mib": (1, 2 ** 20), "kb": (1, 1e3, 1024), "kib": (1, 1024),
         "tb": (1, 1e12), "tflops": (1, 1e12), "gb/s": (1, 1e9), "tb/s": (1, 1e12)}
ORDINALS = ("st", "nd", "rd", "th")
COUNTED = re.compile(r"\s*-?\s*(tokens?|requests?|steps?|blocks?|gpus?|prompts?|sequences?|layers?|heads?|bytes?)\b",
                     re.I)
NUMBERING_RE = re.compile(
    r"(?i)\b(chapters?|ch\.|sections?|§|exercises?|quiz(?:zes)?|questions?|parts?|figures?|fig\.|tables?|pages?|"
    r"pp?\.|issues?|eq\.|equations?|lessons?|steps? \d+ of)\s*\d+(?:\.\d+)*(?:\s*(?:,|and|or|&|–|-|to)\s*\d+(?:\.\d+)*)*")
NAME_BEFORE_RE = re.compile(r"\b(RTX|GTX|TP|PP|DP|EP|MI|GPT|Llama|Qwen|Python|CUDA|PR)\s$")
NUMBER_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Finding:
    """One unbacked number or direction: chapter, cell index, what was found, the sentence, why."""

    chapter: str
    cell: int
    kind: str  # "number" or "direction"
    token: str
    sentence: str

    def __str__(self) -> str:
        return f"{self.chapter} cell {self.cell}: unbacked {self.kind} {self.token!r} in: {self.sentence}"


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _src(cell) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


# ---------------------------------------------------------------- code side: literals the chapter sets or checks
def _literal_values(src: str) -> set[float]:
    """Numeric literals of a python source and the values of constant expressions of literals (``8 * 1024``)."""
    src = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in src.splitlines())
    try:
        tree = ast.parse(src)
    except SyntaxError:  # a cell that is not python: read its digits
        return {float(m.replace("_", "")) for m in re.findall(r"\d[\d_]*(?:\.\d+)?", src)}
    out: set[float] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            out.add(float(node.value))
        elif isinstance(node, (ast.BinOp, ast.UnaryOp)):
            if any(isinstance(n, ast.Name | ast.Call | ast.Attribute | ast.Subscript) for n in ast.walk(node)):
                continue  # not a constant expression
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) for n in ast.walk(node)) and len(
                    ast.unparse(node)) > 12:
                continue  # a long power could take forever to evaluate
            try:
                value = eval(compile(ast.Expression(node), "<const>", "eval"), {"__builtins__": {}}, {})
            except Exception:  # not constant (names), or an error: not a literal value
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                out.add(float(value))
    return out


SOLUTION_BLOCK_RE = re.compile(r"```python\n(.*?)\n```", re.S)


def code_values(cells) -> set[float]:
    """Every literal value set or checked by the chapter: its code cells and its solutions' python blocks."""
    values: set[float] = set()
    for cell in cells:
        if cell["cell_type"] == "code":
            values |= _literal_values(_src(cell))
        elif "solution" in _tags(cell):
            for block in SOLUTION_BLOCK_RE.findall(_src(cell)):
                values |= _literal_values(block)
    return values


def _matches(value: float, unit: str, values: set[float]) -> bool:
    factors = UNITS.get(unit.lower(), (1,)) if unit else (1,)
    for f in factors:
        want = value * f
        if any(math.isclose(want, v, rel_tol=1e-9, abs_tol=1e-12) for v in values):
            return True
    return False


# ---------------------------------------------------------------- prose side
def clean(text: str) -> str:
    """The prose of a markdown cell: code, inline code, math, HTML tags, link targets and the sources line removed."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "CODE", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$", "MATH", text, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"^\*\*Sources?\*\*:.*$", " ", text, flags=re.M)
    text = re.sub(r"^(\s{0,3}#{1,6}\s+)\d+\s*·", r"\1", text, flags=re.M)  # "# 03 · Title"
    text = re.sub(r"^(\s*)(?:\d+\.|\(\w\)|[a-z]\))\s+", r"\1- ", text, flags=re.M)  # list numbering
    return text


def sentences(text: str) -> list[str]:
    """Split prose into sentences: headings, list items and table rows are their own; paragraphs split after . ! ?"""
    text = re.sub(r"^(\s{0,3}#{1,6}\s[^\n]*)$", r"\n\1\n", text, flags=re.M)  # a heading is its own block
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\s*[-*|] )", text):
        block = " ".join(block.split())
        if not block:
            continue
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*(\[\"“_])", block) if s.strip()]
    return out


def numbers_in(sentence: str) -> list[tuple[str, float, str]]:
    """(token, value, unit) of every number of a sentence that the rules count (see the module docstring)."""
    s = NUMBERING_RE.sub(lambda m: m.group(1), sentence)
    s = CITED_RE.sub(" ", s)
    s = CHECKED_REF_RE.sub(" ", s)
    found = []
    for m in NUMBER_RE.finditer(s):
        i, j = m.span()
        before = s[:i]
        left = re.search(r"[\w\-.'’#]*$", before).group(0)
        if re.search(r"[A-Za-z]", left) or left.endswith(("'", "’", "#")) or (left.endswith(".") and left[:-1][-1:].isdigit()):
            continue  # part of a name (H100, fp8, Llama-3-8B, ch07) or of a version / decimal already read
        if left.endswith(".") and len(left) > 1:
            continue
        if NAME_BEFORE_RE.search(before):
            continue  # RTX 4090, TP 2, GPT 4: the number names a product or a setting
        after = s[j:]
        unit_m = re.match(r"\s?(%|×|x(?![\w])|tb/s|gb/s|tflops|gib|mib|kib|gb|mb|kb|tb|ms|µs|us|ns|s(?![\w])|k(?![\w])|"
                          r"K(?![\w])|M(?![\w]))", after, re.I)
        unit = unit_m.group(1) if unit_m else ""
        if not unit and re.match(r"[A-Za-z]", after):
            if re.match(r"(?:" + "|".join(ORDINALS) + r")\b", after):
                pass  # an ordinal is a number
            else:
                continue  # 8B, 2D: a name
        if unit and unit_m.group(0).startswith(" ") and unit.lower() in ("s", "m", "k"):
            # "3 s" is seconds; "5 M" could be words: keep only the unit forms that read as units
            if unit.lower() != "s":
                unit = ""
        text = m.group(0)
        value = float(text.replace(",", ""))
        if re.fullmatch(r"\d{4}", text) and 1950 <= value <= 2039 and not unit and not COUNTED.match(after):
            continue  # a year: it belongs to a citation
        found.append((text + (unit_m.group(0) if unit else ""), value, unit))
    return found


def _is_instruction(sentence: str) -> bool:
    """Starts with an imperative ("Set a higher budget and watch..."): an instruction verb not followed by a verb
    in the third person ("Recompute frees blocks" is a statement)."""
    s = re.sub(r"^[\s\-*>#|]*(\*\*[^*]*\*\*:?\s*)?", "", sentence).strip().lstrip("*_ ")
    words = re.findall(r"[A-Za-z\-]+", s)[:2]
    if not words or words[0].lower() not in INSTRUCTION_VERBS:
        return False
    return len(words) == 1 or not re.fullmatch(r"[a-z]+[^s]s", words[1])


def _learner_part(cell) -> tuple[str, str]:
    """(text addressed to the learner, text to scan as claims) of a markdown cell."""
    src = _src(cell)
    if re.match(r"\s*###\s+Exercise\b", src):
        return src, ""
    if "question" in _tags(cell) and "<summary>Model answer" in src:
        q, a = src.split("<summary>Model answer", 1)
        return q, a
    if src.lstrip().startswith("## Glossary"):
        return src, ""  # definitions of terms: their numbers are scanned below, their comparisons define
    if "## Learning goals" in src:
        goals, _, rest = src.partition("**Sources**")
        return goals, "**Sources**" + rest
    return "", src


def sections(cells) -> list[tuple[str, list[int]]]:
    """(heading title, cell indices) of each section: a markdown heading and the cells up to the next one."""
    out: list[tuple[str, list[int]]] = []
    for i, cell in enumerate(cells):
        heads = HEADING_RE.findall(_src(cell)) if cell["cell_type"] == "markdown" else []
        if heads or not out:
            title = heads[-1][1] if heads else ""
            out.append((_norm_title(title), [i]))
        else:
            out[-1][1].append(i)
    return out


def _norm_title(title: str) -> str:
    title = re.sub(r"^\d+\s*·\s*", "", title)
    return " ".join(re.sub(r"[*`_\"“”]", "", title).lower().split())


def _checked(cells, idx: list[int]) -> bool:
    return any(cells[i]["cell_type"] == "code" and CHECK_CALL_RE.search(_src(cells[i])) for i in idx)


def scan(chapter: str, cells, course: dict[str, list] | None = None) -> list[Finding]:
    """Every unbacked number and direction of one chapter's markdown cells (``cells``: nbformat cell dicts).

    ``course``: chapter id prefix (``"01"``) -> cells of that chapter, to resolve ``(checked: chNN · section)``.
    """
    values = code_values(cells)
    secs = sections(cells)
    section_of = {i: n for n, (_, idx) in enumerate(secs) for i in idx}
    findings = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        learner, prose = _learner_part(cell)
        summary = _src(cell).lstrip().startswith("## Summary")
        sec_checked = _checked(cells, secs[section_of[i]][1])
        for part, addressed in ((learner, True), (prose, False)):
            for sentence in sentences(clean(part)):
                cited = bool(CITED_RE.search(sentence))
                if not cited:
                    for token, value, unit in numbers_in(sentence):
                        if not _matches(value, unit, values):
                            findings.append(Finding(chapter, i, "number", token, sentence))
                if addressed or cited or sentence.rstrip(" *_)").endswith("?") or (
                        _is_instruction(sentence) and not summary):
                    continue
                plain = NOT_A_DIRECTION_RE.sub(" ", CHECKED_REF_RE.sub(" ", sentence))
                words = [m.group(0) for m in DIRECTION_RE.finditer(plain)]
                if not words or sec_checked or _ref_checked(sentence, chapter, cells, course):
                    continue
                findings.append(Finding(chapter, i, "direction", ", ".join(words), sentence))
    return findings


def _ref_checked(sentence: str, chapter: str, cells, course) -> bool:
    """The sentence names, with ``(checked: ...)``, sections that exist and hold a check (``;`` between several)."""
    refs = [part.strip() for m in CHECKED_REF_RE.finditer(sentence) for part in m.group(1).split(";")]
    return bool(refs) and all(_section_checked(ref, cells, course) for ref in refs)


def _section_checked(ref: str, cells, course) -> bool:
    m = re.match(r"ch(\d\d)\s*·\s*(.+)$", ref)
    other, title = (m.group(1), m.group(2)) if m else (None, ref)
    target = cells if other is None else (course or {}).get(other)
    if target is None:
        return False
    title = _norm_title(title)
    return any((name == title or (len(title) >= 8 and name.startswith(title))) and _checked(target, idx)
               for name, idx in sections(target))

"""Static scan of the course's prose: every number and every direction stated in a markdown cell must be backed.

Used by ``tests/course/test_course_numbers.py``; reads notebook cells (dicts with ``cell_type``,
``source``, ``metadata``) and executes nothing. The same rules, for authors, are in ``notebooks/README.md``
(*Numbers and directions in the prose*).

**What is read.** Every markdown cell, after removing what is not prose: fenced code blocks (code), inline code in
backticks (it quotes code: names, expressions and literals of the cells), ``$...$`` math (definitions), HTML tags
and link targets, the header's ``**Sources**:`` line (the citation list itself), and a heading's own numbering
(``# 03 · ...``) and a list item's (``1. ``). Sentences: each heading, list item and table row is one; paragraphs
split after ``.``, ``!``, ``?``.

**Numbers.** A run of digits with its unit (``8,000``, ``0.65``, ``65 %``, ``3x``, ``8k``, ``10 ms``, ``270 GB``).
Skipped, because they are not quantities the chapter states:
- part of a name: letters, ``#`` or ``'`` right before it (``H100``, ``fp8``, ``int8``, ``ch07``, ``P99``,
  ``Llama-3-8B``, ``PR #17885``, ``ISCA'24``), a ``B`` or another non-unit letter right after it (``8B``, ``70B``,
  ``2D``), or a product / setting word before it (``NAME_BEFORE_RE``: ``RTX 4090``, ``TP 2``);
- numbering: after *chapter(s)*, *section(s)*, *exercise(s)*, *quiz*, *question*, *part*, *figure*, *table*,
  *page(s)*, *issue*, *equation*, *lesson*, *lab(s)*, with the list that follows ("chapters 4 and 5");
- a year (1950-2039 without a thousands separator, not followed by a unit or a counted noun such as *tokens*);
- anything inside a citation or a ``(checked: ...)`` pointer.
A number passes when (a) its value, read with its unit (``65 %`` is 65 or 0.65, ``10 ms`` is 10 or 0.01, ``8k`` is
8000 or 8192, ``270 GB`` is 270, 270e9 or 270 x 2^30), is a numeric literal or a constant expression of literals
(``8 * 1024``) in a code cell of the same chapter or in the python block of one of its solutions: a parameter the
chapter sets, a threshold of an assert / claim / check; or (b) its sentence is a cited fact. A measured result typed
into the text is not a literal of any cell, so it fails: the sentence must be a conclusion cell's computed text
instead, or say no number. (The rule is static: a small integer that also happens to be a literal elsewhere in the
chapter passes; what it catches is the typed-in measurement, the number no cell holds.)

**Numbers in words.** Read too (``number_words_in``): a count in words (``NUMBER_WORDS``: "two" ... "ninety",
"dozen", with "hundred" / "thousand" / "million": "forty-eight", "two hundred") is a number, backed as above by a
literal of its value; "one" is not read (it is an article or a pronoun far more often than a count). A ratio in words
("three times", "tenfold", "a third", "two thirds", "half the") and a vague magnitude ("a few hundred thousand",
"hundreds of", "several thousand") have no value to match: they are claims, backed like a direction (below).

**Absolutes and recommendations.** A digit-free absolute (``ABSOLUTE_WORDS``: never, always, only, dominates,
eliminates, removes, guarantees, impossible, nothing, nobody, none) claims something of every case, which one run
cannot show; a recommendation (``RECOMMEND_RE``: should, recommend, best, prefer, optimal) generalises from the runs
to a choice. Both are backed like a direction, and a recommendation is a claim even when phrased as an instruction
("Pick the best budget for chat"). The allow-list (``NOT_ABSOLUTE_RE``) holds only phrases where the word names a
thing instead of claiming: a phase or access mode with "-only" / "only" after it ("prefill-only", "decode only",
"read-only"), the idiom "not only", and a quoted value (the profile ``"none"``). A statement of what minengine's code
does is backed by citing the code (``(source: `hash_block` in minengine/core/kv_cache_manager.py)``) or by a check.

**Directions.** A comparison word (``DIRECTION_WORDS``: faster, slower, higher, lower, more, fewer, less, better,
worse, larger, smaller, bigger, longer, shorter, cheaper, grow(s/ing), falls, drops, rises, wins, beats, increases,
decreases, shrinks, outperforms, twice, doubles, halves, lowers, raises, exceeds, outweighs, worsens, improves, slows,
grew, fell, rose, greater) or an ``Nx`` multiplier, except idioms that compare nothing
(``NOT_A_DIRECTION_RE``: "no longer", "one more"). It passes when
(a) a code cell of the same section (from the last markdown heading to the next) calls ``claim`` / ``conclude`` /
``check`` / ``check_close`` / ``check_function`` or ``assert``s; or
(b) the sentence points to the checks that test it, by label: ``(checked: <label>)`` in this chapter,
``(checked: chNN · <label>)`` in another, several separated by ``;``. A label is the statement of a ``claim`` or of a
``(statement, holds)`` pair given to ``conclude``, the name of a ``check*``, or an ``assert``'s message
(``check_labels``); the pointer must equal one, or be a prefix of one of at least 12 characters (case- and
markup-insensitively), and share a content word with the sentence (``content_words``: 4 letters or more, not a stop
word, compared on their first 5 letters), so a pointer to a section's heading, to a label that does not exist or to a
check about something else does not back it; or
(c) the sentence is a cited fact; or
(d) it talks to the learner: a question (ends in ``?``), an instruction (starts with an imperative verb of
``INSTRUCTION_VERBS`` not followed by a verb in the third person: "Set a higher budget" is one, "Recompute frees
blocks" is not; never in a Summary), an exercise's prompt and hint, a *Think about it* question before its model
answer, a learning goal; or a glossary row (a definition: "perplexity: lower is better").
The section rule cannot read whether the check says what the sentence says (the conclusion cells assert that at run
time); it finds prose with no check near it at all. The pointer rule makes a summary or a model answer name the check
itself, so a reader (and a reviewer) can see which assertion backs it, and the shared word catches a pointer copied to
an unrelated sentence.

**Cited facts.** A sentence carrying a parenthesis that starts ``source:`` and names where the fact comes from
(``(source: vLLM's EngineArgs.get_batch_defaults)``, ``(source: NVIDIA H100 datasheet)``), or an author citation in
parentheses (``(Leviathan et al., ICML 2023)``, ``(Kwon et al., SOSP 2023, figure 2)``).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

DIRECTION_WORDS = ("faster", "slower", "higher", "lower", "more", "fewer", "less", "better", "worse", "larger",
                   "smaller", "bigger", "longer", "shorter", "cheaper", "grows", "grow", "growing", "falls",
                   "drops", "rises", "wins", "beats", "increases", "decreases", "shrinks", "outperforms", "twice",
                   "doubles", "halves", "lowers", "raises", "exceeds", "outweighs", "worsens", "improves", "slows",
                   "grew", "fell", "rose", "greater")
DIRECTION_RE = re.compile(r"\b(" + "|".join(DIRECTION_WORDS) + r")\b|(?<![\w.])\d+(?:\.\d+)?[x×](?![\w])", re.I)
# idioms that compare nothing: "no longer has it", "one more read" (a count)
NOT_A_DIRECTION_RE = re.compile(r"\b(no longer|any longer|once more|one more|more or less)\b", re.I)
INSTRUCTION_VERBS = ("predict", "guess", "try", "compare", "change", "set", "run", "re-run", "rerun", "find", "give",
                     "compute", "answer", "look", "watch", "pick", "move", "increase", "decrease", "raise", "lower",
                     "drag", "use", "explain", "measure", "see", "know", "read", "derive", "count", "build", "draw",
                     "estimate", "write", "make", "add", "replace", "choose", "name", "start", "turn", "double",
                     "halve", "vary", "plot", "check", "decide", "sketch", "list", "take", "keep", "say", "tell",
                     "state", "recompute", "simulate", "show", "reproduce", "size", "work", "call", "open", "follow",
                     "fill", "submit", "drop", "shrink", "grow", "remove", "switch", "imagine", "suppose", "assume")
# number words (read as numbers): "one" is left out, it is an article or a pronoun far more often than a count
NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty".split()) if i != 1}
NUMBER_WORDS |= {w: 10 * i for i, w in enumerate("thirty forty fifty sixty seventy eighty ninety".split(), start=3)}
NUMBER_WORDS |= {"dozen": 12}
SCALE_WORDS = {"hundred": 100, "thousand": 1000, "million": 10 ** 6, "billion": 10 ** 9}
_CARDINAL = r"(?:" + "|".join(sorted(NUMBER_WORDS, key=len, reverse=True)) + r")"
_SCALE = r"(?:" + "|".join(SCALE_WORDS) + r")s?"
# a number in words: "three", "forty-eight", "two hundred", "a few hundred thousand", "hundreds of"
NUMBER_PHRASE_RE = re.compile(
    rf"\b(?:(?:a|several|a few|some|many)\s+)?(?:{_CARDINAL}(?:[- ]{_CARDINAL})?|{_SCALE})(?:[- ]{_SCALE})*\b", re.I)
# a ratio in words: "three times", "N-fold", "a third", "two thirds", "half the"
RATIO_WORDS_RE = re.compile(
    rf"\b(?:{_CARDINAL}|one)[- ]?(?:times|fold)\b|\b(?:triple|quadruple)[sd]?\b|"
    rf"\b(?:a|one|{_CARDINAL})[- ](?:half|halves|thirds?|quarters?|fifths?|tenths?)\b|"
    r"\bhalf (?:the|of|as|a|an)\b", re.I)
# digit-free absolutes: a claim about every case, which one run cannot show without a check
ABSOLUTE_WORDS = ("never", "always", "only", "dominates", "dominate", "dominated", "eliminates", "eliminate",
                  "removes", "guarantees", "guaranteed", "impossible", "nothing", "nobody", "none")
ABSOLUTE_RE = re.compile(r"\b(" + "|".join(ABSOLUTE_WORDS) + r")\b", re.I)
# technical phrases where an absolute word names a thing, not a claim ("a prefill-only step", "not only ... but")
NOT_ABSOLUTE_RE = re.compile(r"\b(?:prefill|decode|read|write|append|metadata|cpu|gpu|host)[- ]only\b|-only\b|"
                             r"\bnot only\b|\"[\w-]+\"", re.I)
# a recommendation: what to choose, which one run does not show in general
RECOMMEND_RE = re.compile(r"\b(should|recommend(?:s|ed)?|best|prefer(?:s|red)?|optimal)\b", re.I)
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
    r"pp?\.|issues?|eq\.|equations?|lessons?|labs?)\s*\d+(?:\.\d+)*(?:\s*(?:,|and|or|&|–|-|to)\s*\d+(?:\.\d+)*)*")
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
CODE_MARK = 0xE000  # inline code becomes one private-use character each: no digit, no word, restored for messages


def clean(text: str, codes: list[str] | None = None) -> str:
    """The prose of a markdown cell: code, inline code, math, HTML tags, link targets and the sources line removed."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    codes = [] if codes is None else codes

    def mark(m: re.Match) -> str:
        codes.append(m.group(0))
        return chr(CODE_MARK + len(codes) - 1)

    text = re.sub(r"`[^`]*`", mark, text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$", "MATH", text, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"^\*\*Sources?\*\*:.*$", " ", text, flags=re.M)
    text = re.sub(r"^(\s{0,3}#{1,6}\s+)\d+\s*·", r"\1", text, flags=re.M)  # "# 03 · Title"
    text = re.sub(r"^(\s*)(?:\d+\.|\(\w\)|[a-z]\))\s+", r"\1- ", text, flags=re.M)  # list numbering
    return text


def _restore(sentence: str, codes: list[str]) -> str:
    """The sentence with its inline code back in place of the marks ``clean`` left (for messages)."""
    return re.sub(r"[\ue000-\uf8ff]", lambda m: codes[ord(m.group(0)) - CODE_MARK], sentence)


def sentences(text: str) -> list[str]:
    """Split prose into sentences: headings, list items and table rows are their own; paragraphs split after . ! ?"""
    text = re.sub(r"^(\s{0,3}#{1,6}\s[^\n]*)$", r"\n\1\n", text, flags=re.M)  # a heading is its own block
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\s*[-*|] )", text):
        block = " ".join(block.split())
        if not block:
            continue
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*(\[\"“_\ue000-\uf8ff])", block) if s.strip()]
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
        if re.search(r"[A-Za-z]", left) or left.endswith(("'", "’", "#")) or (left.endswith(".") and len(left) > 1):
            continue  # part of a name (H100, fp8, Llama-3-8B, ch07, PR #17885, ISCA'24) or of a version (v0.4.1)
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


def _words_value(phrase: str) -> float | None:
    """The value of a number in words ("forty-eight" 48, "two hundred" 200, "a dozen" 12); None when it is vague
    ("a few hundred thousand", "hundreds of", "several thousand")."""
    words = re.findall(r"[a-z]+", phrase.lower())
    if words and words[0] in ("several", "few", "some", "many"):
        return None
    if words[:2] == ["a", "few"]:
        return None
    words = [w for w in words if w != "a"]
    if any(w.endswith("s") and w.rstrip("s") in SCALE_WORDS for w in words):
        return None  # "hundreds", "thousands"
    total, current = 0, 0
    for w in words:
        if w in NUMBER_WORDS:
            current += NUMBER_WORDS[w]
        elif w in SCALE_WORDS:
            current = max(current, 1) * SCALE_WORDS[w]
            if SCALE_WORDS[w] >= 1000:
                total, current = total + current, 0
    return float(total + current)


def number_words_in(sentence: str) -> list[tuple[str, str, float | None]]:
    """(kind, token, value) of every number and ratio said in words (see the module docstring): ``("ratio", "three
    times", None)``, ``("number", "forty-eight", 48.0)``, ``("quantity", "a few hundred thousand", None)``."""
    s = CITED_RE.sub(" ", CHECKED_REF_RE.sub(" ", NUMBERING_RE.sub(lambda m: m.group(1), sentence)))
    found = [("ratio", m.group(0), None) for m in RATIO_WORDS_RE.finditer(s)]
    s = RATIO_WORDS_RE.sub(" ", s)
    for m in NUMBER_PHRASE_RE.finditer(s):
        if re.match(r"[\w'’]", s[m.end():m.end() + 1] or " ") or re.search(r"[\w'’-]$", s[:m.start()]):
            continue  # part of a word or a name
        value = _words_value(m.group(0))
        found.append(("number", m.group(0), value) if value is not None else ("quantity", m.group(0), None))
    return found


def claim_words(sentence: str) -> list[tuple[str, str]]:
    """(kind, word) of every claim word of a sentence that needs a check: directions, ratios and vague quantities in
    words, digit-free absolutes and recommendations (pointers and idioms removed first)."""
    plain = CHECKED_REF_RE.sub(" ", sentence)
    out = [("direction", m.group(0)) for m in DIRECTION_RE.finditer(NOT_A_DIRECTION_RE.sub(" ", plain))]
    out += [(kind, token) for kind, token, _ in number_words_in(plain) if kind in ("ratio", "quantity")]
    out += [("absolute", m.group(0)) for m in ABSOLUTE_RE.finditer(NOT_ABSOLUTE_RE.sub(" ", plain))]
    out += [("recommendation", m.group(0)) for m in RECOMMEND_RE.finditer(plain)]
    return out


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
            codes: list[str] = []
            for sentence in sentences(clean(part, codes)):
                shown = _restore(sentence, codes)
                cited = bool(CITED_RE.search(sentence))
                if not cited:
                    for token, value, unit in numbers_in(sentence):
                        if not _matches(value, unit, values):
                            findings.append(Finding(chapter, i, "number", token, shown))
                    for kind, token, value in number_words_in(sentence):
                        if kind == "number" and not _matches(value, "", values):
                            findings.append(Finding(chapter, i, "number", token, shown))
                words = claim_words(sentence)
                advice = any(kind == "recommendation" for kind, _ in words)
                if addressed or cited or sentence.rstrip(" *_)").endswith("?") or (
                        _is_instruction(sentence) and not summary and not advice):
                    continue
                if not words or sec_checked or _ref_checked(sentence, chapter, cells, course):
                    continue
                for kind in dict.fromkeys(k for k, _ in words):
                    findings.append(Finding(chapter, i, kind, ", ".join(w for k, w in words if k == kind), shown))
    return findings


def _ref_checked(sentence: str, chapter: str, cells, course) -> bool:
    """The sentence names, with ``(checked: ...)``, checks that exist and share a word with it (``;`` between
    several)."""
    refs = [part.strip() for m in CHECKED_REF_RE.finditer(sentence) for part in m.group(1).split(";")]
    said = content_words(CHECKED_REF_RE.sub(" ", sentence))
    return bool(refs) and all(_label_found(ref, said, cells, course) for ref in refs)


STOP_WORDS = set("""the this that these those with from into than then when what which while where there their them
they have has had been being were will would could does done more less over under each every only also just very
such same other about after before between both most much many some same your here""".split())


def content_words(text: str) -> set[str]:
    """The words of ``text`` that carry meaning, each without a plural ``s`` and cut to its first 5 letters (so
    "preempted" meets "preemption", "steps" meets "step"): 4 letters or more, not a stop word."""
    words = re.findall(r"[a-z0-9]+", _restore_plain(text).lower())
    words = [w[:-1] if w.endswith("s") and len(w) > 4 else w for w in words]
    return {w[:5] for w in words if len(w) >= 4 and w not in STOP_WORDS}


def _restore_plain(text: str) -> str:
    return re.sub(r"[\ue000-\uf8ff]", " ", text)


def check_labels(cells) -> list[str]:
    """The label of every check of a chapter's code cells: the statement of ``claim(statement, ...)``, of each
    ``(statement, holds)`` pair given to ``conclude``, the name of ``check*(name, ...)``, an ``assert``'s message."""
    labels = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse("\n".join("" if ln.lstrip().startswith(("%", "!")) else ln
                                       for ln in _src(cell).splitlines()))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert) and node.msg is not None:
                labels.append(_text_of(node.msg))
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
                continue
            if node.func.id in ("claim", "check", "check_close", "check_function"):
                labels.append(_text_of(node.args[0]))
            elif node.func.id == "conclude" and len(node.args) > 1 and isinstance(node.args[1], ast.List | ast.Tuple):
                labels += [_text_of(pair.elts[0]) for pair in node.args[1].elts if isinstance(pair, ast.Tuple)]
    return [label for label in labels if label]


def _text_of(node) -> str:
    """A string literal's text; an f-string's literal parts (its fields left out)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else " " for v in node.values)
    return ""


def _label_found(ref: str, said: set[str], cells, course) -> bool:
    """``ref`` (``label`` or ``chNN · label``) is a check's label in that chapter (equal, or a prefix of at least
    12 characters, case- and markup-insensitively) and shares a content word with the sentence that points to it."""
    m = re.match(r"ch(\d\d)\s*·\s*(.+)$", ref)
    other, label = (m.group(1), m.group(2)) if m else (None, ref)
    target = cells if other is None else (course or {}).get(other)
    if target is None:
        return False
    want = _norm_title(label)
    found = [name for name in map(_norm_title, check_labels(target))
             if name == want or (len(want) >= 12 and name.startswith(want))]
    return bool(found) and bool(content_words(label) & said)

"""README.md stays a front page and the manual under docs/ stays connected and true: the README fits on a screen
with the virtualenv step before the install, its sentences are short, every relative link in README.md and
docs/ reaches a file (and a heading, when it names one), no page speaks the authors' language (issue numbers,
paths from their machines), the figures copied into docs/ are the benchmarks' own, and the output shown under
each ``python3 -m minengine`` command is what that command prints."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import unicodedata
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
FIRST_SCREEN = 40
MAX_README_LINES = 200
MAX_SENTENCE_WORDS = 40
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks, tables and HTML comments."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    out, in_fence = [], False
    for line in text.split("\n"):
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if not in_fence and not line.lstrip().startswith("|"):
            out.append(line)
    return "\n".join(out)


def _slug(heading: str) -> str:
    """Python-Markdown's toc anchor of a heading (what mkdocs and the links use): code marks and punctuation
    dropped, lower case, spaces to hyphens."""
    text = unicodedata.normalize("NFKD", re.sub(r"[`*]", "", heading)).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[\s-]+", "-", text)


def _anchors(page: Path) -> set[str]:
    heads = re.findall(r"^#{1,6} (.+?)\s*$", _prose_keep_headings(page.read_text()), re.M)
    return {_slug(h) for h in heads}


def _prose_keep_headings(text: str) -> str:
    out, in_fence = [], False
    for line in text.split("\n"):
        if FENCE.match(line.strip()):
            in_fence = not in_fence
        elif not in_fence:
            out.append(line)
    return "\n".join(out)


def test_readme_fits_on_a_screen_with_the_virtualenv_first():
    lines = README.read_text().split("\n")
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines, at most {MAX_README_LINES}"
    first = "\n".join(lines[:FIRST_SCREEN])
    venv, setup = first.find("python3 -m venv"), first.find("scripts/setup.sh")
    assert 0 <= venv < setup, "the first screen must make the virtualenv before scripts/setup.sh installs"
    assert re.search(r"about \d+ GB", first) and "a few minutes" in first, "the install's size and time"
    assert re.search(r"!\[[^\]]*\]\(docs/[^)]+\.png\)", first), "one picture on the first screen"
    for door in ("docs/reading_order.md", "docs/dashboard.md", "jupyter lab notebooks/"):
        assert door in first, f"the first screen's doors: {door} missing"


def test_the_readme_size_claim_is_the_environment_it_installs():
    """The "about N GB" of README.md and docs/install.md is the installed site-packages of this environment."""
    import site

    claims = {int(n) for page in (README, DOCS / "install.md") for n in re.findall(r"about (\d+) GB", page.read_text())}
    assert len(claims) == 1, f"README.md and docs/install.md state different sizes: {claims}"
    (claimed,) = claims
    roots = [Path(p) for p in site.getsitepackages() if Path(p, "torch").is_dir()]
    if not roots:
        pytest.skip("torch is not installed in a site-packages of this Python")
    size_gb = sum(f.stat().st_size for f in roots[0].rglob("*") if f.is_file() and not f.is_symlink()) / 1e9
    assert abs(size_gb - claimed) <= 1.0, f"site-packages is {size_gb:.1f} GB, the README says about {claimed} GB"


def test_readme_sentences_are_short():
    prose = _prose(README.read_text())
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # a link's target is not a word the reader reads
    sentences = re.split(r"(?<=[.!?:;])\s+|\n\s*\n|\n\s*[-*] ", prose)
    long = [s for s in sentences if len(s.split()) > MAX_SENTENCE_WORDS]
    assert not long, f"sentences over {MAX_SENTENCE_WORDS} words: {long}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    for target in LINK.findall(_prose_keep_headings(page.read_text())):
        if re.match(r"[a-z]+:", target) or target.startswith("//"):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.relative_to(ROOT)}: link to {target} reaches no file"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.relative_to(ROOT)}: no heading #{anchor} in {path or page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_speaks_the_authors_language(page):
    text = " ".join(page.read_text().split())  # a phrase broken over two lines is still found
    for pattern in (r"\bissues? \d+", r"/work/", r"/tmp/", r"GPU was lent", r"\bthis session\b", r"\bthis branch\b",
                    r"this project's"):
        found = re.search(pattern, text, re.I)
        assert not found, f"{page.relative_to(ROOT)}: {found.group(0)!r} (project history or a machine's path)"


def test_docs_figures_are_the_benchmarks_own():
    """docs/img/ holds copies (the site serves only docs/): each equals the file its benchmark writes."""
    for name in ("cost_model_validation.png", "host_overhead.png"):
        assert (DOCS / "img" / name).read_bytes() == (ROOT / "benchmarks" / "results" / name).read_bytes(), (
            f"docs/img/{name} differs from benchmarks/results/{name}: copy it again")


def _shown_commands(page: Path) -> list[tuple[str, list[str]]]:
    """Each ```bash block holding one ``python3 -m minengine`` command followed at once by a ```text block:
    (the command without its comment, the shown lines)."""
    blocks = re.findall(r"```bash\n(python3 -m minengine [^\n]*)\n```\n```text\n(.*?)```", page.read_text(), re.S)
    return [(cmd.split("  #")[0].strip(), shown.rstrip("\n").split("\n")) for cmd, shown in blocks]


@cache
def _stdout_of(command: str) -> str:
    args = shlex.split(command)
    assert args[:3] == ["python3", "-m", "minengine"]
    with tempfile.TemporaryDirectory() as no_data:  # what a fresh clone sees: no shared/data beside it
        env = {**os.environ, "MINENGINE_DATA": no_data}
        done = subprocess.run([sys.executable, *args[1:]], capture_output=True, text=True, timeout=600, cwd=ROOT,
                              env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _matches_in_order(shown: list[str], printed: list[str]) -> str | None:
    """None when every shown line matches a printed line, in order ("..." alone skips lines; "..." inside a line
    stands for any text). Otherwise the first shown line that matched nothing."""
    i = 0
    for line in shown:
        if line.strip() == "...":
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in line.rstrip().split("...")))
        while i < len(printed) and not pattern.fullmatch(printed[i].rstrip()):
            i += 1
        if i == len(printed):
            return line
        i += 1
    return None


SHOWN = [(page, cmd, shown) for page in (README, DOCS / "quickstart.md") for cmd, shown in _shown_commands(page)]


def test_the_pages_show_output_for_run_generate_and_bench_serve():
    for page in (README, DOCS / "quickstart.md"):
        shown = {cmd.split()[3] for cmd, _ in _shown_commands(page)}
        assert {"run", "generate", "bench-serve"} <= shown, f"{page.name} shows output for {sorted(shown)} only"


@pytest.mark.parametrize("page, command, shown", SHOWN, ids=[f"{p.name}:{c.split()[3]}" for p, c, _ in SHOWN])
def test_shown_output_is_what_the_command_prints(page, command, shown, bundled_model):
    """Greedy text, counts and modelled-clock latencies are the same on every machine, so they are shown as is;
    measured times are cut to "..."."""
    printed = _stdout_of(command).split("\n")
    missing = _matches_in_order(shown, printed)
    assert missing is None, f"{page.name}: `{command}` printed no line {missing!r} (in order); it printed:\n" + (
        "\n".join(printed[:60]))


def test_the_matcher_can_fail():
    printed = ["model: /x/tiny  (3 parameters)", "", "a", "b", "Mean TTFT (ms):   11.46"]
    assert _matches_in_order(["model: .../tiny  (3 parameters)", "...", "Mean TTFT (ms):   11.46"], printed) is None
    assert _matches_in_order(["Mean TTFT (ms):   11.47"], printed) == "Mean TTFT (ms):   11.47"
    assert _matches_in_order(["b", "a"], printed) == "a"  # order matters


def test_the_readme_course_table_is_the_notebooks():
    """The README's course table has one row per notebook, numbered as they are, and its count in words."""
    text = README.read_text()
    numbers = sorted(int(n) for n in re.findall(r"(?:^|\| )(\d\d) \|", text, re.M))
    on_disk = sorted(int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert numbers == on_disk
    words = {10: "ten", 11: "eleven", 12: "twelve", 13: "thirteen", 14: "fourteen", 15: "fifteen", 16: "sixteen",
             17: "seventeen", 18: "eighteen"}
    assert f"{words[len(on_disk)]}-chapter" in text


def test_the_readme_preset_lines_are_the_presets():
    """Preset (a)'s line names the textbook case the preset builds: its long prompt and decoding requests."""
    import inspect

    from minengine.viz import presets

    decoding = inspect.signature(presets.textbook_long_prompt).parameters["num_decoding"].default
    line = next(line for line in README.read_text().split("\n") if line.strip().startswith("- (a)"))
    assert f"{presets.TEXTBOOK_LONG_PROMPT:,}-token prompt among {decoding} decodes" in line
    assert [ln.strip()[3] for ln in README.read_text().split("\n") if re.match(r"\s+- \([a-z]\)", ln)] == list(
        presets.PRESETS)


def test_anchor_slugs_are_python_markdowns():
    """The anchors the link check computes are the ones the docs site (Python-Markdown's toc) gives the headings."""
    toc = pytest.importorskip("markdown.extensions.toc")
    for page in PAGES:
        for heading in re.findall(r"^#{1,6} (.+?)\s*$", _prose_keep_headings(page.read_text()), re.M):
            assert _slug(heading) == toc.slugify(heading.replace("`", ""), "-"), (page.name, heading)

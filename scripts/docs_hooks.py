"""mkdocs hooks (mkdocs.yml ``hooks:``): keep the notebook pages offline.

mkdocs-jupyter renders a notebook with nbconvert's JupyterLab template, which writes two loaders that point at a
CDN: MathJax's (a ``<script src>`` fetched on every page) and Mermaid's (imported when a page has a diagram). The
course has neither math nor diagrams, so both are taken out of the page, and no page can ask the network for them.
A page with plotly figures (blocks written by scripts/build_docs.py that call ``Plotly.newPlot``) gets the site's
own plotly.js, loaded before its first figure; the other pages do not load it. mkdocs learns each notebook
page's ids, so that a link to a missing section of a chapter is a warning (an error with ``--strict``).
"""

from __future__ import annotations

import html as html_lib
import re

from markdown.extensions.toc import slugify
from mkdocs.utils import get_relative_url

PLOTLY_JS = "assets/plotly.min.js"  # where scripts/build_docs.py stages plotly.js
ID_RE = re.compile(r"""\sid=["']([^"']+)["']""")
FIGURE_MARK = '<div class="minengine-figure">'
MATHJAX_RE = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)
HEADING_RE = re.compile(r"<(h[1-6])((?:\s[^>]*)?)>(.*?)</\1>", re.S)
TAG_RE = re.compile(r"<[^>]+>")
CODE_RE = re.compile(r"<code[^>]*>.*?</code>", re.S)
MERMAID_RE = re.compile(r"<script type=\"module\">(?:(?!</script>).)*?mermaid(?:(?!</script>).)*?</script>", re.S)


def offline_notebook_html(html: str, plotly_src: str) -> str:
    """A notebook page's HTML without the CDN loaders, with ``<script src=plotly_src>`` before its first figure.

    Raises:
        ValueError: a ``cdnjs`` URL left in the page (nbconvert's template changed: update the patterns above).
    """
    html = MERMAID_RE.sub("", MATHJAX_RE.sub("", html))
    if "cdnjs.cloudflare.com" in html:
        raise ValueError("a notebook page still loads from cdnjs.cloudflare.com: nbconvert's template changed")
    if FIGURE_MARK in html:
        at = html.index(FIGURE_MARK)
        html = f'{html[:at]}<script src="{plotly_src}"></script>{html[at:]}'
    return html


def on_page_content(html, page, config, files):  # noqa: ARG001  (mkdocs passes every argument by name)
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    html = offline_notebook_html(html, get_relative_url(PLOTLY_JS, page.file.url))
    # mkdocs checks a link's #anchor against the ids its own markdown rendering found; a notebook page is rendered
    # by mkdocs-jupyter, so hand mkdocs the page's ids (else a link to a missing section of a chapter passes).
    html = ids_for_toc_headings(html, page.toc)
    page.present_anchor_ids = set(ID_RE.findall(html))
    return html


def _toc_items(toc):
    for item in toc or ():
        yield item
        yield from _toc_items(item.children)


def ids_for_toc_headings(html: str, toc) -> str:
    """Give each heading the page's table of contents links to the id the link names, where the page lacks it:
    mkdocs-jupyter titles a heading without its inline code ("The official `openai` client" is "The official
    client", #the-official-client) while nbconvert's id keeps it, and a heading a code cell printed has no id."""
    present = set(ID_RE.findall(html))
    wanted = {slugify(item.title, "-"): item.id for item in _toc_items(toc) if item.id not in present}
    if not wanted:
        return html

    def add_id(match: re.Match) -> str:
        tag, attrs, inner = match.groups()
        text = html_lib.unescape(TAG_RE.sub("", CODE_RE.sub("", inner))).replace("\u00b6", "").strip()
        anchor = wanted.pop(slugify(text, "-"), None)
        if anchor is None:
            return match.group(0)
        if ID_RE.search(attrs):  # keep nbconvert's id; the table of contents' id goes on an anchor inside
            return f'<{tag}{attrs}><span id="{anchor}"></span>{inner}</{tag}>'
        return f'<{tag}{attrs} id="{anchor}">{inner}</{tag}>'

    return HEADING_RE.sub(add_id, html)

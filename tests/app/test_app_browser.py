"""The dashboard in a real browser: ``streamlit run app.py`` on a free localhost port (with the repository's
``.streamlit/config.toml``), loaded in headless Debian Chromium driven by Playwright.

Checked, as a new user would see it: pressing Run shows the run live (the step counter grows by itself, pause
holds it, resume moves it on), Finish now brings the finished run's tabs; then every tab, in English and in
中文, is screenshotted and checked: no two text labels of a figure overlap (stall labels, percentile labels,
subplot titles, titles), no metric value is cut off, no exception or error box. The Streamlit server holds no
inotify watch (a ``.venv`` inside the checkout once made it print thousands of "Inotify queue overflowed").

Screenshots go to ``$MINENGINE_SCREENSHOTS`` (default /tmp/minengine_screens): ``live_<lang>.png``,
``tab<i>_<name>_<lang>.png`` for a human to look at.

Skips when Playwright or /usr/bin/chromium is missing (``playwright install`` needs the network; Debian's
``chromium`` package is used through ``executable_path`` instead).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minengine.workloads import azure_conv_path, find_data_dir
from scripts.live_server_screenshot import CHROMIUM, CHROMIUM_ARGS, free_port, wait_http
from tests.dashboard_model import dashboard_model

REPO = Path(__file__).resolve().parents[2]
SCREENS = Path(os.environ.get("MINENGINE_SCREENSHOTS", "/tmp/minengine_screens"))
TAB_NAMES = ("blocks", "batch", "tbt", "metrics", "ab")
FIGURES_PER_TAB = {"blocks": 3, "batch": 1, "tbt": 2, "metrics": 3, "ab": 6}
TAB_LABELS_EN = ["Block tables", "Batch composition", "TBT timeline", "Metrics", "A/B comparison"]

sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("streamlit")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} missing: apt-get install -y chromium", allow_module_level=True)

# Every text box of every plotly figure on the page, grouped by figure: annotations (stall labels, percentile
# labels, subplot titles, the threshold label), the title and its subtitle, the axis titles and the legend. Hidden
# figures (other tabs) are left out: they have no layout box.
_TEXT_BOXES_JS = """
() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p.offsetParent !== null).map(p => {
  const boxes = [];
  for (const el of p.querySelectorAll('g.annotation .annotation-text-g, .gtitle, .gtitle-subtitle, .xtitle, .ytitle, '
                                      + 'g.legend')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.height > 0) boxes.push({text: el.textContent, x0: r.left, y0: r.top, x1: r.right,
                                                 y1: r.bottom});
  }
  const title = p.querySelector('.gtitle');
  return {title: title ? title.textContent : '', boxes: boxes};
})
"""

# Metric values whose text does not fit their box (Streamlit cuts them with an ellipsis).
_CUT_METRICS_JS = """
() => Array.from(document.querySelectorAll('[data-testid="stMetricValue"]')).filter(m => m.offsetParent !== null)
  .filter(m => [m, ...m.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth + 1))
  .map(m => m.textContent)
"""


# Legends that do not fit their figure: plotly then draws a scroll bar in the legend (entries below the fold).
_CUT_LEGENDS_JS = """
() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p.offsetParent !== null)
  .filter(p => Array.from(p.querySelectorAll('g.legend rect.scrollbar'))
                    .some(r => +(r.getAttribute('height') || 0) > 0 && +(r.getAttribute('width') || 0) > 0))
  .map(p => (p.querySelector('.gtitle') || {}).textContent || '?')
"""

# Figure titles and subtitles that run past their figure's right edge (plotly draws them unclipped by the SVG's
# box but the page cuts them): the A/B tab's half-width figures at a 1,280 px wide window.
_CUT_TITLES_JS = """
() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p.offsetParent !== null).flatMap(p => {
  const box = p.getBoundingClientRect();
  return Array.from(p.querySelectorAll('.gtitle, .gtitle-subtitle')).filter(el => {
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.right > box.right + 1;
  }).map(el => el.textContent);
})
"""

# Text cut off in the sidebar's select boxes (the chosen value) and in an open dropdown's options.
_CUT_SELECT_JS = """
() => Array.from(document.querySelectorAll(
        '[data-testid="stSidebar"] [data-testid="stSelectbox"] [data-baseweb="select"] div, [role="option"], '
        + '[role="option"] *'))
  .filter(e => e.offsetParent !== null && e.children.length === 0 && e.textContent.trim())
  .filter(e => e.scrollWidth > e.clientWidth + 1)
  .map(e => e.textContent)
"""


def inotify_watches(pid: int) -> int:
    """Inotify watches held by process ``pid`` (one ``inotify wd:`` line per watch in its fdinfo)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if "inotify" in os.readlink(fd):
                count += (Path(f"/proc/{pid}/fdinfo") / fd.name).read_text().count("inotify wd:")
        except OSError:
            continue
    return count


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = dashboard_model()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONPATH=str(REPO))
    if model is not None:
        env["MINENGINE_MODEL"] = model
    port = free_port()
    log_path = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    log = open(log_path, "w")
    # No flags: the repository's .streamlit/config.toml (headless, no usage stats, file watcher) is under test.
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(REPO / "app.py"), "--server.port", str(port),
         "--server.address", "127.0.0.1"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/_stcore/health", proc, timeout_s=90)
        yield url, proc, log_path
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # our own process group only (start_new_session above)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def overlaps(figures: list[dict]) -> list[str]:
    """Pairs of text boxes that intersect (by more than 1 px each way), named by figure and text."""
    found = []
    for fig in figures:
        boxes = fig["boxes"]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                wide = min(a["x1"], b["x1"]) - max(a["x0"], b["x0"])
                high = min(a["y1"], b["y1"]) - max(a["y0"], b["y0"])
                if wide > 1 and high > 1:
                    found.append(f"{fig['title']!r}: {a['text']!r} overlaps {b['text']!r}")
    return found


def settled(page, script: str, tries: int = 4) -> list:
    """``script``'s findings (overlapping labels, cut-off values) once they persist: a figure caught in the middle
    of a re-layout (a busy machine) may overlap for a frame; a real defect stays. Empty when any try is clean."""
    found = page.evaluate(script)
    for _ in range(tries - 1):
        if not found:
            return []
        page.wait_for_timeout(700)
        found = page.evaluate(script)
    return found


def overlapping_labels(page) -> list[str]:
    found = []
    for _ in range(4):
        found = overlaps(page.evaluate(_TEXT_BOXES_JS))
        if not found:
            return []
        page.wait_for_timeout(700)
    return found


def live_status(page):
    return page.locator("[data-testid='stMarkdownContainer']", has_text=re.compile(r"^Live, (running|paused):"))


def live_step(page) -> int:
    text = live_status(page).first.text_content(timeout=60_000)
    return int(re.search(r"step (\d+)", text).group(1))


def paused_step(page) -> int:
    """The step the paused page shows, read once the rerun has replaced every older status line (on a loaded
    machine a stale 'running' line from the fragment can sit beside the new 'paused' one for a while)."""
    sync_api.expect(live_status(page)).to_have_count(1, timeout=60_000)
    text = page.locator("[data-testid='stMarkdownContainer']", has_text=re.compile(r"^Live, paused:")).first
    return int(re.search(r"step (\d+)", text.text_content(timeout=60_000)).group(1))


def wait_past(page, step: int) -> None:
    """Until the live status shows a step after ``step`` (the page updates by itself)."""
    page.wait_for_function("""(s) => { const m = document.body.innerText.match(/Live, running: step (\\d+)/);
                                       return m && +m[1] > s; }""", arg=step, timeout=60_000)


def check_page(page, where: str) -> None:
    assert page.locator("[data-testid='stException']").count() == 0, where
    assert page.locator("[data-testid='stAlertContentError']").count() == 0, where


def wait_for_figures(page, count: int | None = None) -> None:
    """Until ``count`` (default: at least one) plotly figures are visible and every one has drawn its title,
    then a moment for plotly's last layout pass."""
    page.wait_for_function("""(n) => {
        const plots = Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p.offsetParent !== null);
        return (n === null ? plots.length > 0 : plots.length === n) && plots.every(p => p.querySelector('.gtitle'));
    }""", arg=count, timeout=120_000)
    page.wait_for_timeout(800)


def check_tabs(page, lang: str, tab_labels: list[str]) -> dict:
    """Open each tab, screenshot it, check labels and metric values; returns what was seen per tab."""
    seen = {}
    page.set_viewport_size({"width": 1600, "height": 4200})  # tall: Streamlit scrolls inside, so no full_page
    for i, (name, label) in enumerate(zip(TAB_NAMES, tab_labels)):
        page.get_by_role("tab", name=label).click()
        if name == "ab":  # the A/B tab runs the other configuration first
            page.locator("[data-testid='stMarkdownContainer']", has_text="P99 TBT").first.wait_for(timeout=240_000)
        wait_for_figures(page, FIGURES_PER_TAB[name])
        if lang == "zh":  # every figure redrawn in Chinese
            page.wait_for_function("""() => Array.from(document.querySelectorAll('.js-plotly-plot'))
                .filter(p => p.offsetParent !== null)
                .every(p => /[\u4e00-\u9fff]/.test(p.querySelector('.gtitle').textContent))""", timeout=60_000)
        check_page(page, f"{lang} tab {name}")
        shot = SCREENS / f"tab{i}_{name}_{lang}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        figures = page.evaluate(_TEXT_BOXES_JS)
        assert figures, f"{lang} tab {name}: no figure drawn"
        bad = overlapping_labels(page)
        assert not bad, f"{lang} tab {name}: {bad}"
        cut = settled(page, _CUT_METRICS_JS)
        assert not cut, f"{lang} tab {name}: metric values cut off: {cut}"
        cut = settled(page, _CUT_LEGENDS_JS)
        assert not cut, f"{lang} tab {name}: legends cut off (scrolling): {cut}"
        seen[name] = figures
    return seen


def idle(page) -> None:
    """Until the page has stopped running (Streamlit's status widget gone)."""
    page.wait_for_timeout(300)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=240_000)


def choose_preset(page, label: str) -> None:
    """Pick a preset in the sidebar's dropdown (checking, while it is open, that no option's name is cut)."""
    for _ in range(3):  # a click during a rerun may land on a select box about to be redrawn: open it again
        idle(page)
        page.locator("[data-testid='stSidebar'] [data-testid='stSelectbox']").first.click()
        try:
            page.get_by_role("option", name=label).wait_for(timeout=10_000)
            break
        except sync_api.TimeoutError:
            page.keyboard.press("Escape")
    cut = page.evaluate(_CUT_SELECT_JS)
    assert not cut, f"preset names cut off in the dropdown: {cut}"
    page.get_by_role("option", name=label).click()
    page.get_by_role("button", name="Run", exact=True).wait_for(timeout=60_000)
    page.wait_for_timeout(800)


def run_to_the_end(page, tab: str = "Block tables") -> None:
    """Run, Finish now, and wait for this run's tabs (not the previous run's, still on screen during the live view)."""
    page.get_by_role("button", name="Run", exact=True).click()
    finish = page.get_by_role("button", name="Finish now")
    finish.click(timeout=120_000)
    finish.wait_for(state="detached", timeout=240_000)
    idle(page)
    # one set of tabs: during the rerun the previous run's tabs can stay on screen beside the new ones
    sync_api.expect(page.get_by_role("tab", name=tab)).to_have_count(1, timeout=240_000)


def ab_tab(page) -> str:
    """Open the A/B tab; its latency sentence once both runs are drawn."""
    page.get_by_role("tab", name="A/B comparison").click()
    sentence = page.locator("[data-testid='stMarkdownContainer']", has_text="P99 TBT").first
    sentence.wait_for(timeout=240_000)
    wait_for_figures(page, FIGURES_PER_TAB["ab"])
    return sentence.text_content()


def test_dashboard_live_run_and_every_tab_in_both_languages(server):
    url, proc, log_path = server
    SCREENS.mkdir(parents=True, exist_ok=True)
    page_errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            run = page.get_by_role("button", name="Run", exact=True)
            run.wait_for(state="visible", timeout=90_000)
            cut = page.evaluate(_CUT_SELECT_JS)
            assert not cut, f"sidebar choices cut off: {cut}"
            # 1 step/s, so that pausing surely happens mid-run however fast this machine is
            speed = page.locator("[data-testid='stSlider']", has_text="Speed while it runs").get_by_role("slider")
            speed.focus()
            speed.press("Home")
            sync_api.expect(speed).to_have_attribute("aria-valuetext", "1", timeout=30_000)
            page.wait_for_timeout(1000)  # the value reaches the server
            run.click()

            # live: the counter moves with no input from us, pause holds it, resume moves it on
            first = live_step(page)
            # while a session is open (its watchers close with it): no inotify watch at all. Streamlit's default
            # watcher held one per folder of the checkout, .venv included (2,032 with a 2,000-folder .venv)
            assert inotify_watches(proc.pid) == 0
            wait_past(page, first)
            page.locator(".js-plotly-plot .gtitle", has_text="KV block pool at step").first.wait_for(timeout=30_000)
            page.get_by_role("button", name=re.compile("Pause")).click()
            page.locator("[data-testid='stMarkdownContainer']", has_text="Live, paused:").first.wait_for(
                timeout=60_000)
            held = live_step(page)
            page.set_viewport_size({"width": 1600, "height": 2000})
            wait_for_figures(page)
            page.screenshot(path=str(SCREENS / "live_en.png"), full_page=True)
            assert not overlapping_labels(page)
            check_page(page, "live")
            page.wait_for_timeout(1500)
            assert paused_step(page) == held, "the run moved while paused"
            page.get_by_role("button", name=re.compile("Resume")).click()
            wait_past(page, held)
            page.get_by_role("button", name="Finish now").click()

            page.get_by_role("tab", name="Block tables").wait_for(timeout=240_000)
            en = check_tabs(page, "en", TAB_LABELS_EN)
            # what the scheduler decided, in words, under the batch figure
            page.get_by_role("tab", name="Batch composition").click()
            story = page.locator("[data-testid='stMarkdownContainer']", has_text="step 0: ").first
            sync_api.expect(story).to_be_visible(timeout=30_000)
            assert re.search(r"step \d+: 10 decodes \+ a [\d,]+-token chunk of r10", story.text_content())
            # the metric cards: one number each, every one readable
            page.get_by_role("tab", name="Metrics").click()
            values = page.locator("[data-testid='stMetricValue']").all_text_contents()
            assert len(values) == 13 and all(re.search(r"\d", v) for v in values), values

            page.get_by_text("中文", exact=True).click()
            page.get_by_role("tab", name="块表").wait_for(timeout=60_000)
            sync_api.expect(page.locator(".js-plotly-plot .gtitle", has_text="KV block pool")).to_have_count(
                0, timeout=60_000)
            zh = check_tabs(page, "zh", ["块表", "批次组成", "TBT 时间线", "指标", "A/B 对比"])
            # the live view in Chinese too (still 1 step/s: the speed survives the language switch)
            page.set_viewport_size({"width": 1600, "height": 2000})
            page.get_by_role("button", name="运行", exact=True).click()
            page.locator("[data-testid='stMarkdownContainer']", has_text="实时，运行中").first.wait_for(timeout=60_000)
            page.locator(".js-plotly-plot .gtitle", has_text="KV 块池").first.wait_for(timeout=30_000)
            wait_for_figures(page)
            page.screenshot(path=str(SCREENS / "live_zh.png"), full_page=True)
            check_page(page, "live zh")
            assert not overlapping_labels(page)
            page.get_by_role("button", name="立即完成").click()
            page.get_by_role("tab", name="块表").wait_for(timeout=240_000)
        finally:
            browser.close()
    # the same figures in both languages, and every Chinese figure title in Chinese
    for name in TAB_NAMES:
        assert len(en[name]) == len(zh[name]), (name, [f["title"] for f in en[name]], [f["title"] for f in zh[name]])
        assert all(re.search(r"[\u4e00-\u9fff]", f["title"]) for f in zh[name] if f["title"]), (
            name, [f["title"] for f in zh[name]])
    # the A/B tab's run without chunked prefill stalls: its ITL figure labels those stalls, and only a few
    ab_labels = [b["text"] for f in en["ab"] for b in f["boxes"] if re.match(r"^[①-⑩]", b["text"])]
    assert 1 <= len(ab_labels) <= 2 * 3, ab_labels
    assert not page_errors, page_errors
    log = log_path.read_text()
    assert "Inotify queue overflowed" not in log and "Traceback" not in log, log[-2000:]


# What each preset's A/B tab opens on, and what its batch tab must show.
PRESETS = {  # label in the dropdown: (A/B sentence start, extra figure in the batch tab, text on the page)
    "(b) shared system prompt": ("With A: prefix caching on instead of B: prefix caching off", 0, None),
    "(c) memory pressure": ("With A: preempt by recompute instead of B: preempt by swap", 0,
                            "preempted (no free block"),
    "(d) Azure trace replay": ("With A: 16 sequence slots instead of B: 4 sequence slots", 0, "arrivals 128× faster"),
    "(e) custom": ("With A: token budget 256 instead of B: token budget 64", 0, None),
    "(f) speculative decoding": ("With A: 4 speculative tokens instead of B: no speculation", 1, "proposals"),
}


def test_every_preset_opens_its_own_lesson(server):
    """Presets (b)-(f) in English: the A/B tab opens on the preset's own comparison (its sentence), the batch tab
    has its figures (preset (f): the zoomed decode view, whose legend names accepted and rejected proposals), no
    label overlaps and no legend is cut (preset (d): 40 requests) in the batch and A/B tabs, and at a 1,280 px
    wide window no A/B figure's title runs past its figure."""
    url, _, log_path = server
    SCREENS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 3000})
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            page.get_by_role("button", name="Run", exact=True).wait_for(timeout=90_000)
            # (d) replays the Azure trace of ../shared/data: without it Run is disabled and the page says where the
            # file goes (test_app.py's test_trace_preset_without_the_file)
            has_trace = azure_conv_path(find_data_dir()) is not None
            for label, (sentence, extra, text) in PRESETS.items():
                if label.startswith("(d)") and not has_trace:
                    continue
                letter = label[1]
                choose_preset(page, label)
                run_to_the_end(page)
                page.get_by_role("tab", name="Batch composition").click()
                wait_for_figures(page, FIGURES_PER_TAB["batch"] + extra)
                check_page(page, f"({letter}) batch")
                if text is not None:
                    sync_api.expect(page.get_by_text(text).first).to_be_attached(timeout=30_000)
                if extra:
                    legend = page.locator(".js-plotly-plot", has_text="Decodes per step, zoomed").locator(".legendtext")
                    names = legend.all_text_contents()
                    assert "accepted proposals (dotted)" in names and "rejected proposals (crossed)" in names, names
                assert not overlapping_labels(page), letter
                assert not settled(page, _CUT_LEGENDS_JS), f"({letter}) batch: a legend is cut"
                page.screenshot(path=str(SCREENS / f"preset_{letter}_batch.png"), full_page=True)
                assert ab_tab(page).startswith(sentence), letter
                check_page(page, f"({letter}) A/B")
                assert not overlapping_labels(page), letter
                assert not settled(page, _CUT_LEGENDS_JS), f"({letter}) A/B: a legend is cut"
                page.set_viewport_size({"width": 1280, "height": 3000})  # a laptop window: two figures a row
                page.wait_for_timeout(1000)
                assert not settled(page, _CUT_TITLES_JS), f"({letter}) A/B at 1280 px: titles cut"
                page.set_viewport_size({"width": 1600, "height": 3000})
                page.screenshot(path=str(SCREENS / f"preset_{letter}_ab.png"), full_page=True)
        finally:
            browser.close()
    assert "Traceback" not in log_path.read_text()


def test_measured_clock_labels_and_fresh_ab_runs(server):
    """Preset (a) on measured CPU time: no two labels overlap in any tab (the A/B pair's stall labels did), and the
    A/B tab says both runs ran just now, in this session."""
    url, _, _ = server
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            page.get_by_role("button", name="Run", exact=True).wait_for(timeout=90_000)
            page.get_by_text("measured CPU time (this machine)").click()
            page.wait_for_timeout(1000)
            run_to_the_end(page)
            check_tabs(page, "cpu", TAB_LABELS_EN)
            sync_api.expect(page.get_by_text("both run just now").first).to_be_visible(timeout=30_000)
        finally:
            browser.close()


def test_the_page_says_when_the_kernel_fell_back(tmp_path):
    """A dashboard whose CPU attention kernel cannot be built (its cache is under a file, so the build fails): the
    live view and the finished run say the torch attention path runs, and why."""
    model = dashboard_model()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), MINENGINE_KERNEL_CACHE="/dev/null/kernels")
    if model is not None:
        env["MINENGINE_MODEL"] = model
    port = free_port()
    with open(tmp_path / "streamlit.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(REPO / "app.py"), "--server.port",
                                 str(port), "--server.address", "127.0.0.1"], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_http(f"http://127.0.0.1:{port}/_stcore/health", proc, timeout_s=90)
            with sync_api.sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                try:
                    page = browser.new_page(viewport={"width": 1600, "height": 1200})
                    page.goto(f"http://127.0.0.1:{port}", wait_until="domcontentloaded", timeout=60_000)
                    page.get_by_role("button", name="Run", exact=True).wait_for(timeout=90_000)
                    choose_preset(page, "(c) memory pressure")
                    page.get_by_role("button", name="Run", exact=True).click()
                    note = page.get_by_text("The CPU attention kernel is unavailable, so the torch attention path runs")
                    sync_api.expect(note.first).to_be_visible(timeout=120_000)  # in the live view
                    page.get_by_role("button", name="Finish now").click(timeout=60_000)
                    idle(page)
                    sync_api.expect(page.get_by_role("tab", name="Block tables")).to_have_count(1, timeout=240_000)
                    sync_api.expect(note.first).to_be_visible(timeout=30_000)  # and after the run
                    check_page(page, "kernel fallback")
                finally:
                    browser.close()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

"""app.py driven headless by ``streamlit.testing.v1.AppTest``: the live run (it grows step by step, pauses,
resumes, follows the speed, finishes), every preset, both languages, the five views of a finished run, metrics
with sensible values, and bad input shown as a message (never a traceback).

In AppTest a fragment's timer does not fire: each ``at.run()`` is one tick of the live view.

Runs the real engine with the bundled model (or ``$MINENGINE_MODEL``), with presets scaled down so the whole
file takes about a minute on 2 CPU cores.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from minengine.viz import presets  # noqa: E402
from minengine.workloads import azure_conv_path, find_data_dir  # noqa: E402
from tests.app.conftest import subtitles  # noqa: E402
from tests.dashboard_model import dashboard_model  # noqa: E402
from tests.streamlit_colors import rewritten_colors  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "app.py"
# block pool, block tables, animation | batch | timeline, ITL | queue, KV, CDF | TTFT, TBT per request, 2 x (ITL,
# batch); preset (f) adds the zoomed decode view in the batch tab
NUM_FIGURES = 15
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture
def app(monkeypatch):
    model = dashboard_model()
    if model is not None:
        monkeypatch.setenv("MINENGINE_MODEL", model)
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    assert not at.exception
    return at


def figure_titles(at: AppTest) -> list[str]:
    """The titles of every figure on the page; each figure is also checked for a colour that Streamlit's frontend
    would repaint (``tests/streamlit_colors.py``)."""
    titles = []
    for chart in at.get("plotly_chart"):
        assert rewritten_colors(chart.proto.spec) == [], chart.proto.spec[:200]
        title = json.loads(chart.proto.spec)["layout"].get("title", {})
        titles.append(title.get("text", "") if isinstance(title, dict) else str(title))
    return titles


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def choose(at: AppTest, preset: str) -> None:
    at.selectbox(key="preset_en").set_value(preset).run()
    if preset == "a":  # the long prompt at 1/16 of 8,000 tokens keeps the test quick
        at.select_slider(key="a_scale").set_value(1 / 16).run()
    if preset == "d":
        at.number_input(key="d_n").set_value(12).run()
    assert not at.exception


def start(at: AppTest) -> None:
    """Press Run: the live view starts (its first tick runs at once)."""
    at.button(key="run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]


def run(at: AppTest) -> None:
    """Press Run, then Finish now: the finished run's tabs."""
    start(at)
    at.button(key="live_finish").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert len(at.tabs) == 5


def live_step(at: AppTest) -> tuple[str, int]:
    """(state, step) from the live status line, e.g. ("running", 12)."""
    status = next(md.value for md in at.markdown if md.value.startswith("**Live, "))
    m = re.match(r"\*\*Live, (\w+):\*\* step (\d+)", status)
    return m.group(1), int(m.group(2))


def check_views(at: AppTest, lang: str, num_figures: int = NUM_FIGURES) -> dict[str, str]:
    titles = figure_titles(at)
    assert len(titles) == num_figures, titles
    table_title = "Block tables at step" if lang == "en" else "块表"
    assert any(table_title in x for x in titles), titles
    assert all(bool(CJK.search(x)) == (lang == "zh") for x in titles if x), titles
    assert len(at.tabs) == 5
    assert all(bool(CJK.search(tab.label)) == (lang == "zh") for tab in at.tabs)
    assert len(at.caption) >= 9  # every figure view has its "what to look at" caption
    # the ITL caption speaks of red points only when the stall table has stalls (its info line says when not)
    no_stalls = any(re.match(r"(No ITL above|没有超过)", i.value) for i in at.info)
    assert any(c.value.startswith(("Every inter-token gap", "每个请求的每个词元间隔")) for c in at.caption)
    assert no_stalls == all(("Red points" not in c.value and "红点是" not in c.value) for c in at.caption)
    m = metrics(at)
    assert len(m) == 13  # 3 x (P50, P95, P99) of TTFT, TPOT, ITL, then throughput, preemptions, prefix, counts
    for name in ("TTFT", "TPOT", "ITL"):
        p50, p95, p99 = (float(v.replace(",", "")) for k, v in m.items() if k.startswith(name))
        assert 0 < p50 <= p95 <= p99 < 60_000  # milliseconds
    throughput = float(next(v for k, v in m.items() if "tok/s" in k or "词元/秒" in k).replace(",", ""))
    assert throughput > 0
    ab = [md.value for md in at.markdown if "P99 TBT" in md.value]
    assert len(ab) == 1 and re.search(r"\d+\.\d (ms|毫秒)", ab[0])
    return m


def metric(m: dict[str, str], fragment: str) -> str:
    return next(v for k, v in m.items() if fragment in k)


EXPECTED_REQUESTS = {"a": 11, "b": 8, "c": 8, "d": 12, "e": 32}
AB_OPENS_ON = {"a": "With A: chunked prefill on instead of B: chunked prefill off",
               "b": "With A: prefix caching on instead of B: prefix caching off",
               "c": "With A: preempt by recompute instead of B: preempt by swap",
               "d": "With A: 16 sequence slots instead of B: 4 sequence slots",
               "e": "With A: token budget 256 instead of B: token budget 64"}


def ab_sentences(at: AppTest) -> list[str]:
    return [md.value for md in at.markdown if "P99 TBT" in md.value]


@pytest.mark.parametrize("preset", ["a", "b", "c", "d", "e"])
def test_every_preset_in_both_languages(app, preset):
    if preset == "d" and azure_conv_path(find_data_dir()) is None:
        pytest.skip("Azure trace absent (../shared/data): covered by test_trace_preset_without_the_file")
    choose(app, preset)
    run(app)
    m = check_views(app, "en")
    # the A/B tab opens on the preset's own comparison, and says what each run computed
    assert app.radio(key=f"ab_knob_{preset}_en").value == presets.PRESET_COMPARISON[preset]
    assert ab_sentences(app)[0].startswith(AB_OPENS_ON[preset])
    assert any(md.value.startswith("Work: A: ") for md in app.markdown)
    # what the scheduler decided, in words: one sentence per step under the batch figure
    story = next(md.value for md in app.markdown if md.value.startswith("step 0: "))
    num_steps = int(metric(m, "Requests").split("/")[1])
    assert len(story.split("  \n")) == num_steps and f"step {num_steps - 1}: " in story
    num_requests, num_steps = (int(x) for x in metric(m, "Requests").split("/"))
    assert num_requests == EXPECTED_REQUESTS[preset] and num_steps >= 2
    if preset == "b":
        hit_tokens = int(metric(m, "Prefix cache hit").split()[0].replace(",", ""))
        assert hit_tokens > 0
    if preset == "c":
        assert int(metric(m, "Preemptions")) > 0
    if preset == "a":
        assert any("500 tokens (8,000 × 0.0625)" in i.value for i in app.info)
    if preset == "d":  # the speed-up is named on screen
        assert any("first 12 requests" in i.value and "arrivals 128× faster than recorded" in i.value
                   for i in app.info)

    app.radio(key="lang").set_value("zh").run()
    assert not app.exception and not app.error
    assert app.selectbox(key="preset_zh").value == preset  # the choice survives the switch
    m_zh = check_views(app, "zh")
    # the cached run is reused: the same numbers under the translated labels
    assert sorted(m_zh.values()) == sorted(m.values())
    assert any("第 0 步：" in md.value for md in app.markdown)
    assert app.radio(key=f"ab_knob_{preset}_zh").value == presets.PRESET_COMPARISON[preset]


def test_the_page_draws_the_workload_before_run(app):
    """Before Run the page already draws a figure: the chosen preset's requests (its plotly code loads in the
    browser then, not when the live view's first step comes)."""
    for preset, lang in (("c", "en"), ("b", "zh")):
        app.radio(key="lang").set_value(lang).run()
        app.selectbox(key=f"preset_{lang}").set_value(preset).run()
        assert not app.exception
        titles = figure_titles(app)
        n = EXPECTED_REQUESTS[preset]
        assert len(titles) == 1 and (f"{n} requests" in titles[0] or f"{n} 个请求" in titles[0]), titles


def step_slider(at: AppTest):
    return next(s for s in at.slider if (s.key or "").startswith("step_"))


def test_step_slider_moves_the_block_views(app):
    choose(app, "c")
    run(app)
    step_slider(app).set_value(0).run()
    titles = figure_titles(app)
    assert any(x.startswith("KV block pool at step 0 ") for x in titles)
    assert "Block tables at step 0: logical block → physical block" in titles
    step_slider(app).set_value(5).run()
    assert any(x.startswith("KV block pool at step 5 ") for x in figure_titles(app))


def test_changed_controls_are_flagged_until_run_again(app):
    choose(app, "c")
    run(app)
    assert not app.warning
    app.number_input(key="c_blocks").set_value(32).run()
    assert any("press Run" in w.value for w in app.warning)
    assert metric(metrics(app), "Preemptions")  # the previous run stays on screen meanwhile
    run(app)
    assert not app.warning


def test_default_stall_threshold_follows_the_run(app):
    choose(app, "a")
    run(app)
    itl_titles = [x for x in figure_titles(app) if x.startswith("Inter-token latency")]
    assert len(itl_titles) == 3  # TBT tab, A/B tab x 2: one threshold for all
    assert len(set(itl_titles)) == 1
    shown_ms = float(re.search(r"above ([\d.]+) ms", itl_titles[0]).group(1))
    itl_p50_ms = float(metric(metrics(app), "ITL (TBT) P50").replace(",", ""))
    assert shown_ms == pytest.approx(3 * itl_p50_ms, abs=0.2)  # 0 = 3 x the run's median ITL
    # the A/B tab's two ITL figures share one y range (preset (a): 25 vs 70 ms tops before)
    specs = [json.loads(c.proto.spec)["layout"] for c in app.get("plotly_chart")]
    itl = [sp for sp in specs if sp.get("title", {}).get("text", "").startswith("Inter-token")]
    ab = [sp["yaxis"].get("range") for sp in itl[1:]]
    assert len(ab) == 2 and ab[0] == ab[1] and ab[0][1] > 0


def test_stall_threshold_changes_the_stall_table(app):
    choose(app, "a")
    app.number_input(key="threshold").set_value(10_000.0).run()
    run(app)
    assert any("No ITL above 10000.0 ms" in i.value for i in app.info)
    app.number_input(key="threshold").set_value(1.0).run()
    assert not app.exception
    assert len(app.dataframe) == 1 and len(app.dataframe[0].value) > 0


@pytest.mark.parametrize("controls, message", [
    ({"a_blocks": 0}, "num_kv_blocks must be at least 1"),
    ({"a_budget": 8, "a_bs": 16}, "smaller than block_size"),
    ({"a_blocks": 2}, "num_kv_blocks"),  # the engine refuses a request that cannot fit the pool
])
def test_bad_input_shows_a_message_not_a_traceback(app, controls, message):
    choose(app, "a")
    for key, value in controls.items():
        app.number_input(key=key).set_value(value).run()
    app.button(key="run").click().run()
    assert not app.exception
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and message in errors[0], errors
    assert not app.get("plotly_chart")


def test_malformed_uploaded_trace_is_reported(app):
    choose(app, "d")
    app.file_uploader(key="d_upload").set_value(("mine.csv", b"TIMESTAMP,Prompt\n2023-11-16 18:15:46,12\n",
                                                  "text/csv")).run()
    assert not app.exception
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and "could not be read" in errors[0] and "ContextTokens" in errors[0]
    assert app.button(key="run").disabled


def test_uploaded_trace_is_replayed(app):
    rows = "\n".join(f"2023-11-16 18:15:{10 + i:02d}.1234567,{40 + 8 * i},{16 + i}" for i in range(5))
    choose(app, "d")
    app.file_uploader(key="d_upload").set_value(("mine.csv", f"TIMESTAMP,ContextTokens,GeneratedTokens\n{rows}\n"
                                                 .encode(), "text/csv")).run()
    assert any("uploaded trace (5 requests)" in i.value for i in app.info)
    run(app)
    assert metric(metrics(app), "Requests").startswith("5 /")


def test_trace_preset_without_the_file(monkeypatch):
    # The script re-imports find_data_dir from the package on every run, so patching the package attribute
    # makes the app see a machine without ../shared/data.
    monkeypatch.setattr("minengine.workloads.find_data_dir", lambda explicit=None: None)
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    choose(at, "d")
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1 and "is not here" in warnings[0] and "upload" in warnings[0].lower()
    assert at.button(key="run").disabled
    assert not at.error and not at.exception


def test_ab_comparison_of_another_setting(app):
    """The A/B tab offers every comparison on every preset; another choice runs and draws the same figures."""
    choose(app, "b")
    run(app)
    app.radio(key="ab_knob_b_en").set_value("chunked_prefill").run()
    assert not app.exception and not app.error
    assert ab_sentences(app)[0].startswith("With A: chunked prefill on instead of B: chunked prefill off")
    assert len(figure_titles(app)) == NUM_FIGURES
    ab = [t for t in figure_titles(app) if t.startswith(("TTFT of each request", "Longest token gap per request"))]
    assert len(ab) == 2  # the TTFT figure beside the TBT one


def test_live_run_grows_step_by_step_pauses_and_resumes(app):
    choose(app, "a")
    app.select_slider(key="live_speed_en").set_value(20).run()
    start(app)
    assert not app.tabs  # live: no finished-run tabs yet
    state, step0 = live_step(app)
    assert state == "running"
    titles = figure_titles(app)
    assert len(titles) == 3  # block pool, batch bars, token timeline
    assert titles[0].startswith(f"KV block pool at step {step0} ")
    for _ in range(40):  # ticks until the run moves on (20 steps/s: one step per 50 ms of real time)
        time.sleep(0.1)
        app.run()
        if live_step(app)[1] > step0:
            break
    state, step1 = live_step(app)
    assert step1 > step0
    assert figure_titles(app)[0].startswith(f"KV block pool at step {step1} ")

    app.button(key="live_pause").click().run()
    state, held = live_step(app)
    assert state == "paused"
    for _ in range(3):
        time.sleep(0.2)
        app.run()
    assert live_step(app) == ("paused", held)  # paused: the engine does not step

    app.button(key="live_resume").click().run()
    for _ in range(40):
        time.sleep(0.1)
        app.run()
        if live_step(app)[1] > held:
            break
    state, step2 = live_step(app)
    assert state == "running" and step2 > held

    app.button(key="live_finish").click().run()
    assert not app.exception and not app.error
    assert len(app.tabs) == 5 and len(figure_titles(app)) == NUM_FIGURES
    num_steps = int(metric(metrics(app), "Requests").split("/")[1])
    assert num_steps > step2
    assert not any(md.value.startswith("**Live, ") for md in app.markdown)


def test_live_speed_sets_the_steps_per_redraw(app):
    choose(app, "c")
    app.select_slider(key="live_speed_en").set_value(1).run()
    start(app)
    _, first = live_step(app)
    time.sleep(0.5)
    app.run()
    assert live_step(app)[1] - first <= 1  # half a second at 1 step/s
    # as fast as the engine goes: a whole tick's budget of steps (this small run may even finish)
    app.select_slider(key="live_speed_en").set_value(0).run()
    if app.tabs:
        return
    _, before = live_step(app)
    app.run()
    assert app.tabs or live_step(app)[1] - before >= 5


def test_language_switch_during_a_live_run_keeps_it(app):
    choose(app, "a")
    app.select_slider(key="live_speed_en").set_value(1).run()
    start(app)
    _, step = live_step(app)
    app.radio(key="lang").set_value("zh").run()
    assert not app.exception and not app.error
    status = next(md.value for md in app.markdown if md.value.startswith("**实时"))
    assert f"第 {step}" in status or f"第 {step + 1}" in status  # the same run, not a new one
    assert app.select_slider(key="live_speed_zh").value == 1


def test_clock_selector(app):
    choose(app, "c")
    run(app)
    # default: modelled, named on every figure whose axis is time (timeline, ITL, queue, KV, CDF, A/B ITL x 2)
    h100 = metrics(app)
    assert subtitles(app).count("modelled: H100 SXM, Llama-3-8B shapes") == 9  # + the A/B TTFT and TBT figures
    run(app)
    assert metrics(app) == h100  # modelled time: the same numbers, run after run
    assert not app.sidebar.warning  # H100 holds Llama-3-8B
    app.selectbox(key="clock_hardware").set_value("l4").run()
    run(app)
    assert subtitles(app).count("modelled: L4, Llama-3-8B shapes") == 9
    assert not app.sidebar.warning  # 16.1 GB of weights in 21.6 GB
    tpot = {name: float(metric(m, "TPOT P50").replace(",", "")) for name, m in (("h100", h100), ("l4", metrics(app)))}
    assert tpot["l4"] > 5 * tpot["h100"]  # 300 GB/s vs 3.35 TB/s: decode is memory-bound
    app.selectbox(key="clock_model").set_value(("llama-3-70b", 4)).run()
    run(app)
    assert subtitles(app).count("modelled: L4, Llama-3-70B shapes, TP 4") == 9
    # 70B over 4 L4s: 35.3 GB of weights per GPU, 21.6 GB usable: priced, but flagged as impossible
    assert [w.value for w in app.sidebar.warning if "does not fit L4" in w.value and "35.3 GB" in w.value]
    app.selectbox(key="clock_model").set_value(("llama-3-70b", 8)).run()
    assert not app.sidebar.warning  # TP 8: 17.6 GB per GPU fits
    app.radio(key="clock_kind_en").set_value("cpu").run()
    assert not [s for s in app.selectbox if s.key == "clock_hardware"]  # no GPU to choose for measured time
    run(app)
    assert subtitles(app).count("measured: CPU time") == 9
    # measured: A and B both run now in this session, and the page says so
    assert any("both run just now" in i.value and "load average" in i.value for i in app.info)
    app.radio(key="lang").set_value("zh").run()
    assert subtitles(app).count("实测：CPU 时间") == 9
    assert app.radio(key="clock_kind_zh").value == "cpu"


def test_speculative_decoding_preset_and_the_policy_list(app):
    """Preset (f): decodes carry proposals (the batch bars mark accepted and rejected ones), the metrics tab
    gives the acceptance rate and tokens per step; the policy list has shortest-predicted-first, and a run
    under it draws every view."""
    choose(app, "f")
    assert app.number_input(key="f_spec").value == 4
    run(app)
    m = metrics(app)
    assert len(m) == 16  # the 13 of every run, then acceptance, tokens per drafted decode, tokens per step
    acceptance = float(metric(m, "Speculative acceptance").rstrip("%")) / 100
    assert 0 < acceptance < 1
    assert float(metric(m, "Tokens per drafted decode")) > 1
    num_requests, num_steps = (int(x) for x in metric(m, "Requests").split("/"))
    assert num_requests == 4 and float(metric(m, "Output tokens per step")) == pytest.approx(
        4 * 64 / num_steps, abs=0.01)
    batch = next(json.loads(c.proto.spec) for c in app.get("plotly_chart")
                 if "Batch" in str(json.loads(c.proto.spec)["layout"].get("title", "")))
    shapes = {s for d in batch["data"] if d.get("type") == "bar"
              for s in (d.get("marker", {}).get("pattern", {}).get("shape") or [])}
    assert {".", "x"} <= shapes  # accepted (dotted) and rejected (crossed) proposals
    legend = {d.get("name") for d in batch["data"] if d.get("showlegend", True)}
    assert {"accepted proposals (dotted)", "rejected proposals (crossed)"} <= legend  # ... with legend entries
    # the zoomed decode view: the proposals on their own axis, every part in the legend
    zoom = next(json.loads(c.proto.spec) for c in app.get("plotly_chart")
                if "Decodes per step, zoomed" in str(json.loads(c.proto.spec)["layout"].get("title", "")))
    names = [d["name"] for d in zoom["data"]]
    assert names == ["own token (1 per decode)", "accepted proposals (dotted)", "rejected proposals (crossed)"]
    top = max(sum(ys) for ys in zip(*(d["y"] for d in zoom["data"])))
    assert top <= 4 * 5  # 4 requests x (1 + 4 proposals): a decode-sized axis, not the 256-token budget
    assert len(figure_titles(app)) == NUM_FIGURES + 1
    # the A/B tab opens on speculation on vs off; fewer steps with it
    assert app.radio(key="ab_knob_f_en").value == "speculation"
    assert ab_sentences(app)[0].startswith("With A: 4 speculative tokens instead of B: no speculation")
    captions = " ".join(c.value for c in app.caption)
    assert "long prompt" not in captions and "proposals" in captions

    policy = app.selectbox(key="f_policy")
    assert "shortest-predicted-first" in policy.options
    policy.set_value("shortest-predicted-first").run()
    app.number_input(key="f_spec").set_value(0).run()
    run(app)
    m = check_views(app, "en")
    assert int(metric(m, "Requests").split("/")[0]) == 4
    # no speculation in this run: no caption about proposals (the A/B tab's still compares speculation on vs off)
    assert "proposals" not in " ".join(c.value for c in app.caption if not c.value.startswith("The same workload"))


def test_live_run_says_while_the_cpu_kernel_builds(app, monkeypatch):
    """While the CPU attention kernel is built in the background (``cpu_attention.status()``), the live view says
    so in both languages (an info line); a fall back to the torch path is a warning that stays after the run; once
    the kernel is ready the line goes. (Every state's sentence: test_viz_dashboard's kernel-note tests.)"""
    from minengine.layers import cpu_attention

    def status_is(state, **kw):
        monkeypatch.setattr(cpu_attention, "status", lambda: cpu_attention.KernelStatus(state, **kw))

    status_is(cpu_attention.KernelState.BUILDING, seconds=3.0, in_background=True)
    choose(app, "c")
    app.select_slider(key="live_speed_en").set_value(1).run()
    start(app)
    assert any(c.value.startswith("Compiling the CPU attention kernel (3 s so far") for c in app.info)
    app.radio(key="lang").set_value("zh").run()
    assert any(c.value.startswith("正在编译 CPU 注意力内核") for c in app.info)
    app.radio(key="lang").set_value("en").run()
    status_is(cpu_attention.KernelState.FALLBACK, reason="no g++", seconds=4.0)
    app.button(key="live_finish").click().run()
    fallback = "The CPU attention kernel is unavailable, so the torch attention path runs (no g++)."
    assert any(fallback in m.value for m in app.warning), [m.value for m in app.warning]
    status_is(cpu_attention.KernelState.READY, seconds=11.0, in_background=True)
    app.run()
    assert not any("attention kernel" in m.value for m in [*app.info, *app.warning])

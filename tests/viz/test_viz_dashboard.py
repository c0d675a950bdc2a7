"""The dashboard's smaller parts on hand-built inputs: the kernel note (every state of cpu_attention.status()),
legends that fit, run features for the captions, the A/B request figures, the zoomed decode figure, the (d) speed-up."""

from __future__ import annotations

import dataclasses
import math

import pytest

pytest.importorskip("plotly")

from minengine.layers import cpu_attention  # noqa: E402
from minengine.metrics.stats import ServingSummary  # noqa: E402
from minengine.metrics.trace import ScheduledChunk, StepTrace  # noqa: E402
from minengine.outputs import RequestMetrics  # noqa: E402
from minengine.viz import captions, kernel_note, presets  # noqa: E402
from minengine.viz.batch_figure import MAX_REQUEST_ENTRIES, batch_composition_figure, spec_decode_figure  # noqa: E402
from minengine.viz.compare import ab_request_figure, ab_work_sentence  # noqa: E402
from minengine.viz.i18n import t  # noqa: E402
from minengine.viz.legend import ENTRIES_PER_ROW, MAX_SIDE_ENTRIES  # noqa: E402


# ---- the kernel note ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_kernel_note_says_what_the_engine_waits_for(lang):
    KS = kernel_note.KernelState
    assert kernel_note.kernel_note(KS("ready"), lang) is None
    assert kernel_note.kernel_note(KS("not_started"), lang) is None
    for seconds in (3.0, 104.4):  # it says how long it has compiled so far, and promises no duration
        kind, text = kernel_note.kernel_note(KS("building", seconds=seconds), lang)
        assert kind == "info" and ("Compiling the CPU attention kernel" in text or "正在编译" in text)
        assert f"{seconds:.0f} " in text and "~" not in text and "约" not in text
    kind, text = kernel_note.kernel_note(KS("waiting", seconds=42.4), lang)
    assert kind == "info" and "42" in text
    kind, text = kernel_note.kernel_note(KS("fallback", reason="TimeoutError: stuck"), lang)
    assert kind == "warning" and "TimeoutError: stuck" in text
    kind, text = kernel_note.kernel_note(KS("fallback"), lang)  # no reason known: where to find it
    assert kind == "warning" and ("log" in text or "日志" in text)
    assert kernel_note.kernel_note(KS("off"), lang)[0] == "info"
    with pytest.raises(ValueError, match="state"):
        kernel_note.kernel_note(KS("exploded"), lang)
    with pytest.raises(ValueError, match="lang"):
        kernel_note.kernel_note(KS("ready"), "fr")


@pytest.mark.parametrize("state", list(cpu_attention.KernelState))
def test_kernel_state_reads_every_state_of_the_status_api(monkeypatch, state):
    """Every ``cpu_attention.KernelState`` has a note state (so ``kernel_note`` never raises on a real one); its
    reason and seconds pass through; ``MINENGINE_CPU_KERNEL=0`` reads "off"."""
    status = cpu_attention.KernelStatus(state, reason="no compiler", seconds=12.0)
    monkeypatch.setattr(cpu_attention, "status", lambda: status)
    monkeypatch.setattr(cpu_attention, "is_disabled", lambda: False)
    got = kernel_note.kernel_state()
    assert got == kernel_note.KernelState(state.name.lower(), "no compiler", 12.0)
    note = kernel_note.kernel_note(got, "en")
    assert (note is None) == (state in (cpu_attention.KernelState.READY, cpu_attention.KernelState.NOT_STARTED))
    monkeypatch.setattr(cpu_attention, "is_disabled", lambda: True)
    assert kernel_note.kernel_state().state == "off"


# ---- legends that fit ----------------------------------------------------------------------------------------------
def _steps(num_requests: int) -> list[StepTrace]:
    chunks = [ScheduledChunk(f"r{i}", 1, 4, False, True) for i in range(num_requests)]
    return [StepTrace(0, 0.0, 0.01, 64, chunks, num_requests, 0, 10, 0, 10, [], [], [], 0, 0)]


@pytest.mark.parametrize("num_requests", [3, 12, 13, 48])
def test_a_batch_legend_names_a_few_requests_and_stays_short_for_many(num_requests):
    """Up to MAX_REQUEST_ENTRIES requests each have a legend entry; past that one entry stands for them all (48
    entries took 520 of a 960 px course figure), every bar's hover still naming its request."""
    fig = batch_composition_figure(_steps(num_requests))
    entries = sum(1 for d in fig.data if d.showlegend is not False)
    names = [d.name for d in fig.data if d.showlegend is not False]
    assert all(f"request r{i}" in "".join(d.hovertemplate for d in fig.data if d.hovertemplate)
               for i in range(num_requests))
    if num_requests <= MAX_REQUEST_ENTRIES:
        assert [n for n in names if n.startswith("request ")] == [f"request r{i}" for i in range(num_requests)]
    else:
        assert not any(n.startswith("request ") for n in names) and entries <= 6
        assert names[0].startswith("requests: one colour each") and (fig.layout.height or 450) <= 450


@pytest.mark.parametrize("num_requests", [3, 12, 40])
def test_a_batch_legend_of_any_size_fits(num_requests):
    fig = batch_composition_figure(_steps(num_requests))
    entries = sum(1 for d in fig.data if d.showlegend is not False)
    height = fig.layout.height or 450
    if entries <= MAX_SIDE_ENTRIES:  # at the side, in a figure tall enough for 30 px per entry
        assert fig.layout.legend.orientation != "h" and height >= 150 + 30 * entries
    else:  # below the plot, the figure grown by its rows
        rows_px = 30 * math.ceil(entries / ENTRIES_PER_ROW)
        legend = fig.layout.legend
        assert legend.orientation == "h" and legend.yref == "container"
        assert height >= 450 + rows_px and fig.layout.margin.b >= 90 + rows_px
        # a fixed number of entries per row (a text-wide entry wraps by its names' lengths), and no cap that
        # scrolls the rows (plotly's default: half the figure)
        assert legend.entrywidthmode == "fraction" and legend.entrywidth * ENTRIES_PER_ROW <= 1
        assert legend.maxheight >= rows_px


# ---- run features (the captions' facts) ------------------------------------------------------------------------------
def test_run_features_from_hand_built_steps():
    base = dict(token_budget=64, num_running=1, num_free_blocks=5, num_total_blocks=10, admitted_ids=[],
                finished_ids=[], prefix_queried_tokens=0)
    plain = StepTrace(0, 0.0, 0.01, chunks=[ScheduledChunk("a", 8, 0, True, True)], num_waiting=0,
                      num_cached_free_blocks=0, preempted_ids=[], prefix_hit_tokens=0, **base)
    assert captions.run_features([plain]) == frozenset()
    busy = StepTrace(1, 0.0, 0.01, chunks=[ScheduledChunk("b", 32, 0, True, False),
                                           ScheduledChunk("c", 5, 7, False, True, 4, 2)],
                     num_waiting=3, num_cached_free_blocks=2, preempted_ids=["d"], prefix_hit_tokens=16,
                     block_ref_counts=[2, 1, 0], num_swapped_out_blocks=3, **base)
    assert captions.run_features([plain, busy]) == frozenset(captions.FEATURES)
    assert "proposals" in captions.batch_caption(captions.run_features([busy]), "f", "en")
    assert "proposals" not in captions.batch_caption(captions.run_features([plain]), "f", "en")
    assert "long prompt" in captions.batch_caption(frozenset(), "a", "en")  # (a)'s lesson, chunked or not
    assert "long prompt" not in captions.batch_caption(frozenset(), "e", "en")


# ---- the A/B figures, the zoomed decodes, the (d) speed-up ---------------------------------------------------------
_SUMMARY = ServingSummary(**{f.name: 1 for f in dataclasses.fields(ServingSummary)})  # only counts are read


def _metrics(ttft: float, itls: list[float], arrival: float = 0.0) -> RequestMetrics:
    m = RequestMetrics(arrival_time=arrival, first_scheduled_time=arrival, first_token_time=arrival + ttft,
                       num_output_tokens=len(itls) + 1, itls=itls)
    m.finished_time = m.first_token_time + sum(itls)
    return m


def test_ab_request_figures_show_each_request_under_both_runs():
    a = {"r0": _metrics(0.010, [0.01, 0.02]), "r1": _metrics(0.030, [], arrival=1.0)}
    b = {"r0": _metrics(0.050, [0.01, 0.09]), "r1": _metrics(0.070, [], arrival=1.0)}
    ttft = ab_request_figure(a, b, "A", "B", "ttft")
    bars = {d.name: dict(zip(d.x, d.y)) for d in ttft.data if d.type == "bar"}
    assert bars == {"A": {"r0": pytest.approx(10), "r1": pytest.approx(30)},
                    "B": {"r0": pytest.approx(50), "r1": pytest.approx(70)}}
    tbt = ab_request_figure(a, b, "A", "B", "tbt")
    bars = {d.name: dict(zip(d.x, d.y)) for d in tbt.data if d.type == "bar"}
    assert set(bars["A"]) == {"r0"} and bars["B"]["r0"] == pytest.approx(90)  # its longest gap; r1: one token
    # the dashed lines are the A/B sentence's P99s (summarize's), whatever the requests' own gaps
    from minengine.metrics.stats import summarize

    for fig, key in ((ttft, "ttft_p99"), (tbt, "itl_p99")):
        lines = {d.name: d.y[0] for d in fig.data if d.type == "scatter"}
        for label, run in (("A", a), ("B", b)):
            assert lines[f"{label} P99"] == pytest.approx(getattr(summarize(list(run.values()), [], 1), key) * 1000)
    with pytest.raises(ValueError, match="kind"):
        ab_request_figure(a, b, "A", "B", "e2e")


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("pre_a, swap_b", [(0, 0), (1, 1), (5, 22), (1, 1234)])
def test_ab_work_sentence_counts_in_singular_and_plural(lang, pre_a, swap_b):
    """Preset (e)'s A/B tab read "(1 preemptions, ...)": one count is singular, any other plural, in both runs."""
    a = dataclasses.replace(_SUMMARY, num_preemptions=pre_a, num_swapped_out_blocks=0)
    b = dataclasses.replace(_SUMMARY, num_preemptions=2, num_swapped_out_blocks=swap_b)
    text = ab_work_sentence([], [], a, b, "A", "B", lang)
    if lang == "en":
        assert f"({pre_a:,} preemption{'' if pre_a == 1 else 's'}, 0 KV blocks swapped out" in text
        assert f"(2 preemptions, {swap_b:,} block{'' if swap_b == 1 else 's'} swapped out)" in text
        assert "1 preemptions" not in text and "1 blocks" not in text
    else:
        assert f"{pre_a:,} 次抢占" in text and f"{swap_b:,} 个块换出" in text and "{" not in text


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_itl_caption_mentions_red_points_and_labels_only_when_there_are_some(lang):
    """Preset (a)'s run (chunked prefill on) has no stall, and its caption said "the 3 largest are labelled"."""
    none, one, three = (captions.itl_caption(n, lang) for n in (0, 1, 3))
    red, largest = ("Red points", "largest") if lang == "en" else ("红点是", "最大的")
    assert red not in none and largest not in none and "①" not in none
    assert red in one and "①" in one and "②" not in one and ("the largest is" in one or lang == "zh")
    assert red in three and "3" in three and "②" in three


def test_ab_tab_titles_fit_a_half_width_column():
    """The A/B tab draws these figures two to a row: at 1,280-1,440 px wide windows the longer titles (68-78
    characters) were cut at the figure's right edge. ~55 characters fit (the browser test measures the boxes);
    Chinese characters count double."""
    def width(text: str) -> int:
        return sum(2 if "\u2e80" <= ch <= "\u9fff" or "\uff00" <= ch <= "\uffef" else 1 for ch in text)

    for lang in ("en", "zh"):
        for key in ("ab_ttft_title", "ab_tbt_title", "batch_title", "itl_title"):
            title = t(key, lang).format(threshold_ms=999.9)
            assert width(title) <= 56, (lang, key, title, width(title))


def test_zoomed_decodes_sum_own_accepted_and_rejected_tokens():
    chunks = [ScheduledChunk("r0", 5, 40, False, True, 4, 3), ScheduledChunk("r1", 3, 30, False, True, 2, 0),
              ScheduledChunk("r2", 200, 0, True, False)]
    tr = StepTrace(7, 0.0, 0.01, 256, chunks, 3, 0, 10, 0, 10, [], [], [], 0, 0)
    fig = spec_decode_figure([tr])
    assert [(d.name, list(d.y)) for d in fig.data] == [("own token (1 per decode)", [2]),
                                                       ("accepted proposals (dotted)", [3]),
                                                       ("rejected proposals (crossed)", [3])]


def test_trace_speedup_divides_the_arrival_times():
    from minengine.workloads import TraceRequest

    trace = [TraceRequest(0.0, 8, 2, None, "a"), TraceRequest(4.0, 8, 2, None, "b")]
    w = presets.from_trace(trace, 1 / 8, speedup=16)
    assert [r.arrival_time for r in w.requests] == [0.0, 0.25]
    assert dict(w.scale_note[1])["speedup"] == 16 and dict(w.scale_note[1])["span_fast_s"] == 0.25
    for bad in (0, -1, float("inf")):
        with pytest.raises(ValueError, match="speedup"):
            presets.from_trace(trace, 1 / 8, speedup=bad)


# ---- the workload before it runs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("make", [presets.textbook_long_prompt, presets.shared_system_prompt, presets.memory_pressure,
                                  presets.speculative_decoding, lambda: presets.custom(12, (8, 64), (4, 16), 20.0)])
def test_workload_figure_shows_each_request_s_tokens_in_arrival_order(make, lang):
    from minengine.viz.workload_figure import workload_figure
    from tests.streamlit_colors import rewritten_colors

    wl = make()
    fig = workload_figure(wl, lang)
    prompt, output = fig.data
    by_id = {r.request_id: r for r in wl.requests}
    assert sorted(prompt.x) == sorted(by_id) and list(prompt.x) == list(output.x)
    assert list(prompt.y) == [by_id[i].prompt_len for i in prompt.x]
    assert list(output.y) == [by_id[i].max_tokens for i in output.x]
    order = [(by_id[i].arrival_step is None, by_id[i].arrival_step or 0, by_id[i].arrival_time) for i in prompt.x]
    assert order == sorted(order)
    assert str(len(wl.requests)) in fig.layout.title.text
    assert rewritten_colors(fig.to_plotly_json()) == []

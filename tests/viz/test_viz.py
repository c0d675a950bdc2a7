"""minengine.viz: figure builders, stall finder, i18n and the dashboard runner, on real small engine runs
(the bundled model, or ``$MINENGINE_MODEL``) plus one hand-built trace where the expected answer is exact."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

pytest.importorskip("plotly")

import minengine.viz as viz  # noqa: E402
from minengine.metrics.trace import ScheduledChunk, StepTrace  # noqa: E402
from minengine.outputs import RequestMetrics  # noqa: E402
from minengine.timing import ClockSpec  # noqa: E402
from minengine.viz import i18n, presets  # noqa: E402
from minengine.viz.clock_label import clock_label  # noqa: E402
from minengine.viz.colors import REQUEST_PALETTE, SHARED_COLOR  # noqa: E402
from minengine.viz.live import (  # noqa: E402
    MEASURE_MIN_S,
    MEASURE_WINDOW_S,
    SPEEDS,
    TICK_S,
    LivePlayer,
    trace_from_dict,
)
from minengine.viz.runner import DashboardConfig, WorkloadRun, run_workload  # noqa: E402
from minengine.viz.workload import Workload, WorkloadRequest  # noqa: E402
from tests.dashboard_model import dashboard_model  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return dashboard_model()


@pytest.fixture(scope="module")
def textbook_runs(model):
    """Preset (a), scaled small: 4 decoding requests, a 500-token prompt arrives at step 3; chunked on/off."""
    wl = presets.textbook_long_prompt(long_prompt_scale=1 / 16, num_decoding=4, decode_prompt_len=16,
                                      decode_output_len=24, long_output_len=4, arrival_step=3)
    on = run_workload(DashboardConfig(max_num_batched_tokens=64, num_kv_blocks=128, model=model), wl)
    off = run_workload(DashboardConfig(max_num_batched_tokens=64, num_kv_blocks=128, model=model,
                                       enable_chunked_prefill=False), wl)
    return wl, on, off


@pytest.fixture(scope="module")
def prefix_run(model):
    """Preset (b), scaled small: 4 chats sharing a 64-token system prompt (4 full blocks)."""
    wl = presets.shared_system_prompt(num_requests=4, system_prompt_len=64, user_len_range=(8, 16), output_len=32,
                                      arrival_every_steps=2)
    return run_workload(DashboardConfig(max_num_batched_tokens=128, num_kv_blocks=64, model=model), wl)


@pytest.fixture(scope="module")
def pressure_run(model):
    wl = presets.memory_pressure(num_requests=6, prompt_len=32, output_len=32)
    return run_workload(DashboardConfig(num_kv_blocks=12, max_num_seqs=6, enable_prefix_caching=False,
                                        model=model), wl)


# ---- runner ---------------------------------------------------------------------------------------------------
def test_runner_finishes_every_request_with_its_length(textbook_runs):
    wl, on, off = textbook_runs
    for res in (on, off):
        assert set(res.request_metrics) == {r.request_id for r in wl.requests}
        for r in wl.requests:
            m = res.request_metrics[r.request_id]
            assert m.finished_time is not None and m.num_output_tokens == r.max_tokens
        assert res.summary.num_requests == len(wl.requests)
    # chunked: no step above the budget; unchunked: the 500-token prompt ran in one step
    assert max(tr.num_scheduled_tokens for tr in on.traces) <= 64
    assert any(c.num_tokens == 500 for tr in off.traces for c in tr.chunks)
    assert off.budget_raised and off.token_budget == wl.max_request_len + 16
    assert not on.budget_raised


def test_long_prompt_arrives_while_others_decode(textbook_runs):
    _, on, _ = textbook_runs
    admitted = next(tr for tr in on.traces if "r4" in tr.admitted_ids)
    assert admitted.step == 3
    decoding = [c for c in admitted.chunks if not c.is_prefill]
    assert len(decoding) == 4


@pytest.mark.parametrize("bad, field", [
    ({"num_kv_blocks": 0}, "num_kv_blocks"),
    ({"max_num_batched_tokens": 8, "block_size": 16}, "block_size"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"temperature": -1.0}, "temperature"),
    ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
])
def test_config_rejects_bad_values_naming_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        DashboardConfig(**bad).validate()


def test_request_larger_than_pool_is_refused_before_running(model):
    wl = presets.memory_pressure(num_requests=2, prompt_len=64, output_len=64)
    with pytest.raises(ValueError, match="num_kv_blocks"):
        run_workload(DashboardConfig(num_kv_blocks=4, model=model), wl)


def test_workload_validation():
    with pytest.raises(ValueError, match="duplicate"):
        Workload("x", (WorkloadRequest("a", (5,), 1), WorkloadRequest("a", (6,), 1)))
    with pytest.raises(ValueError, match="max_tokens"):
        Workload("x", (WorkloadRequest("a", (5,), 0),))
    with pytest.raises(ValueError, match="long_prompt_scale"):
        presets.textbook_long_prompt(long_prompt_scale=0)
    with pytest.raises(ValueError, match="prompt_len_range"):
        presets.custom(prompt_len_range=(10, 5))


def test_presets_are_deterministic_and_shaped_as_described():
    a = presets.textbook_long_prompt(long_prompt_scale=0.25)
    assert a == presets.textbook_long_prompt(long_prompt_scale=0.25)
    assert [r.prompt_len for r in a.requests][-1] == 2000 and len(a.requests) == 11
    b = presets.shared_system_prompt(system_prompt_len=100)
    assert len({r.prompt_token_ids[:100] for r in b.requests}) == 1
    assert len({r.prompt_token_ids for r in b.requests}) == len(b.requests)
    e = presets.custom(num_requests=20, prompt_len_range=(3, 9), output_len_range=(2, 4), arrival_rate=2.0)
    assert all(3 <= r.prompt_len <= 9 and 2 <= r.max_tokens <= 4 for r in e.requests)
    times = [r.arrival_time for r in e.requests]
    assert times == sorted(times) and times[0] == 0 and times[-1] > 0


# ---- figures on real runs -------------------------------------------------------------------------------------
def _heatmap(fig):
    return next(tr for tr in fig.data if tr.type == "heatmap")


def test_block_pool_figure_matches_the_trace(prefix_run):
    traces = prefix_run.traces
    shared_step = next((tr for tr in traces if max(tr.block_ref_counts) > 1), None)
    assert shared_step is not None, "the shared system prompt never produced a shared block"
    for tr in (shared_step, traces[-1]):
        fig = viz.block_pool_figure(tr, "en")
        hm = _heatmap(fig)
        cells = [(r, c) for r, row in enumerate(hm.z) for c, v in enumerate(row) if v is not None]
        assert len(cells) == tr.num_total_blocks
        cols = len(hm.z[0])
        in_use = sum(1 for r, c in cells if hm.z[r][c] >= 2)
        assert in_use == tr.num_total_blocks - tr.num_free_blocks
        cached_free = sum(1 for r, c in cells if hm.z[r][c] == 1)
        assert cached_free == tr.num_cached_free_blocks
        for r, c in cells:
            ref = tr.block_ref_counts[r * cols + c]
            assert hm.text[r][c] == (str(ref) if ref > 1 else "")
            assert (hm.z[r][c] == 2) == (ref > 1)  # shared blocks, and only they, in the shared colour
        # the legend's "shared" swatch is the colour the shared cells are painted in
        swatch = {d.name: d.marker.color for d in fig.data if d.type == "scatter"}
        if max(tr.block_ref_counts) > 1:
            category_2 = hm.colorscale[2 * 2][1]  # discrete_colorscale: two stops per category
            assert swatch["shared by several requests (number = ref count)"] == SHARED_COLOR == category_2
        assert f"step {tr.step}" in fig.layout.title.text
        assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_block_tables_figure_lists_each_table(prefix_run):
    tr = next(tr for tr in prefix_run.traces if len(tr.block_tables) >= 2)
    fig = viz.block_tables_figure(tr, "en")
    hm = _heatmap(fig)
    assert list(hm.y) == [f"request {rid}" for rid in tr.block_tables]
    for row, table in zip(hm.text, tr.block_tables.values()):
        assert [cell.rstrip("*") for cell in row if cell] == [str(b) for b in table]
    assert fig.layout.xaxis.title.text == "logical block index"


def test_block_figures_need_block_tables():
    tr = StepTrace(0, 0.0, 1.0, 8, [], 0, 0, 4, 0, 4, [], [], [], 0, 0)
    with pytest.raises(ValueError, match="trace_block_tables"):
        viz.block_pool_figure(tr)


def test_block_pool_animation_has_a_frame_per_step(textbook_runs):
    _, on, _ = textbook_runs
    fig = viz.block_pool_animation(on.traces, "en", frame_ms=100)
    assert [f.name for f in fig.frames] == [str(tr.step) for tr in on.traces]
    # the legend lists every request of the run, also those that arrive after the first frame (r4, step 3)
    legend = [d.name for d in fig.data if d.type == "scatter"]
    assert "r4" not in on.traces[0].block_tables
    assert [n for n in legend if n.startswith("request ")] == [f"request r{i}" for i in range(5)]
    # ... and every frame paints a request in the same colour (one colour scale for the whole run)
    assert len({str(f.data[0].colorscale) for f in fig.frames}) == 1
    assert fig.layout.updatemenus[0].buttons[0].args[1]["frame"]["duration"] == 100
    with pytest.raises(ValueError, match="traces"):
        viz.block_pool_animation([], "en")


def test_batch_composition_bars_sum_to_the_scheduled_tokens(textbook_runs):
    _, on, _ = textbook_runs
    fig = viz.batch_composition_figure(on.traces, "en")
    totals: dict[int, int] = {}
    prefill_bars = 0
    for tr in fig.data:
        if tr.type != "bar":
            continue
        for x, y, shape in zip(tr.x, tr.y, tr.marker.pattern.shape):
            totals[x] = totals.get(x, 0) + y
            prefill_bars += shape == "/"
    assert totals == {tr.step: tr.num_scheduled_tokens for tr in on.traces}
    assert prefill_bars == sum(1 for tr in on.traces for c in tr.chunks if c.is_prefill)
    budget = next(d for d in fig.data if d.name == "token budget")
    assert set(budget.y) == {64}
    admitted = next(d for d in fig.data if d.name == "admitted")
    assert 3 in admitted.x
    assert fig.layout.yaxis.title.text.endswith("(tokens)")
    assert fig.layout.xaxis.range is None  # a finished run fits its steps
    live = viz.batch_composition_figure(on.traces[:3], "en", min_steps=40)
    assert list(live.layout.xaxis.range) == [-0.5, 39.5]  # a run in progress: bars keep their width


def test_token_timeline_has_one_point_per_output_token(textbook_runs):
    _, on, _ = textbook_runs
    fig = viz.token_timeline_figure(on.request_metrics, "en")
    token_traces = [d for d in fig.data if d.showlegend is not False]
    assert sum(len(d.x) for d in token_traces) == sum(m.num_output_tokens for m in on.request_metrics.values())
    assert min(min(d.x) for d in fig.data) >= 0
    assert "(s)" in fig.layout.xaxis.title.text


def test_unchunked_long_prefill_is_named_as_the_stall_cause(textbook_runs):
    _, on, off = textbook_runs
    prefill_step = next(tr for tr in off.traces if any(c.num_tokens == 500 for c in tr.chunks))
    # the decodes that shared the 500-token step waited for all of it: their ITL there is that step's length
    threshold = prefill_step.duration * 0.9
    stalls = viz.find_stalls(off.request_metrics, off.traces, threshold)
    from_prefill = [s for s in stalls if s["step"] == prefill_step.step]
    assert len(from_prefill) == 4
    for s in from_prefill:
        assert s["kind"] == "prefill" and s["cause_request_id"] == "r4" and s["cause_tokens"] == 500
        assert s["cause"] == f"step {prefill_step.step}: 500-token prefill of request r4"
        assert s["itl_s"] > threshold
    # chunked prefill caps each step at 64 tokens: the worst ITL is well below the unchunked stall
    assert on.summary.itl_p99 < off.summary.itl_p99
    fig = viz.itl_figure(off.request_metrics, off.traces, threshold, "en")
    stall_trace = next(d for d in fig.data if d.name == "stall")
    assert len(stall_trace.x) == len(stalls)
    assert [a.text for a in fig.layout.annotations][0] == f"① step {prefill_step.step}: 500-token prefill of r4"
    assert fig.layout.yaxis.title.text == "inter-token latency (ms)"


def test_find_stalls_names_preemption(pressure_run):
    assert pressure_run.summary.num_preemptions > 0
    stalls = viz.find_stalls(pressure_run.request_metrics, pressure_run.traces, 0.0)
    preempted = {rid for tr in pressure_run.traces for rid in tr.preempted_ids}
    kinds = {s["request_id"] for s in stalls if s["kind"] == "preempted"}
    # a request preempted after its first token has a preemption-caused gap
    after_first = {rid for rid in preempted if pressure_run.request_metrics[rid].num_preemptions
                   and any(rid in tr.preempted_ids and tr.end_time > pressure_run.request_metrics[rid].first_token_time
                           for tr in pressure_run.traces)}
    assert after_first <= kinds
    with pytest.raises(ValueError, match="threshold_s"):
        viz.find_stalls(pressure_run.request_metrics, pressure_run.traces, -1)


def test_find_stalls_on_a_hand_built_trace():
    def step(i, chunks):
        return StepTrace(i, i * 1.0, i + 1.0, 4096, chunks, 2, 0, 10, 0, 10, [], [], [], 0, 0)

    traces = [step(0, [ScheduledChunk("r0", 8, 0, True, True)]),
              step(1, [ScheduledChunk("r0", 1, 8, False, True), ScheduledChunk("7", 1024, 0, True, False)]),
              step(2, [ScheduledChunk("r0", 1, 9, False, True), ScheduledChunk("7", 2048, 1024, True, True)])]
    m = RequestMetrics(arrival_time=0.0, first_token_time=1.0, finished_time=3.0, num_output_tokens=3,
                       itls=[1.0, 1.0])
    stalls = viz.find_stalls({"r0": m}, traces, 0.5)
    assert [s["cause"] for s in stalls] == ["step 1: 1,024-token prefill of request 7",
                                             "step 2: 2,048-token prefill of request 7"]
    assert [s["token_index"] for s in stalls] == [1, 2] and [s["time_s"] for s in stalls] == [2.0, 3.0]
    zh = viz.find_stalls({"r0": m}, traces, 0.5, lang="zh")
    assert zh[1]["cause"] == "第 2 步：请求 7 的 2,048 词元预填充"
    assert viz.find_stalls({"r0": m}, traces, 1.0) == []


def test_queue_and_kv_figures_follow_the_trace(pressure_run):
    traces = pressure_run.traces
    q = viz.queue_figure(traces, "en")
    assert list(q.data[0].y) == [tr.num_running for tr in traces]
    assert list(q.data[1].y) == [tr.num_waiting for tr in traces]
    kv = viz.kv_usage_figure(traces, "en")
    for i, tr in enumerate(traces):
        assert sum(d.y[i] for d in kv.data) == tr.num_total_blocks
    assert min(kv.data[0].y) >= 0 and max(kv.data[0].y) == 12  # the pool filled up: that is why it preempted
    assert kv.layout.yaxis.title.text == "KV blocks (blocks)"


def test_latency_cdf_uses_the_request_metrics(textbook_runs):
    _, on, _ = textbook_runs
    fig = viz.latency_cdf_figure(on.request_metrics, "en")
    ttft = sorted(m.ttft * 1000 for m in on.request_metrics.values())
    assert list(fig.data[0].x) == pytest.approx(ttft)
    assert fig.data[0].y[-1] == 1.0
    assert fig.layout.xaxis.title.text == "TTFT (ms)"


def test_ab_sentence_states_the_three_differences(textbook_runs):
    _, on, off = textbook_runs
    text = viz.ab_sentence(on.summary, off.summary, "A", "B", "en")
    numbers = [float(x) for x in re.findall(r"-?\d+\.\d", text)]
    assert numbers[:2] == [round(on.summary.itl_p99 * 1000, 1), round(off.summary.itl_p99 * 1000, 1)]
    assert "P99 TBT" in text and "TTFT" in text and "tok/s" in text
    assert "词元/秒" in viz.ab_sentence(on.summary, off.summary, "A", "B", "zh")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_builder_labels_axes_in_both_languages(textbook_runs, lang):
    _, on, _ = textbook_runs
    tr = on.traces[len(on.traces) // 2]
    figs = [viz.block_pool_figure(tr, lang), viz.block_tables_figure(tr, lang),
            viz.batch_composition_figure(on.traces, lang), viz.token_timeline_figure(on.request_metrics, lang),
            viz.itl_figure(on.request_metrics, on.traces, 0.05, lang), viz.queue_figure(on.traces, lang),
            viz.kv_usage_figure(on.traces, lang), viz.latency_cdf_figure(on.request_metrics, lang)]
    cjk = re.compile(r"[\u4e00-\u9fff]")
    for fig in figs:
        title = fig.layout.title.text
        assert title and bool(cjk.search(title)) == (lang == "zh")
        assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


# ---- i18n -----------------------------------------------------------------------------------------------------
def test_i18n_table_is_complete_and_consistent():
    fields = re.compile(r"{(\w+)")
    for key in i18n.keys():
        en, zh = i18n.t(key, "en"), i18n.t(key, "zh")
        assert en and zh, key
        assert set(fields.findall(en)) == set(fields.findall(zh)), key
    assert i18n.t("chunked_prefill", "zh") == "分块预填充"
    assert i18n.t("head_of_line_blocking", "zh") == "队首阻塞"
    assert i18n.t("sequence_slot", "zh") == "序列槽位"
    with pytest.raises(ValueError, match="lang"):
        i18n.t("prefill", "fr")
    with pytest.raises(KeyError):
        i18n.t("no-such-key", "en")


def test_summary_numbers_are_finite(textbook_runs):
    _, on, _ = textbook_runs
    s = on.summary
    for v in (s.ttft_p50, s.ttft_p99, s.tpot_p50, s.itl_p99, s.output_tok_s):
        assert math.isfinite(v) and v > 0


# ---- the defects a new user saw ----------------------------------------------------------------------------------
def _trace(step, tables, num_blocks, chunks=(), start=None, end=None):
    refs = [0] * num_blocks
    for table in tables.values():
        for b in table:
            refs[b] += 1
    used = sum(1 for n in refs if n)
    return StepTrace(step, step * 1.0 if start is None else start, step + 1.0 if end is None else end, 256,
                     list(chunks), len(tables), 0, num_blocks - used, 0, num_blocks, [], [], [], 0, 0,
                     block_tables=tables, block_ref_counts=refs, cached_block_ids=[])


def test_the_pool_view_draws_each_kv_cache_group_of_a_mixed_model():
    """Two KV cache groups, one pool each: the full-attention group's pool holds every block of the requests, the
    windowed group's only those in the window (its tables hold -1 where it released one); each figure says which
    group it draws, and a trace without a windowed group is refused clearly."""
    tr = _trace(3, {"a": [0, 1, 2, 3], "b": [4, 5]}, 8)
    tr.windowed_block_tables = {"a": [-1, -1, 0, 6], "b": [1, 2]}
    tr.windowed_block_ref_counts = [1, 1, 1, 0, 0, 0, 1, 0]
    windowed = viz.windowed_group_trace(tr)
    assert windowed.block_tables == tr.windowed_block_tables and windowed.num_free_blocks == 4
    full_fig = viz.block_pool_figure(tr, "en", kv_cache_group="full")
    windowed_fig = viz.block_pool_figure(windowed, "en", kv_cache_group="windowed")
    assert full_fig.layout.title.text.startswith("Full-attention layers' KV cache group: ")
    assert windowed_fig.layout.title.text.startswith("Sliding-window layers' KV cache group: ")
    assert "4 of 8 blocks" in windowed_fig.layout.title.text and "6 of 8 blocks" in full_fig.layout.title.text
    z = _heatmap(windowed_fig).z
    in_use = [r * len(z[0]) + c for r, row in enumerate(z) for c, v in enumerate(row) if v is not None and v >= 2]
    assert in_use == [0, 1, 2, 6]  # the windowed group's held blocks, not the full group's
    assert "滑动窗口层" in viz.block_pool_figure(windowed, "zh", kv_cache_group="windowed").layout.title.text
    with pytest.raises(ValueError, match="no windowed KV cache group"):
        viz.windowed_group_trace(_trace(0, {"a": [0]}, 4))
    with pytest.raises(ValueError, match="kv_cache_group"):
        viz.block_pool_figure(tr, "en", kv_cache_group="sliding")


def test_long_block_tables_wrap_into_readable_rows():
    tables = {"r0": list(range(3)), "r1": list(range(3, 103))}  # 100 blocks: a long prompt
    fig = viz.block_tables_figure(_trace(0, tables, 640), "en")
    hm = _heatmap(fig)
    assert len(hm.x) == 24  # 3-digit ids: 24 cells a row
    assert list(hm.y) == ["request r0", "request r1", "r1 +24", "r1 +48", "r1 +72", "r1 +96"]
    cells = [c.rstrip("*") for row in hm.text[1:] for c in row if c]
    assert cells == [str(b) for b in tables["r1"]]  # every block once, in logical order
    assert "goes on from block 24" in fig.layout.xaxis.title.text
    narrow = _heatmap(viz.block_tables_figure(_trace(0, {"r0": [1, 2]}, 32), "en"))
    assert list(narrow.y) == ["request r0"] and list(narrow.x) == [0, 1]
    with pytest.raises(ValueError, match="max_columns"):
        viz.block_tables_figure(_trace(0, tables, 640), "en", max_columns=0)


def test_grid_axes_tick_whole_cells():
    assert [viz.block_figures.integer_dtick(n) for n in (3, 6, 8, 26, 64, 128)] == [1, 1, 2, 5, 20, 50]
    fig = viz.block_pool_figure(_trace(0, {"r0": [0, 1]}, 24), "en")  # 8 columns x 3 rows
    assert (fig.layout.xaxis.dtick, fig.layout.yaxis.dtick) == (2, 1)


def test_shared_cells_in_the_block_tables_use_the_shared_colour():
    tables = {"r0": [0, 1, 2], "r1": [0, 1, 3]}  # blocks 0 and 1 shared (a prefix cache hit)
    hm = _heatmap(viz.block_tables_figure(_trace(0, tables, 8), "en"))
    assert list(hm.text[0]) == ["0*", "1*", "2"] and list(hm.text[1]) == ["0*", "1*", "3"]
    assert list(hm.z[0][:2]) == [0, 0] == list(hm.z[1][:2]) and hm.z[0][2] != hm.z[1][2]
    assert hm.colorscale[0][1] == SHARED_COLOR


def test_request_colours_are_distinct_and_never_block_colours():
    assert len(REQUEST_PALETTE) == len(set(REQUEST_PALETTE)) >= 24
    assert not {SHARED_COLOR.lower(), "#eeeeee", "#a6cee3"} & {c.lower() for c in REQUEST_PALETTE}
    assert viz.colors.request_color("r4") != viz.colors.request_color("r10")
    color = viz.colors.request_color
    assert len({color(f"dec-{i}") for i in range(len(REQUEST_PALETTE))}) == len(REQUEST_PALETTE)
    # a named request stays clear of the first numbered ones (ch04: "long" beside "dec-0".."dec-9")
    assert color("long") not in {color(f"dec-{i}") for i in range(10)}
    # a server's ids all end in the choice index "-0": the number there is not the request's
    server = [f"cmpl-{h}-0" for h in ("71418df7a3", "0b1c2d3e4f", "9f8e7d6c5b", "5a4b3c2d1e")]
    assert len({color(r) for r in server}) > 1


def _stall_run(num_requests: int, num_steps: int):
    """Hand-built: ``num_requests`` decodes, and every other step a 512-token prefill of request "p" that
    makes every decode's gap 1 s (above a 0.5 s threshold)."""
    traces, metrics = [], {}
    for i in range(num_steps):
        chunks = [ScheduledChunk(f"r{j}", 1, 8 + i, False, True) for j in range(num_requests)]
        if i % 2:
            chunks.append(ScheduledChunk("p", 512, 512 * i, True, False))
        traces.append(StepTrace(i, i * 1.0, i + 1.0 if not i % 2 else i + 1.0, 4096, chunks, num_requests, 0, 10, 0,
                                10, [], [], [], 0, 0))
    for j in range(num_requests):
        metrics[f"r{j}"] = RequestMetrics(arrival_time=0.0, first_token_time=1.0, finished_time=float(num_steps),
                                          num_output_tokens=num_steps, itls=[1.0] * (num_steps - 1))
    return traces, metrics


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_stall_labels_are_few_and_on_their_own_rows(lang):
    traces, metrics = _stall_run(num_requests=12, num_steps=30)
    stalls = viz.find_stalls(metrics, traces, 0.5, lang)
    assert len(stalls) == 12 * 29  # every gap is a stall ...
    fig = viz.itl_figure(metrics, traces, 0.5, lang)
    labels = [a for a in fig.layout.annotations if a.text[0] in viz.STALL_MARKS]
    assert len(labels) == viz.timeline_figures.MAX_STALL_LABELS  # ... but only the largest few are labelled
    assert [a.text[0] for a in labels] == list("①②③")
    rows = sorted(a.ay for a in labels)
    y_max = max(max(d.y) for d in fig.data if d.y is not None and len(d.y))
    row_h = rows[1] - rows[0]
    assert row_h > 0 and all(b - a == pytest.approx(row_h) for a, b in zip(rows, rows[1:]))
    assert rows[0] - row_h / 2 > y_max  # the label band is above every point
    assert fig.layout.yaxis.range[1] >= rows[-1] + row_h / 2
    # the labelled stalls are the ones the page's table marks
    marked = viz.labelled_stalls(stalls)
    assert [f"{viz.STALL_MARKS[i]} {s['short']}" for i, s in enumerate(marked)] == [a.text for a in labels]


def test_side_by_side_stall_labels_keep_their_rows_apart():
    """An A/B pair on one y range: a run with small stalls beside one with 10x larger ones. Built on one data top,
    the small run's label rows stay as far apart on the shared axis as the large run's (built apart, they were
    squeezed into a tenth of the height and overlapped: the measured clock's preset (a))."""
    from minengine.viz.compare import share_y_range

    small_traces, small = _stall_run(num_requests=6, num_steps=12)
    big_traces, big = _stall_run(num_requests=6, num_steps=12)
    for m in big.values():
        m.itls = [10.0] * len(m.itls)
    top = 10_000.0  # ms: the larger run's highest ITL

    def row_gaps(figs):
        share_y_range(figs)
        gaps = []
        for fig in figs:
            rows = sorted(a.ay for a in fig.layout.annotations if a.text[0] in viz.STALL_MARKS)
            assert len(rows) == 3
            gaps.append(min(b - a for a, b in zip(rows, rows[1:])) / fig.layout.yaxis.range[1])
        return gaps

    together = [viz.itl_figure(small, small_traces, 0.5, y_top_ms=top), viz.itl_figure(big, big_traces, 0.5)]
    assert min(row_gaps(together)) > 0.05  # each row at least 5 % of the plot's height apart
    apart = [viz.itl_figure(small, small_traces, 0.5), viz.itl_figure(big, big_traces, 0.5)]
    assert row_gaps(apart)[0] < 0.02  # what the page drew before


def test_auto_stall_threshold_is_a_multiple_of_the_median_itl():
    def m(itls):
        return RequestMetrics(arrival_time=0.0, first_token_time=1.0, finished_time=2.0,
                              num_output_tokens=len(itls) + 1, itls=itls)
    assert viz.auto_stall_threshold({"a": m([0.01, 0.01, 0.5]), "b": m([0.02])}) == pytest.approx(3 * 0.015)
    assert viz.auto_stall_threshold({"a": m([0.01, 0.03, 1.0])}, factor=2) == pytest.approx(0.06)
    assert viz.auto_stall_threshold({"a": m([])}) == 0.0
    with pytest.raises(ValueError, match="factor"):
        viz.auto_stall_threshold({}, factor=0)


def test_labelled_stalls_one_per_causing_step_largest_first():
    stalls = [{"step": 3, "itl_s": 0.2, "time_s": 1.0}, {"step": 3, "itl_s": 0.9, "time_s": 1.0},
              {"step": 7, "itl_s": 0.5, "time_s": 2.0}, {"step": 9, "itl_s": 0.1, "time_s": 3.0}]
    assert [(s["step"], s["itl_s"]) for s in viz.labelled_stalls(stalls, 2)] == [(3, 0.9), (7, 0.5)]
    assert viz.labelled_stalls(stalls, 0) == []
    with pytest.raises(ValueError, match="max_labels"):
        viz.labelled_stalls(stalls, 11)


def test_percentile_labels_sit_low_and_apart(textbook_runs):
    _, on, _ = textbook_runs
    fig = viz.latency_cdf_figure(on.request_metrics, "en")
    marks = [a for a in fig.layout.annotations if a.text in ("P50", "P95", "P99")]
    assert len(marks) == 6  # two subplots
    for col in ("x", "x2"):
        ys = sorted(a.y for a in marks if a.xref == col)
        assert len(ys) == 3 and ys[-1] < 0.5 and min(b - a for a, b in zip(ys, ys[1:])) >= 0.1
    titles = [a for a in fig.layout.annotations if a.text in ("TTFT (ms)", "TPOT (ms)")]
    assert len(titles) == 2 and all(a.yref == "paper" and a.y >= 1 for a in titles)  # above the plots


def test_time_figures_name_the_clock(textbook_runs):
    _, on, _ = textbook_runs
    label = "modelled: H100 SXM, Llama-3-8B shapes"
    figs = [viz.token_timeline_figure(on.request_metrics, "en", clock_label=label),
            viz.step_token_timeline_figure(on.traces, "en", clock_label=label),
            viz.itl_figure(on.request_metrics, on.traces, 0.05, "en", clock_label=label),
            viz.queue_figure(on.traces, "en", clock_label=label),
            viz.kv_usage_figure(on.traces, "en", clock_label=label),
            viz.latency_cdf_figure(on.request_metrics, "en", clock_label=label)]
    for fig in figs:
        assert fig.layout.title.subtitle.text == label and fig.layout.margin.t >= 80
    assert viz.queue_figure(on.traces, "en").layout.title.subtitle.text is None


# ---- the live view: a stream of StepTraces ---------------------------------------------------------------------
def test_step_stream_gives_the_same_token_times_as_the_request_metrics(textbook_runs):
    _, on, off = textbook_runs
    for res in (on, off):
        from_steps = viz.step_token_times(res.traces)
        assert set(from_steps) == set(res.request_metrics)
        for rid, (first_scheduled, times) in from_steps.items():
            m = res.request_metrics[rid]
            assert times == pytest.approx(viz.timeline_figures.token_times(m))
            assert first_scheduled >= m.arrival_time
    fig = viz.step_token_timeline_figure(on.traces[:10], "en")
    assert sum(len(d.x) for d in fig.data if d.showlegend is not False) == sum(
        1 for tr in on.traces[:10] for c in tr.chunks if c.sampled)


def test_workload_run_streams_the_same_steps_as_a_whole_run(model):
    wl = presets.memory_pressure(num_requests=4, prompt_len=32, output_len=16)
    config = DashboardConfig(num_kv_blocks=8, max_num_seqs=4, enable_prefix_caching=False, model=model)
    whole = run_workload(config, wl)
    run = WorkloadRun(config, wl)
    got = []
    while not run.done:
        new = run.poll(3)
        assert len(new) <= 3
        got += new
    assert [[(c.request_id, c.num_tokens) for c in tr.chunks] for tr in got] == \
        [[(c.request_id, c.num_tokens) for c in tr.chunks] for tr in whole.traces]
    assert run.poll(5) == [] and run.step() is None
    res = run.result()
    assert res.summary.num_requests == 4 and res.summary.num_preemptions == whole.summary.num_preemptions
    with pytest.raises(RuntimeError, match="not finished"):
        WorkloadRun(config, wl).result()


class _FakeStream:
    """A TraceStream of ``n`` one-second steps; counts how often it was polled."""

    def __init__(self, n):
        self.left, self.polls, self.done, self.step = n, 0, n == 0, 0

    def poll(self, max_steps, budget_s=math.inf):
        self.polls += 1
        k = min(max_steps, self.left)
        out = [StepTrace(self.step + i, 0.0, 0.0, 8, [], 0, 0, 1, 0, 1, [], [], [], 0, 0) for i in range(k)]
        self.step += k
        self.left -= k
        self.done = self.left == 0
        return out


def test_live_player_paces_pauses_resumes_and_finishes():
    now = [0.0]
    stream = _FakeStream(100)
    player = LivePlayer(stream, speed=4, timer=lambda: now[0])
    assert len(player.tick()) == 1  # the first tick shows a step at once
    for _ in range(8):  # 2 s at 4 steps/s, ticking every 0.25 s: one step per tick
        now[0] += 0.25
        assert len(player.tick()) == 1
    assert len(player.traces) == 9
    player.pause()
    polls = stream.polls
    for _ in range(5):
        now[0] += 1.0
        assert player.tick() == []
    assert stream.polls == polls  # a paused player does not ask the stream (a local engine does not step)
    player.resume()
    assert len(player.tick()) == 1  # at once, but the paused seconds are not owed
    now[0] += 10.0
    assert len(player.tick()) <= 4 * 4 * 0.4 + 1  # after a long gap, at most a few ticks' worth
    player.speed = 0  # full speed: all that is left
    now[0] += 0.25
    player.tick()
    assert player.done and [tr.step for tr in player.traces] == list(range(100))
    assert player.tick() == []
    with pytest.raises(ValueError, match="speed"):
        player.speed = -1
    other = LivePlayer(_FakeStream(7), timer=lambda: now[0])
    other.finish()
    assert other.done and len(other.traces) == 7


class _CostlyStream(_FakeStream):
    """Steps that take ``cost_s`` seconds each on the fake clock ``now``: a poll stops once its budget is spent
    (at least one step), as ``WorkloadRun.poll`` does."""

    def __init__(self, n, now, cost_s):
        super().__init__(n)
        self.now, self.cost_s = now, cost_s

    def poll(self, max_steps, budget_s=math.inf):
        deadline, out = self.now[0] + budget_s, []
        while len(out) < max_steps and not self.done:
            out += super().poll(1)
            self.now[0] += self.cost_s
            if self.now[0] >= deadline:
                break
        return out


@settings(max_examples=60, deadline=None)
@given(speed=hst.sampled_from([s for s in SPEEDS if s]), cost_s=hst.sampled_from([0.0, 0.01, 0.05, 0.2, 0.6]),
       gap_s=hst.sampled_from([0.1, 0.4, 0.9, 2.5]), num_ticks=hst.integers(2, 12))
def test_live_player_reports_the_speed_it_really_plays(speed, cost_s, gap_s, num_ticks):
    """The played speed is the measured ticks' steps over the real time between them, whatever slows the ticks
    (steps that cost real time, a page that ticks late); it is said to fall short exactly when steps were
    dropped, and surely when it plays below 90 % by more than one tick's rounding."""
    now = [0.0]
    player = LivePlayer(_CostlyStream(10_000, now, cost_s), speed=speed, timer=lambda: now[0])
    starts, counts = [], []
    for _ in range(num_ticks):
        starts.append(now[0])
        counts.append(len(player.tick()))
        now[0] += gap_s
    elapsed = starts[-1] - starts[0]
    if elapsed < MEASURE_MIN_S:
        assert player.played_speed is None and not player.falls_short
        return
    if elapsed - (starts[1] - starts[0]) >= MEASURE_WINDOW_S:
        return  # older ticks left the window; the window's own arithmetic is covered by the case below
    played = sum(counts[1:]) / elapsed
    assert player.played_speed == pytest.approx(played)
    # Every owed step fits its tick's budget and no tick is late: a tick's own polling delays the next one, so
    # the ticks settle at a period of gap / (1 - cost * speed), whose owed steps must fit the budget (a margin
    # for rounding); the first ticks are shorter.
    load = cost_s * speed
    period = gap_s / (1 - load) if load < 1 else math.inf
    fast = load * period <= 0.9 * player.budget_s and period <= 4 * TICK_S
    if fast:
        assert not player.falls_short
    if played < 0.9 * speed - 1 / elapsed:
        assert player.falls_short
    player.speed = 0
    assert player.played_speed is None and not player.falls_short  # a new speed is measured afresh


def test_live_player_measures_the_last_seconds_only():
    now = [0.0]
    player = LivePlayer(_CostlyStream(10_000, now, 0.0), speed=10, timer=lambda: now[0])
    for _ in range(20):  # 8 s at full pace
        player.tick()
        now[0] += 0.4
    assert player.played_speed == pytest.approx(10, rel=0.05) and not player.falls_short
    player.stream.cost_s = 0.2  # the machine gets busy: each step now takes 0.2 s of the 0.5 s budget
    for _ in range(20):
        player.tick()
        now[0] += 0.4
    assert player.played_speed < 5 and player.falls_short


class _SlowStream(_FakeStream):
    """A stream that sleeps inside ``poll`` and records whether two callers were ever inside it at once."""

    def __init__(self, n):
        super().__init__(n)
        self.inside, self.overlapped = 0, False

    def poll(self, max_steps, budget_s=math.inf):
        self.inside += 1
        self.overlapped |= self.inside > 1
        time.sleep(0.002)
        try:
            return super().poll(min(max_steps, 3), budget_s)
        finally:
            self.inside -= 1


def test_live_player_never_polls_its_stream_from_two_threads():
    """Streamlit can run the live fragment's tick and a full rerun's "Finish now" at once (seen: two threads
    stepping one engine, a KeyError in the detokenizer and a failed rollback): the player serialises them."""
    for _ in range(5):
        stream = _SlowStream(60)
        player = LivePlayer(stream, speed=0)
        ticker = threading.Thread(target=lambda p=player: [p.tick() for _ in range(40)])
        ticker.start()
        time.sleep(0.003)
        player.finish()
        ticker.join()
        assert not stream.overlapped
        assert player.done and [tr.step for tr in player.traces] == list(range(60))


def test_trace_from_dict_round_trips_json(textbook_runs):
    _, on, _ = textbook_runs
    for tr in on.traces[:5]:
        again = trace_from_dict(json.loads(json.dumps(tr.to_dict())))
        assert again == tr
    with pytest.raises(ValueError, match="StepTrace"):
        trace_from_dict({"step": 1})


# ---- the lessons, as properties of the workloads (no clock involved) -----------------------------------------------
def test_preset_b_shares_blocks_whatever_the_machine_speed(model):
    wl = presets.shared_system_prompt()
    assert [r.arrival_step for r in wl.requests] == [2 * i for i in range(8)]  # by step, not by second
    res = run_workload(DashboardConfig(model=model, **presets.PRESET_ENGINE_DEFAULTS["b"]), wl)
    shared_steps = [tr.step for tr in res.traces if max(tr.block_ref_counts) > 1]
    assert len(shared_steps) > len(res.traces) // 2
    # the system prompt's full blocks (256 / 16 = 16) are held by several requests at once
    assert max(sum(1 for n in tr.block_ref_counts if n > 1) for tr in res.traces) >= 15
    with pytest.raises(ValueError, match="arrival_every_steps"):
        presets.shared_system_prompt(output_len=4, arrival_every_steps=4)


def test_preset_c_preempts(model):
    res = run_workload(DashboardConfig(model=model, **presets.PRESET_ENGINE_DEFAULTS["c"]), presets.memory_pressure())
    assert res.summary.num_preemptions > 0
    assert any(tr.preempted_ids for tr in res.traces)


# ---- the lessons on modelled time (minengine.timing): the same numbers on every machine ---------------------------
def _preset_a(model, clock, chunked, scale=0.25):
    config = DashboardConfig(model=model, clock=clock, **{**presets.PRESET_ENGINE_DEFAULTS["a"],
                                                          "enable_chunked_prefill": chunked})
    return run_workload(config, presets.textbook_long_prompt(long_prompt_scale=scale))


@pytest.mark.parametrize("clock", [ClockSpec("modelled", hardware="h100", model="llama-3-8b"),
                                   ClockSpec("modelled", hardware="l4", model="qwen2.5-7b"),
                                   ClockSpec("modelled", hardware="a100", model="llama-3-70b", tp=4)],
                         ids=["h100-llama8b", "l4-qwen7b", "a100-llama70b-tp4"])
def test_preset_a_chunked_prefill_lowers_p99_tbt_on_modelled_time(model, clock):
    on, off = _preset_a(model, clock, True), _preset_a(model, clock, False)
    assert on.clock_label == off.clock_label == clock.label
    assert on.summary.itl_p99 < off.summary.itl_p99 / 2  # the textbook lesson, by a wide margin
    # the stall is the long prompt's one-step prefill, and it is what the figure labels first
    stalls = viz.find_stalls(off.request_metrics, off.traces, viz.auto_stall_threshold(off.request_metrics))
    first = viz.labelled_stalls(stalls)[0]
    assert first["kind"] == "prefill" and first["cause_request_id"] == "r10" and first["cause_tokens"] == 2000


def test_modelled_runs_are_identical_even_beside_a_busy_loop(model):
    clock = ClockSpec("modelled", hardware="h100", model="llama-3-8b")
    quiet = _preset_a(model, clock, False, scale=1 / 16)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a busy neighbour on this machine
    try:
        busy = _preset_a(model, clock, False, scale=1 / 16)
    finally:
        hog.kill()
        hog.wait()
    assert busy.summary == quiet.summary
    assert [tr.end_time for tr in busy.traces] == [tr.end_time for tr in quiet.traces]


def test_measured_cpu_clock_is_selectable(model):
    wl = presets.memory_pressure(num_requests=2, prompt_len=16, output_len=4)
    res = run_workload(DashboardConfig(model=model, clock=ClockSpec("cpu")), wl)
    assert res.clock_label == "measured: CPU time"
    assert all(tr.duration > 0 for tr in res.traces)
    with pytest.raises(ValueError, match="clock"):
        DashboardConfig(clock=ClockSpec("wall")).validate()


def test_clock_labels_in_both_languages():
    spec = ClockSpec("modelled", hardware="h100", model="llama-3-70b", tp=8)
    assert clock_label(spec, "en") == "modelled: H100 SXM, Llama-3-70B shapes, TP 8"
    assert clock_label(spec, "zh") == "建模：H100 SXM 上的 Llama-3-70B 形状，TP 8"
    assert clock_label(ClockSpec("cpu"), "zh") == "实测：CPU 时间"


def test_dashboard_chinese_follows_the_course_glossary():
    """Token is 词元 (never 令牌) and a prefill chunk is 分块 (块 alone is the KV block), as in the course."""
    for key in i18n.keys():
        english, chinese = i18n.t(key, "en"), i18n.t(key, "zh")
        assert "令牌" not in chinese, f"{key}: 令牌 -> 词元 in {chinese!r}"
        if "prefill chunk" in english:
            assert "分块" in chinese, f"{key}: chunk -> 分块 in {chinese!r}"


# ---- speculative decoding and predictive scheduling ----------------------------------------------------------
def test_batch_bars_mark_accepted_and_rejected_proposals():
    """A hand-built step: r0 decodes verifying 4 proposals (3 accepted, 1 rejected), r1 a plain decode, r2 a
    prefill chunk. The bars split r0's 5 tokens into its own (solid), accepted (dotted) and rejected (crossed)."""
    chunks = [ScheduledChunk("r0", 5, 40, False, True, 4, 3), ScheduledChunk("r1", 1, 30, False, True),
              ScheduledChunk("r2", 16, 0, True, False)]
    tr = StepTrace(0, 0.0, 1.0, 32, chunks, 3, 0, 10, 0, 10, [], [], [], 0, 0)
    fig = viz.batch_composition_figure([tr], "en")
    bars = {(d.name, shape): y for d in fig.data if d.type == "bar" and d.y != (None,)
            for y, shape in zip(d.y, d.marker.pattern.shape)}
    # the two patterns' legend entries: empty bars, one each, with the bars' patterns
    legend = {d.name: d.marker.pattern.shape for d in fig.data if d.type == "bar" and d.y == (None,)}
    assert legend == {"accepted proposals (dotted)": ".", "rejected proposals (crossed)": "x"}
    assert bars == {("request r0", ""): 1, ("r0 accepted proposals", "."): 3, ("r0 rejected proposals", "x"): 1,
                    ("request r1", ""): 1, ("request r2", "/"): 16}
    assert sum(bars.values()) == tr.num_scheduled_tokens  # proposals count in the token budget
    hover = next(d for d in fig.data if d.name == "r0 rejected proposals")
    assert list(hover.customdata[0]) == [4, 3, 1] and "proposed" in hover.hovertemplate
    assert viz.batch_composition_figure([tr], "zh").data[1].name.endswith("被接受的提议")


def test_predicted_vs_true_and_policy_latency_figures():
    fig = viz.predicted_vs_true_figure([10, 100, 400], [20, 90, 100], "en", name="learned")
    assert list(fig.data[0].x) == [10, 100, 400] and list(fig.data[0].y) == [20, 90, 100]
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis.title.text.endswith("(tokens)")
    assert list(fig.data[1].y) == [10, 400]  # y = x over the data's range
    with pytest.raises(ValueError, match="one prediction"):
        viz.predicted_vs_true_figure([1, 2], [1])
    with pytest.raises(ValueError, match=">= 1"):
        viz.predicted_vs_true_figure([0], [1])
    rows = [{"label": "FCFS", "ttft_mean": 1.0, "ttft_p99": 5.0, "e2e_mean": 3.0, "e2e_p99": 9.0, "preemptions": 7},
            {"label": "SPF", "ttft_mean": 0.5, "ttft_p99": 6.0, "e2e_mean": 2.0, "e2e_p99": 10.0, "preemptions": 3}]
    fig = viz.policy_latency_figure(rows, "zh", clock_label="modelled")
    assert [d.name for d in fig.data] == ["mean TTFT", "P99 TTFT", "mean E2E", "P99 E2E"]
    assert list(fig.data[2].y) == [3.0, 2.0] and list(fig.data[0].x) == ["FCFS", "SPF"]
    assert "延迟" in fig.layout.title.text and "modelled" in fig.layout.title.text
    with pytest.raises(ValueError, match="lacks"):
        viz.policy_latency_figure([{"label": "x"}])

"""minengine.viz: figure builders, stall finder, i18n and the dashboard runner, on real small engine runs
(the bundled model, or ``$MINENGINE_MODEL``) plus one hand-built trace where the expected answer is exact."""

from __future__ import annotations

import math
import re

import pytest

pytest.importorskip("plotly")

import minengine.viz as viz  # noqa: E402
from minengine.metrics.trace import ScheduledChunk, StepTrace  # noqa: E402
from minengine.outputs import RequestMetrics  # noqa: E402
from minengine.viz import i18n, presets  # noqa: E402
from minengine.viz.runner import DashboardConfig, run_workload  # noqa: E402
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
    assert any("500-token prefill of request r4" in a.text for a in fig.layout.annotations)
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
    assert zh[1]["cause"] == "第 2 步：请求 7 的 2,048 令牌预填充"
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
    assert "令牌/秒" in viz.ab_sentence(on.summary, off.summary, "A", "B", "zh")


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

"""Every dashboard preset teaches its own lesson: its A/B comparison (``presets.PRESET_COMPARISON``), run on the
page's default settings and clock, moves what the preset is about, checked as relations (A below or above B),
never as modelled times (a cost-model refit changes those); and no caption the page builds for a preset's run
mentions something that run does not have."""

from __future__ import annotations

import pytest

pytest.importorskip("plotly")

from minengine.viz import captions, presets  # noqa: E402
from minengine.viz.i18n import t  # noqa: E402
from minengine.viz.runner import DashboardConfig, run_workload  # noqa: E402
from minengine.workloads import azure_conv_path, find_data_dir, load_azure_trace  # noqa: E402
from tests.dashboard_model import dashboard_model  # noqa: E402


def workload(preset: str):
    """The preset's workload as the page builds it by default ((a) at 1/8 scale to keep the test short)."""
    if preset == "a":
        return presets.textbook_long_prompt(long_prompt_scale=1 / 8)
    if preset == "b":
        return presets.shared_system_prompt()
    if preset == "c":
        return presets.memory_pressure()
    if preset == "d":
        path = azure_conv_path(find_data_dir())
        if path is None:
            pytest.skip("Azure trace absent (../shared/data)")
        return presets.from_trace(list(load_azure_trace(str(path), max_requests=40, length_scale=1 / 8)), 1 / 8,
                                  speedup=presets.TRACE_SPEEDUP)
    if preset == "e":
        return presets.custom()
    return presets.speculative_decoding()


@pytest.fixture(scope="module", params=presets.PRESETS)
def ab(request):
    preset = request.param
    config = DashboardConfig(**presets.PRESET_ENGINE_DEFAULTS[preset], model=dashboard_model())
    comparison = presets.COMPARISONS[presets.PRESET_COMPARISON[preset]]
    config_a, config_b = comparison.configs(config)
    wl = workload(preset)
    return preset, comparison, run_workload(config_a, wl), run_workload(config_b, wl)


def tokens(res) -> int:
    return sum(tr.num_scheduled_tokens for tr in res.traces)


def test_each_preset_opens_on_a_comparison_of_its_own():
    assert set(presets.PRESET_COMPARISON) == set(presets.PRESETS)
    assert len(set(presets.PRESET_COMPARISON.values())) == len(presets.PRESETS)  # no two presets share one
    for name, c in presets.COMPARISONS.items():
        assert c.a != c.b and hasattr(DashboardConfig(), c.field), name
        a, b = c.configs(DashboardConfig())
        assert getattr(a, c.field) == c.a and getattr(b, c.field) == c.b
        for lang in ("en", "zh"):
            assert t(f"ab_{name}_a", lang) and t(f"ab_{name}_b", lang) and t(f"ab_look_{name}", lang)


def test_the_comparison_moves_what_the_preset_teaches(ab):
    preset, comparison, a, b = ab
    sa, sb = a.summary, b.summary
    assert sa.num_requests == sb.num_requests and all(m.finished_time for m in b.request_metrics.values())
    if preset == "a":  # chunked prefill: the long prompt no longer stalls every decode
        assert sa.itl_p99 < 0.7 * sb.itl_p99
    elif preset == "b":  # prefix caching: later chats skip the shared system prompt
        assert sa.ttft_p99 < 0.7 * sb.ttft_p99 and tokens(a) < 0.7 * tokens(b) and sa.prefix_hit_tokens > 0
    elif preset == "c":  # recompute prefills victims again; swap copies their blocks out and back
        assert sa.num_preemptions > 0 and sb.num_preemptions > 0
        assert sa.num_swapped_out_blocks == 0 < sb.num_swapped_out_blocks
        assert tokens(a) > tokens(b)
    elif preset == "d":  # sequence slots: with 4, the trace's arrivals queue
        assert sa.ttft_p99 < 0.5 * sb.ttft_p99 and sa.output_tok_s > 1.1 * sb.output_tok_s
        assert max(tr.num_waiting for tr in a.traces) > 0  # the speed-up makes a queue even with 16 slots
        assert max(tr.num_running for tr in a.traces) > 4
    elif preset == "e":  # a bigger token budget admits prompts sooner
        assert sa.ttft_p99 < 0.7 * sb.ttft_p99
    else:  # speculation: accepted proposals give several tokens per step
        assert sa.spec_accepted_tokens > 0 and sa.num_steps < 0.9 * sb.num_steps


def features_of(res) -> set[str]:
    """The run's features, computed here from the traces independently of ``captions.run_features``."""
    found = set()
    trs = res.traces
    if any(c.is_prefill and not c.sampled for tr in trs for c in tr.chunks):
        found.add("chunked")
    if res.summary.prefix_hit_tokens:
        found.add("prefix_hit")
    if any(n > 1 for tr in trs for n in (tr.block_ref_counts or ())):
        found.add("shared")
    if any(tr.num_cached_free_blocks for tr in trs):
        found.add("cached")
    if res.summary.num_preemptions:
        found.add("preempted")
    if res.summary.num_swapped_out_blocks:
        found.add("swapped")
    if res.summary.spec_draft_tokens:
        found.add("spec")
    if any(tr.num_waiting for tr in trs):
        found.add("waiting")
    return found


# words a caption may use only when the run has the feature (English, 中文)
MENTIONS = {
    "long prompt": "long_prompt", "长提示": "long_prompt",
    "shared": "shared", "共享": "shared",
    "cached prefix": "cached", "cached-but-free": "cached", "缓存前缀": "cached", "已缓存但空闲": "cached",
    "preempt": "preempted", "抢占": "preempted",
    "swap": "swapped", "换出": "swapped",
    "proposal": "spec", "提议": "spec",
    "split over several steps": "chunked", "hatched chunks": "chunked", "拆到多步": "chunked",
    "prefix cache hit": "prefix_hit", "前缀缓存命中": "prefix_hit",
    "new requests wait": "waiting", "waiting grows": "waiting", "新请求只能等待": "waiting", "等待数增加": "waiting",
}


def page_captions(preset: str, res, lang: str) -> list[str]:
    f = captions.run_features(res.traces)
    return [captions.block_pool_caption(f, lang), captions.block_tables_caption(f, lang),
            captions.batch_caption(f, preset, lang), captions.queue_caption(f, lang), captions.kv_caption(f, lang)]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_no_caption_mentions_what_its_run_lacks(ab, lang):
    preset, _, a, b = ab
    for res in (a, b):
        have = features_of(res) | ({"long_prompt"} if preset == "a" else set())
        assert captions.run_features(res.traces) <= set(captions.FEATURES)
        for text in page_captions(preset, res, lang):
            for word, feature in MENTIONS.items():
                if word in text:
                    assert feature in have, f"({preset}) caption mentions {word!r} without {feature}: {text}"
    # and each preset's own lesson is in its batch caption
    batch = page_captions(preset, a, "en")[2]
    want = {"a": "long prompt", "b": "prefix cache hit", "c": "preemption", "d": "new requests wait",
            "e": "new requests wait",
            "f": "proposals"}[preset]
    assert want in batch, batch

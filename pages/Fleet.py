"""The dashboard's Fleet page: the engine's own scheduler on many modelled GPUs (``minengine.fleet``).

``app.py`` lists this file as "Fleet" beside its own "Scheduler" page (``st.navigation``); it also runs alone.
No fleet logic here: the page reads controls, builds a ``FleetConfig`` (optionally with the fleet's KV store) and
a trace window, runs ``simulate`` (cached on both) and draws the result with ``minengine.viz.fleet_figures``
(replicas and the store as lanes of KV use and queue length, where prompt tokens came from against the window's
infinite-cache ideal) and ``minengine.viz``.
"""

from __future__ import annotations

import streamlit as st

from minengine.fleet import (
    LINKS,
    ROUTERS,
    FleetConfig,
    FleetResult,
    KVStoreConfig,
    PercentileSLO,
    infinite_cache_hits,
    simulate,
)
from minengine.timing.hardware import HARDWARE
from minengine.timing.model_shape import MODEL_SHAPES
from minengine.viz import latency_cdf_figure
from minengine.viz.fleet_figures import (
    fleet_description,
    fleet_lanes_figure,
    fleet_load_figure,
    ft,
    prompt_sources_figure,
)
from minengine.workloads import (
    find_data_dir,
    load_azure_trace,
    load_mooncake_trace,
    speed_up,
    synthetic_trace,
)
from minengine.workloads.traces import azure_conv_path, mooncake_path

RATE_MULTIPLIERS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
GPU_PRESETS = [k for k in HARDWARE if k != "cpu"]


@st.cache_data(show_spinner=False, max_entries=16)
def cached_trace(name: str, num_requests: int, multiplier: float, vocab_size: int):
    """The first ``num_requests`` requests of a trace, arrivals ``multiplier`` x faster."""
    data = find_data_dir()
    if name == "azure":
        trace = load_azure_trace(azure_conv_path(data), max_requests=num_requests)
    elif name == "mooncake":
        trace = load_mooncake_trace(mooncake_path(data), max_requests=num_requests, vocab_size=vocab_size)
    else:
        trace = synthetic_trace(num_requests, rate=5.0, prompt_len=1024, output_len=200, range_ratio=0.9)
    return speed_up(trace, multiplier) if multiplier != 1 else trace


@st.cache_data(show_spinner=False, max_entries=16)
def cached_ideal(name: str, num_requests: int, multiplier: float, vocab_size: int, block_size: int,
                 max_model_len: int) -> float:
    """The trace window's infinite-cache ideal hit share (a fraction)."""
    trace = cached_trace(name, num_requests, multiplier, vocab_size)
    return infinite_cache_hits(trace, block_size, max_model_len).hit_rate


@st.cache_data(show_spinner=False, max_entries=16)
def cached_simulation(config: FleetConfig, name: str, num_requests: int, multiplier: float) -> FleetResult:
    return simulate(cached_trace(name, num_requests, multiplier, config.shape.vocab_size), config)


def controls(lang: str) -> tuple[FleetConfig | None, tuple, PercentileSLO, str | None]:
    """The sidebar: returns (config or None, trace choice, SLO, error message or None)."""
    sb = st.sidebar
    sb.subheader(ft("workload", lang))
    data = find_data_dir()
    names = ["azure", "mooncake"] if azure_conv_path(data) and mooncake_path(data) else ["synthetic"]
    if names == ["synthetic"]:
        sb.info(ft("trace_missing", lang))
    name = sb.selectbox(ft("trace", lang), names, key="fleet_trace", format_func=lambda n: ft(f"trace_{n}", lang))
    num = int(sb.number_input(ft("num_requests", lang), min_value=10, max_value=20_000, value=600, step=100,
                              key="fleet_n"))
    mult = sb.select_slider(ft("rate_multiplier", lang), RATE_MULTIPLIERS, value=4.0, key="fleet_k",
                            format_func=lambda k: f"{k:g}x")
    sb.subheader(ft("fleet", lang))
    hardware = sb.selectbox(ft("hardware", lang), GPU_PRESETS, key="fleet_hw",
                            format_func=lambda k: HARDWARE[k].name)
    shape = sb.selectbox(ft("model_shape", lang), list(MODEL_SHAPES), key="fleet_model",
                         format_func=lambda k: MODEL_SHAPES[k].name)
    tp = sb.selectbox(ft("tp", lang), [1, 2, 4, 8], key="fleet_tp")
    layout = sb.radio(ft("layout", lang), ["colocated", "disaggregated"], horizontal=True, key="fleet_layout",
                      format_func=lambda x: ft(x, lang))
    gpus = int(sb.number_input(ft("num_gpus", lang), min_value=1, max_value=64, value=4, key="fleet_gpus"))
    routers = list(ROUTERS)
    router = sb.selectbox(ft("router", lang), routers, index=routers.index("least-outstanding-tokens"),
                          key="fleet_router")
    num_prefill, decode_router, link = 0, "least-outstanding-tokens", "ib-400g"
    replicas = gpus // tp
    if layout == "disaggregated":
        num_prefill = 1
        if replicas >= 3:  # a slider needs two distinct ends
            num_prefill = int(sb.slider(ft("num_prefill", lang), 1, replicas - 1, replicas // 2, key="fleet_p"))
        decode_router = sb.selectbox(ft("decode_router", lang), routers, index=routers.index(decode_router),
                                     key="fleet_drouter")
        link = sb.selectbox(ft("link", lang), list(LINKS), index=list(LINKS).index(link), key="fleet_link",
                            format_func=lambda k: LINKS[k].name)
    sb.subheader(ft("store_section", lang))
    kinds = ["none", "dram", "ssd"]
    kind = sb.radio(ft("store_kind", lang), kinds, key="fleet_store", format_func=lambda k: ft(f"store_{k}", lang))
    store = None
    if kind != "none":
        dram_gb = sb.number_input(ft("store_dram_gb", lang), min_value=1.0, max_value=100_000.0, value=1000.0,
                                  key="fleet_store_dram")
        ssd_tb = 0.0
        if kind == "ssd":
            ssd_tb = sb.number_input(ft("store_ssd_tb", lang), min_value=0.1, max_value=1000.0, value=4.0,
                                     key="fleet_store_ssd")
        per_node = int(sb.number_input(ft("store_gpus_per_node", lang), min_value=1, max_value=64, value=8,
                                       key="fleet_store_gpn"))
        links = [k for k in LINKS if k != "infinite"]
        store_link = sb.selectbox(ft("store_link", lang), links, key="fleet_store_link",
                                  format_func=lambda k: LINKS[k].name, index=links.index("ib-400g"))
        store = (dram_gb * 1e9, ssd_tb * 1e12, per_node, store_link)
    sb.subheader(ft("slo", lang))
    ttft = sb.number_input(ft("slo_ttft", lang), min_value=1.0, max_value=100_000.0, value=250.0, key="fleet_ttft")
    tpot = sb.number_input(ft("slo_tpot", lang), min_value=1.0, max_value=10_000.0, value=100.0, key="fleet_tpot")
    slo = PercentileSLO(ttft_s=ttft / 1000, tpot_s=tpot / 1000)
    try:
        if gpus % tp:
            raise ValueError(f"{gpus} GPUs are not a multiple of tensor parallelism {tp}")
        kv_store = None
        if store is not None:
            dram, ssd, per_node, store_link = store
            kv_store = KVStoreConfig(dram_bytes_per_node=dram, ssd_bytes_per_node=ssd, gpus_per_node=per_node,
                                     link=store_link)
        common = dict(model=shape, router=router, decode_router=decode_router, link=link, kv_store=kv_store)
        if layout == "colocated":
            config = FleetConfig.colocated(replicas, hardware=hardware, tp=tp, **common)
        else:
            if replicas < 2:
                raise ValueError("a disaggregated fleet needs at least 2 replicas (one prefill, one decode)")
            config = FleetConfig.disaggregated(num_prefill, replicas - num_prefill, hardware=hardware, tp=tp,
                                               **common)
        config.num_kv_blocks(config.replicas[0])  # the weights must fit
    except ValueError as exc:
        return None, (name, num, mult), slo, str(exc)
    return config, (name, num, mult), slo, None


def results(res: FleetResult, slo: PercentileSLO, lang: str, ideal: float) -> None:
    st.caption(fleet_description(res.config, lang))
    st.caption(ft("sim_speed", lang).format(requests=len(res.request_metrics), sim=res.duration_s,
                                            cpu=res.cpu_time_s, steps=res.num_steps, rate=res.steps_per_second))
    ms = 1000
    cols = st.columns(3)
    cols[0].metric(ft("m_ttft", lang), f"{res.latency('ttft', 50) * ms:,.0f} / {res.latency('ttft', 90) * ms:,.0f}")
    cols[1].metric(ft("m_tpot", lang), f"{res.latency('tpot', 50) * ms:.1f} / {res.latency('tpot', 90) * ms:.1f}")
    met = ft("yes" if res.meets_percentile_slo(slo) else "no", lang)
    cols[2].metric(ft("m_slo", lang), f"{met} · {res.attainment(slo):.0%}")
    cols = st.columns(3)
    cols[0].metric(ft("m_hit", lang), f"{res.prefix_hit_rate:.1%}")
    cols[1].metric(ft("m_imbalance", lang), f"{res.load_imbalance():.2f}")
    cols[2].metric(ft("m_transfers", lang), f"{res.transfers.count:,} ({res.transfers.mean_time_s * ms:.2f})")
    if res.store is not None:
        s = res.store
        cols = st.columns(3)
        cols[0].metric(ft("m_store_hit", lang), f"{res.store_hit_rate:.1%}")
        cols[1].metric(ft("m_store_bytes", lang), f"{s.loaded_bytes / 1e9:,.1f} / {s.written_bytes / 1e9:,.1f}")
        cols[2].metric(ft("m_store_loads", lang), f"{s.num_loads:,} ({s.declined_loads:,})")
    st.plotly_chart(fleet_lanes_figure(res, "kv", lang), key="fleet_kv")
    st.plotly_chart(fleet_lanes_figure(res, "queue", lang), key="fleet_queue")
    st.caption(ft("cap_lanes", lang))
    left, right = st.columns(2)
    with left:
        st.plotly_chart(fleet_load_figure(res, lang), key="fleet_load")
    with right:
        st.plotly_chart(latency_cdf_figure(res.request_metrics, lang), key="fleet_latency")
    st.plotly_chart(prompt_sources_figure({res.config.router: res}, ideal, lang), key="fleet_sources")
    st.caption(ft("cap_sources", lang))


def main() -> None:
    st.set_page_config(page_title="minengine fleet", layout="wide")
    lang = st.sidebar.radio("Language / 语言", ["en", "zh"], horizontal=True, key="fleet_lang",
                            format_func=lambda x: {"en": "English", "zh": "中文"}[x])
    st.title(ft("page_title", lang))
    st.write(ft("page_intro", lang))
    config, trace_choice, slo, error = controls(lang)
    if error is not None:
        st.error(ft("bad_input", lang).format(error=error))
        return
    if st.button(ft("run", lang), type="primary", key="fleet_run"):
        st.session_state["fleet_submitted"] = (config, trace_choice, slo)
    if "fleet_submitted" not in st.session_state:
        st.write(ft("press_run", lang))
        return
    if st.session_state["fleet_submitted"] != (config, trace_choice, slo):
        st.warning(ft("stale", lang))
    config, trace_choice, slo = st.session_state["fleet_submitted"]
    try:
        with st.spinner(ft("running_sim", lang)):
            res = cached_simulation(config, *trace_choice)
            ideal = cached_ideal(*trace_choice, config.shape.vocab_size, config.block_size, config.max_model_len)
    except (ValueError, RuntimeError) as exc:
        st.error(ft("bad_input", lang).format(error=exc))
        return
    results(res, slo, lang, ideal)


main()

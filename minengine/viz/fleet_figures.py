"""Figures of a fleet run (``minengine.fleet.FleetResult``): replicas as lanes over simulated time (with the fleet's KV
store as one more lane when it has one), the load per replica, and where prompt tokens came from. Used by the
dashboard's Fleet page and the course's fleet chapter; every axis names its unit and every title names the modelled
hardware."""

from __future__ import annotations

import bisect
import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minengine.viz.colors import streamlit_safe_colorscale
from minengine.viz.i18n import LANGUAGES

_STRINGS: dict[str, tuple[str, str]] = {
    "lanes_title": ("Replicas as lanes: {what} over time ({label})", "副本泳道：{what}随时间变化（{label}）"),
    "kv_use": ("KV cache use (% of the pool)", "KV 缓存占用（池的 %）"),
    "kv_scale": ("colour scale 0-{top:g} % (the data's highest: {peak:.1f} %)",
                 "色标 0-{top:g} %（数据最高 {peak:.1f} %）"),
    "queue": ("waiting requests", "等待中的请求"),
    "running": ("running requests", "运行中的请求"),
    "sim_time": ("simulated time (s)", "模拟时间（秒）"),
    "replica": ("replica", "副本"),
    "load_title": ("Load per replica ({label})", "每个副本的负载（{label}）"),
    "busy": ("busy time (s)", "忙碌时间（秒）"),
    "requests": ("requests served", "处理的请求数"),
    "store_lane": ("store", "存储"),
    "store_ssd_lane": ("store SSD", "存储 SSD"),
    "store_loads_lane": ("store loads", "存储加载"),
    "sources_title": ("Where prompt tokens came from ({label})", "提示词元的来源（{label}）"),
    "src_local": ("local prefix cache", "本地前缀缓存"),
    "src_store": ("loaded from the KV store", "从 KV 存储加载"),
    "src_computed": ("computed", "计算"),
    "src_ideal": ("infinite-cache ideal", "无限缓存上限"),
    "share_prompt": ("% of prompt tokens", "提示词元的 %"),
    "mixed": ("R", "R"),
    "prefill": ("P", "P"),
    "decode": ("D", "D"),
    # ---- the dashboard's Fleet page ------------------------------------------------------------------------
    "page_title": ("Fleet: the engine's scheduler on many modelled GPUs", "集群：引擎的调度器运行在多块建模 GPU 上"),
    "page_intro": ("Every replica is minengine's own engine (scheduler, KV cache manager, prefix cache) on a "
                   "token-free runner, timed by the roofline cost model of the GPU you pick. Requests follow a real "
                   "trace; a router places them; a disaggregated fleet moves each prompt's KV over a link.",
                   "每个副本都是 minengine 自己的引擎（调度器、KV 缓存管理器、前缀缓存），"
                   "运行在不计算令牌的执行器上，时间由所选 GPU 的屋顶线成本模型给出。"
                   "请求来自真实轨迹，由路由器分配；分离式集群通过链路传输每个提示的 KV。"),
    "workload": ("Workload", "负载"),
    "trace": ("trace", "轨迹"),
    "num_requests": ("requests", "请求数"),
    "rate_multiplier": ("arrival rate (x the trace's)", "到达速率（轨迹的倍数）"),
    "trace_azure": ("Azure conversation 2023", "Azure 对话 2023"),
    "trace_mooncake": ("Mooncake FAST'25", "Mooncake FAST'25"),
    "trace_synthetic": ("synthetic (Poisson)", "合成（泊松）"),
    "trace_missing": ("The Azure and Mooncake traces are not in ../shared/data: using a synthetic trace.",
                      "../shared/data 中没有 Azure 和 Mooncake 轨迹：使用合成轨迹。"),
    "fleet": ("Fleet", "集群"),
    "hardware": ("GPU (modelled)", "GPU（建模）"),
    "model_shape": ("model shape", "模型形状"),
    "tp": ("tensor parallelism (GPUs per replica)", "张量并行（每个副本的 GPU 数）"),
    "layout": ("layout", "部署方式"),
    "colocated": ("colocated", "混合部署"),
    "disaggregated": ("disaggregated", "分离式"),
    "num_gpus": ("GPUs", "GPU 数"),
    "num_prefill": ("prefill replicas (P:D split)", "预填充副本数（P:D 比例）"),
    "router": ("router", "路由器"),
    "decode_router": ("decode router", "解码路由器"),
    "link": ("KV link", "KV 链路"),
    "store_section": ("KV store (Mooncake)", "KV 存储（Mooncake）"),
    "store_kind": ("fleet KV store", "集群 KV 存储"),
    "store_none": ("none: per-replica prefix caches", "无：各副本自己的前缀缓存"),
    "store_dram": ("DRAM", "DRAM"),
    "store_ssd": ("DRAM + SSD", "DRAM + SSD"),
    "store_dram_gb": ("DRAM per node (GB)", "每节点 DRAM（GB）"),
    "store_ssd_tb": ("SSD per node (TB)", "每节点 SSD（TB）"),
    "store_gpus_per_node": ("GPUs per node", "每节点 GPU 数"),
    "store_link": ("link between nodes", "节点间链路"),
    "m_store_hit": ("served from the KV store", "由 KV 存储提供"),
    "m_store_bytes": ("loaded / written (GB)", "加载 / 写入（GB）"),
    "m_store_loads": ("loads (declined: recompute cheaper)", "加载次数（放弃：重算更便宜）"),
    "cap_sources": ("Green: prompt tokens found in the replica's own prefix cache; blue: loaded from the fleet's KV "
                    "store (only when the load ends before recomputing them would); grey: computed. The dashed line "
                    "is the trace window's infinite-cache ideal.",
                    "绿色：在副本自己的前缀缓存中找到的提示词元；蓝色：从集群 KV 存储加载的"
                    "（仅当加载比重算更早完成时才加载）；灰色：重新计算的。虚线是该轨迹窗口的无限缓存上限。"),
    "slo": ("SLO (P90, DistServe)", "SLO（P90，DistServe）"),
    "slo_ttft": ("P90 TTFT (ms)", "P90 TTFT（毫秒）"),
    "slo_tpot": ("P90 TPOT (ms)", "P90 TPOT（毫秒）"),
    "run": ("Simulate", "模拟"),
    "press_run": ("Choose a fleet and press Simulate.", "选择集群后点击“模拟”。"),
    "stale": ("The controls changed: showing the last simulation; press Simulate to update.",
              "控件已改变：显示的是上一次模拟；点击“模拟”更新。"),
    "running_sim": ("Simulating...", "模拟中……"),
    "bad_input": ("Cannot simulate this fleet: {error}", "无法模拟该集群：{error}"),
    "sim_speed": ("{requests:,} requests, {sim:,.0f} s simulated in {cpu:.1f} s of CPU: {steps:,} engine steps, "
                  "{rate:,.0f} steps/s.",
                  "{requests:,} 个请求，模拟 {sim:,.0f} 秒，耗 CPU {cpu:.1f} 秒："
                  "{steps:,} 个引擎步，每秒 {rate:,.0f} 步。"),
    "m_ttft": ("TTFT P50 / P90 (ms)", "TTFT P50 / P90（毫秒）"),
    "m_tpot": ("TPOT P50 / P90 (ms)", "TPOT P50 / P90（毫秒）"),
    "m_slo": ("SLO met (P90) · attainment", "满足 SLO（P90）· 达标率"),
    "m_hit": ("prefix hit rate", "前缀命中率"),
    "m_imbalance": ("load imbalance (max/mean busy)", "负载不均衡（最大/平均忙碌）"),
    "m_transfers": ("KV transfers (mean ms)", "KV 传输（平均毫秒）"),
    "yes": ("yes", "是"),
    "no": ("no", "否"),
    "cap_lanes": ("Each row is one replica; colour is its KV use (top) or its waiting queue (bottom) over simulated "
                  "time. P = prefill, D = decode, R = colocated replica; with a KV store, its last rows are the "
                  "store's DRAM (and SSD) use and its loads in flight.",
                  "每一行是一个副本；颜色表示其 KV 占用（上）或等待队列（下）随模拟时间的变化。"
                  "P = 预填充，D = 解码，R = 混合副本；"
                  "有 KV 存储时，最后几行是存储的 DRAM（和 SSD）占用及进行中的加载。"),
}


def ft(key: str, lang: str = "en") -> str:
    """A fleet figure string in ``lang`` ("en" or "zh")."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    return _STRINGS[key][LANGUAGES.index(lang)]


def fleet_description(config, lang: str = "en") -> str:
    """One line naming the fleet and its modelled hardware, in ``lang`` (``FleetConfig.describe`` in English)."""
    from minengine.timing.hardware import get_hardware

    def pool(specs) -> str:
        groups: dict[tuple, int] = {}
        for spec in specs:
            key = (get_hardware(spec.hardware).name, spec.tp)
            groups[key] = groups.get(key, 0) + 1
        return " + ".join(f"{n} x {hw} (TP {tp})" for (hw, tp), n in groups.items())

    if lang == "en":
        return config.describe()
    model = config.shape.name
    if config.is_disaggregated:
        p = pool(s for s in config.replicas if s.role == "prefill")
        d = pool(s for s in config.replicas if s.role == "decode")
        return (f"预填充 {p} / 解码 {d}，通过 {config.link.name} 分离式部署，{model} 形状（建模），"
                f"路由器 {config.router} / {config.decode_router}")
    return f"{pool(config.replicas)}，混合部署，{model} 形状（建模），路由器 {config.router}"


def replica_names(result, lang: str = "en") -> list[str]:
    """Lane labels: "R0".. for colocated replicas, "P0".. / "D0".. for prefill / decode replicas."""
    counters: dict[str, int] = {}
    names = []
    for r in result.replicas:
        i = counters.get(r.role, 0)
        counters[r.role] = i + 1
        names.append(f"{ft(r.role, lang)}{i}")
    return names


def hardware_label(result) -> str:
    """The modelled hardware of a fleet, for titles: each distinct replica label once ("modelled: H100 SXM, ...")."""
    labels = list(dict.fromkeys(r.label for r in result.replicas))
    return " / ".join(labels)


def nice_ceiling(x: float) -> float:
    """The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k (k an integer) that is >= ``x``; 1.0 for ``x`` <= 0.
    A colour scale's top: near the data's highest value, and a round number to read off the colour bar."""
    if not x > 0:
        return 1.0
    scale = 10.0 ** math.floor(math.log10(x))
    for step in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * scale >= x * (1 - 1e-12):
            return step * scale
    return 10 * scale


def resample(times: list[float], values: list[float], grid: list[float]) -> list:
    """``values`` (sampled at ``times``, a step function) at each ``grid`` time: the last sample at or before it,
    0 before the first."""
    out = []
    for t in grid:
        i = bisect.bisect_right(times, t) - 1
        out.append(0 if i < 0 else values[i])
    return out


def resample_max(times: list[float], values: list[float], grid: list[float]) -> list:
    """The largest of ``values`` (a step function sampled at ``times``) over each bin of ``grid`` (bin centres,
    equally spaced: bin i covers ``grid[i] +- half a spacing``), 0 before the first sample. Unlike ``resample``,
    a value that holds for less than a bin (a KV-store load of a few milliseconds) is still seen."""
    half = (grid[1] - grid[0]) / 2 if len(grid) > 1 else math.inf
    out = []
    for t in grid:
        lo = bisect.bisect_right(times, t - half) - 1  # the value in force at the bin's start
        hi = bisect.bisect_left(times, t + half)  # samples up to the bin's end (exclusive)
        out.append(max((values[i] for i in range(max(lo, 0), hi)), default=0) if hi > 0 else 0)
    return out


def fleet_lanes_figure(result, metric: str = "kv", lang: str = "en", num_bins: int = 300) -> go.Figure:
    """One lane per replica (rows), simulated time across (s), colour = ``metric``: "kv" (KV blocks held, % of that
    replica's pool), "queue" (waiting requests) or "running" (running requests), from each replica's sampled
    timeline (``ReplicaStats.times``; one sample per ``FleetConfig.timeline_interval_s`` at most). With a KV store,
    one more lane below the replicas: for "kv" the store's DRAM use (% of all nodes' DRAM; and its SSD use, if it has
    an SSD tier), for "queue" its loads in flight (the most at once in each bin); none for "running".
    The "kv" colour scale runs from 0 to ``nice_ceiling`` of the highest value of any lane (at most 100 %), and the
    colour bar's title says so: on a 0-100 % scale lanes at ~10 % use would all look alike.

    Raises:
        ValueError: an unknown ``metric`` or ``lang``.
    """
    if metric not in ("kv", "queue", "running"):
        raise ValueError(f"metric must be 'kv', 'queue' or 'running', got {metric!r}")
    end = max((r.times[-1] for r in result.replicas if r.times), default=1.0) or 1.0
    grid = [end * (i + 0.5) / num_bins for i in range(num_bins)]
    z = []
    for r in result.replicas:
        if metric == "kv":
            vals = [100.0 * u / r.num_kv_blocks for u in r.used_blocks]
        else:
            vals = list(r.waiting if metric == "queue" else r.running)
        z.append(resample(r.times, vals, grid))
    names = replica_names(result, lang)
    st = getattr(result, "store", None)
    if st is not None and metric != "running":
        if metric == "kv":
            z.append(resample(st.times, [100.0 * u / (st.num_nodes * st.dram_capacity_blocks) for u in st.dram_blocks],
                              grid))
            names.append(ft("store_lane", lang))
            if st.ssd_capacity_blocks:
                z.append(resample(st.times, [100.0 * u / (st.num_nodes * st.ssd_capacity_blocks)
                                             for u in st.ssd_blocks_used], grid))
                names.append(ft("store_ssd_lane", lang))
        else:
            # loads last milliseconds: the most in flight during each bin, or a bin's centre would miss them
            z.append(resample_max(st.times, list(st.loads_in_flight), grid))
            names.append(ft("store_loads_lane", lang))
    what = ft({"kv": "kv_use", "queue": "queue", "running": "running"}[metric], lang)
    label = hardware_label(result)
    peak = max((max(row, default=0) for row in z), default=0)
    if metric == "kv":
        # scaled to the data, not 0-100 %: lanes at ~10 % use would all be the scale's bottom colour
        zmax = min(100.0, nice_ceiling(peak))
        bar_title = f"{what}<br>{ft('kv_scale', lang).format(top=zmax, peak=peak)}"
    else:
        # counts from 0 to at least 1: an all-zero queue is drawn as 0 (black), not as the middle of a -0.5..0.5 scale
        zmax, bar_title = max(1.0, peak), what
    fig = go.Figure(go.Heatmap(
        z=z, x=grid, y=names, colorscale="Viridis" if metric == "kv" else streamlit_safe_colorscale("Magma"),
        zmin=0, zmax=zmax, colorbar={"title": bar_title},
        hovertemplate="%{y} · %{x:.1f} s<br>%{z:.0f}<extra></extra>"))
    fig.update_layout(title=ft("lanes_title", lang).format(what=what, label=label),
                      xaxis={"title": ft("sim_time", lang)},
                      yaxis={"title": ft("replica", lang), "autorange": "reversed"},
                      height=max(260, 28 * len(names) + 140), margin={"t": 60})
    return fig


def prompt_sources_figure(results: dict, ideal: float | None = None, lang: str = "en") -> go.Figure:
    """Stacked bars, one per run (``results``: name -> ``FleetResult``): the share of prompt tokens served by the
    replicas' own prefix caches, loaded from the KV store, and computed (%), with the trace's infinite-cache ideal
    (``minengine.fleet.infinite_cache_hits(...).hit_rate``, a fraction) as a dashed line when given."""
    names = list(results)
    store = [100 * r.store_hit_rate for r in results.values()]
    local = [100 * r.prefix_hit_rate - s for r, s in zip(results.values(), store)]
    computed = [100 - a - b for a, b in zip(local, store)]
    fig = go.Figure([go.Bar(name=ft("src_local", lang), x=names, y=local, marker_color="#2ca02c"),
                     go.Bar(name=ft("src_store", lang), x=names, y=store, marker_color="#1f77b4"),
                     go.Bar(name=ft("src_computed", lang), x=names, y=computed, marker_color="#d3d3d3")])
    if ideal is not None:
        fig.add_hline(y=100 * ideal, line_dash="dash", annotation_text=ft("src_ideal", lang))
    label = hardware_label(next(iter(results.values()))) if results else ""
    fig.update_layout(barmode="stack", title=ft("sources_title", lang).format(label=label),
                      yaxis={"title": ft("share_prompt", lang), "range": [0, 100]}, margin={"t": 60},
                      legend={"orientation": "h", "y": -0.2})
    return fig


def fleet_load_figure(result, lang: str = "en") -> go.Figure:
    """Per replica: busy time (s, bars) and requests served (markers, right axis): the load imbalance at a glance."""
    names = replica_names(result, lang)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=names, y=[r.busy_time_s for r in result.replicas], name=ft("busy", lang)))
    fig.add_trace(go.Scatter(x=names, y=[r.num_requests for r in result.replicas], mode="markers",
                             marker={"size": 9, "color": "#d62728"}, name=ft("requests", lang)), secondary_y=True)
    label = hardware_label(result)
    fig.update_layout(title=ft("load_title", lang).format(label=label), margin={"t": 60})
    fig.update_yaxes(title_text=ft("busy", lang), secondary_y=False, rangemode="tozero")
    # round ticks on the right axis (plotly.js syncs an overlaid axis to the left one's grid: 249, 406, ...)
    fig.update_yaxes(title_text=ft("requests", lang), secondary_y=True, rangemode="tozero", tickmode="auto",
                     showgrid=False)
    fig.update_xaxes(title_text=ft("replica", lang))
    return fig

"""minengine dashboard: run the real engine on a workload and watch the scheduler while it runs, step by step.

    streamlit run app.py

Three pages in the sidebar (``st.navigation``): "Scheduler", this file's ``main``; "Fleet", ``pages/Fleet.py`` (a
simulated fleet); and "Router", ``pages/Router.py`` (a real fleet's replicas behind vLLM's router, side by side).
The sidebar's source is either a local run or a live server: ``python -m minengine serve`` attached by URL, its
step feed read by ``minengine.viz.server_feed.ServerFeed`` (a background thread owned by this session) and
animated by the same ``LivePlayer`` and figure builders.

No engine logic here: the page reads controls, builds a ``Workload`` (``minengine.viz.presets``), plays it live
(``minengine.viz.runner.WorkloadRun``, a stream of ``StepTrace``s, paced by ``minengine.viz.live.LivePlayer`` in
a Streamlit fragment), then keeps the finished run to explore; the A/B tab's second run is
``minengine.viz.runner.run_workload``, cached on config + workload. Every figure is a ``minengine.viz`` builder
drawing the engine's own records. ``MINENGINE_LABS="block_pool=my_pool.py"`` runs it on a learner's parts
(``labs/README.md``). ``MINENGINE_MODEL`` may name another model directory (default: the
bundled tiny Shakespeare model).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import streamlit as st

from minengine.config import BUNDLED_MODEL
from minengine.core.policies import POLICIES
from minengine.timing import ClockSpec, get_hardware
from minengine.timing.capacity import memory_fit
from minengine.viz import (
    STALL_MARKS,
    ab_sentence,
    auto_stall_threshold,
    batch_composition_figure,
    block_pool_animation,
    block_pool_figure,
    block_tables_figure,
    captions,
    find_stalls,
    itl_figure,
    kv_usage_figure,
    labelled_stalls,
    latency_cdf_figure,
    presets,
    queue_figure,
    run_request_ids,
    step_request_metrics,
    step_token_timeline_figure,
    token_timeline_figure,
    windowed_group_trace,
)
from minengine.viz.batch_figure import spec_decode_figure
from minengine.viz.clock_label import (
    CLOCK_CHOICES,
    DASHBOARD_HARDWARE,
    DASHBOARD_MODELS,
    clock_label,
    model_choice_label,
)
from minengine.viz.compare import ab_request_figure, ab_work_sentence, share_y_range
from minengine.viz.i18n import t
from minengine.viz.kernel_note import IN_PROGRESS, kernel_note, kernel_state
from minengine.viz.live import DEFAULT_SPEED, SPEEDS, TICK_S, LivePlayer
from minengine.viz.runner import DashboardConfig, RunResult, WorkloadRun, parse_labs, run_workload
from minengine.viz.server_feed import DEFAULT_URL, ServerFeed
from minengine.viz.server_pacing import (
    SERVER_CONNECT_WAIT_S,
    SERVER_WINDOW,
    SERVER_WINDOWS,
    note_traffic,
    redraw_interval,
)
from minengine.viz.step_story import step_sentence, step_sentences
from minengine.viz.streamlit_session import session_alive_check
from minengine.viz.timeline_figures import AUTO_STALL_FACTOR
from minengine.viz.workload import Workload
from minengine.viz.workload_figure import workload_figure
from minengine.workloads import azure_conv_path, find_data_dir, load_azure_trace, parse_azure_csv

LIVE_MIN_STEPS = 40  # the live batch bars start on a 40-step axis (it widens as the run goes on)
TRACE_SCALES = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4)
LONG_PROMPT_SCALES = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
SOURCES = ("local", "server")
PREEMPTION_MODES = ("recompute", "swap")
KV_CACHE_DTYPES = ("auto", "fp8")  # EngineConfig.kv_cache_dtype
QUANTIZATIONS = (None, "int8")  # EngineConfig.quantization (weight-only int8)
LIVE_STORY_STEPS = 4  # the live view's last few steps in words
KERNEL_NOTE_TICK_S = 1.0  # the kernel note's seconds count up while it compiles, and it goes once it is ready


# ---- cached heavy work ---------------------------------------------------------------------------------------
@st.cache_data(show_spinner=False, max_entries=32)
def cached_run(config: DashboardConfig, workload: Workload) -> RunResult:
    """One engine run; the cache key is the (frozen, hashable) config and workload."""
    return run_workload(config, workload)


def get_result(config: DashboardConfig, workload: Workload) -> RunResult:
    """This session's finished live run of (config, workload) if there is one, else a cached full run (the
    A/B tab's other configuration)."""
    res = st.session_state.get("results", {}).get((config, workload))
    return res if res is not None else cached_run(config, workload)


@st.cache_data(show_spinner=False, max_entries=8)
def cached_trace(path: str, max_requests: int, length_scale: float) -> list:
    """The first ``max_requests`` requests of the Azure trace at ``path``, lengths x ``length_scale``."""
    return list(load_azure_trace(path, max_requests=max_requests, length_scale=length_scale))


# ---- controls ---------------------------------------------------------------------------------------------------
def language_control() -> str:
    return st.sidebar.radio("Language / 语言", ["en", "zh"], horizontal=True, key="lang",
                            format_func=lambda x: {"en": "English", "zh": "中文"}[x])


def workload_controls(preset: str, lang: str) -> tuple[Workload | None, list[tuple[str, str]]]:
    """The preset's own controls; returns (workload or None, messages as (kind, text)) where kind is
    "info", "warning" or "error". None means the run cannot go ahead (the messages say why)."""
    sb = st.sidebar
    messages: list[tuple[str, str]] = []
    if preset == "a":
        scale = sb.select_slider(t("long_prompt_scale", lang), LONG_PROMPT_SCALES, value=1 / 4, key="a_scale",
                                 format_func=lambda s: f"{s:g}")
        return presets.textbook_long_prompt(long_prompt_scale=scale), messages
    if preset == "b":
        return presets.shared_system_prompt(), messages
    if preset == "c":
        return presets.memory_pressure(), messages
    if preset == "f":
        return presets.speculative_decoding(), messages
    if preset == "d":
        n = sb.number_input(t("trace_max_requests", lang), min_value=1, max_value=200, value=40, key="d_n")
        scale = sb.select_slider(t("trace_length_scale", lang), TRACE_SCALES, value=1 / 8, key="d_scale",
                                 format_func=lambda s: f"{s:g}")
        speedup = sb.select_slider(t("trace_speedup", lang), presets.TRACE_SPEEDUPS, value=presets.TRACE_SPEEDUP,
                                   key="d_speedup", format_func=lambda s: f"{s:g}×")
        upload = sb.file_uploader(t("trace_upload", lang), type=["csv"], key="d_upload")
        if upload is not None:
            try:
                trace = parse_azure_csv(upload.getvalue(), max_requests=int(n), length_scale=scale,
                                        source=upload.name)
            except ValueError as exc:
                return None, [("error", t("trace_bad_upload", lang).format(error=exc))]
            messages.append(("info", t("trace_using_upload", lang).format(n=len(trace))))
        else:
            path = azure_conv_path(find_data_dir())
            if path is None:
                expected = "../shared/data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
                return None, [("warning", t("trace_missing", lang).format(path=expected))]
            trace = cached_trace(str(path), int(n), scale)
        try:
            return presets.from_trace(trace, length_scale=scale, speedup=float(speedup)), messages
        except ValueError as exc:
            return None, [("error", t("trace_bad_upload", lang).format(error=exc))]
    # (e) custom
    num = sb.number_input(t("num_requests", lang), min_value=1, max_value=64, value=32, key="e_n")
    p_lo, p_hi = sb.slider(t("prompt_len_range", lang), 1, 1024, (16, 512), key="e_prompt")
    o_lo, o_hi = sb.slider(t("output_len_range", lang), 1, 256, (8, 64), key="e_output")
    rate = sb.number_input(t("arrival_rate", lang), min_value=0.0, max_value=1000.0, value=40.0, step=5.0,
                           key="e_rate")
    return presets.custom(int(num), (p_lo, p_hi), (o_lo, o_hi), float(rate)), messages


def clock_controls(lang: str) -> ClockSpec:
    """The clock the run's times are on: modelled (a hardware preset and a target model shape; the default,
    so the pictures do not depend on what else this machine is doing) or measured CPU time of this process."""
    sb = st.sidebar
    sb.subheader(t("clock", lang))
    # per-language keys with one shared value (a browser keeps a keyed widget's old option labels)
    kind = sb.radio(t("clock_kind", lang), CLOCK_CHOICES, key=f"clock_kind_{lang}",
                    index=CLOCK_CHOICES.index(st.session_state.get("clock_kind", CLOCK_CHOICES[0])),
                    format_func=lambda k: t(f"clock_{k}", lang))
    st.session_state["clock_kind"] = kind
    if kind != "modelled":
        sb.caption(t("clock_cpu_help", lang))
        return ClockSpec(kind)
    hardware = sb.selectbox(t("clock_hardware", lang), DASHBOARD_HARDWARE, key="clock_hardware",
                            format_func=lambda h: get_hardware(h).name)
    model, tp = sb.selectbox(t("clock_model", lang), DASHBOARD_MODELS, key="clock_model",
                             format_func=lambda m: model_choice_label(*m))
    sb.caption(t("clock_modelled_help", lang))
    fit = memory_fit(hardware, model, tp)
    if not fit.fits:  # priced all the same, but no engine could serve it: say so beside the choice
        sb.warning(t("clock_does_not_fit", lang).format(
            model=model_choice_label(model, tp), hardware=get_hardware(hardware).name,
            need_gb=fit.weight_bytes_per_device / 1e9, have_gb=fit.usable_bytes_per_device / 1e9))
    return ClockSpec("modelled", hardware=hardware, model=model, tp=tp)


def engine_controls(preset: str, lang: str, clock: ClockSpec) -> DashboardConfig:
    """Engine knobs, starting from the preset's defaults (keys per preset, so switching preset resets them).
    Deliberately permissive bounds (0 blocks, a budget below block_size): ``DashboardConfig.validate`` turns
    bad values into a message on the page."""
    d = presets.PRESET_ENGINE_DEFAULTS[preset]
    sb = st.sidebar
    sb.subheader(t("engine", lang))
    budget = sb.number_input(t("max_num_batched_tokens", lang), min_value=1, max_value=16384,
                             value=d["max_num_batched_tokens"], step=16, key=f"{preset}_budget")
    chunked = sb.toggle(t("enable_chunked_prefill", lang), value=d["enable_chunked_prefill"], key=f"{preset}_cp")
    threshold = sb.number_input(t("long_prefill_token_threshold", lang), min_value=0, max_value=16384,
                                value=d["long_prefill_token_threshold"], step=16, key=f"{preset}_thr")
    block_size = sb.number_input(t("block_size", lang), min_value=1, max_value=256, value=d["block_size"],
                                 key=f"{preset}_bs")
    blocks = sb.number_input(t("num_kv_blocks", lang), min_value=0, max_value=8192, value=d["num_kv_blocks"],
                             key=f"{preset}_blocks")
    seqs = sb.number_input(t("max_num_seqs", lang), min_value=1, max_value=256, value=d["max_num_seqs"],
                           key=f"{preset}_seqs")
    prefix = sb.toggle(t("enable_prefix_caching", lang), value=d["enable_prefix_caching"], key=f"{preset}_pc")
    policy = sb.selectbox(t("scheduling_policy", lang), list(POLICIES),
                          index=list(POLICIES).index(d.get("scheduling_policy", "decode-first")),
                          key=f"{preset}_policy")
    spec_k = sb.number_input(t("num_speculative_tokens", lang), min_value=0, max_value=16,
                             value=d.get("num_speculative_tokens", 0), key=f"{preset}_spec")
    preemption = sb.selectbox(t("preemption_mode", lang), PREEMPTION_MODES, key=f"{preset}_preemption",
                              index=PREEMPTION_MODES.index(d.get("preemption_mode", "recompute")),
                              format_func=lambda m: t(f"preemption_{m}", lang))
    kv_dtype = sb.selectbox(t("kv_cache_dtype", lang), KV_CACHE_DTYPES, key=f"{preset}_kv_dtype")
    quantization = sb.selectbox(t("quantization", lang), QUANTIZATIONS, key=f"{preset}_quant",
                                format_func=lambda q: t("quantization_none", lang) if q is None else q)
    temperature = sb.slider(t("temperature", lang), 0.0, 2.0, 0.0, 0.1, key="temperature")
    return DashboardConfig(max_num_batched_tokens=int(budget), enable_chunked_prefill=bool(chunked),
                           long_prefill_token_threshold=int(threshold), block_size=int(block_size),
                           num_kv_blocks=int(blocks), max_num_seqs=int(seqs), enable_prefix_caching=bool(prefix),
                           scheduling_policy=policy, num_speculative_tokens=int(spec_k),
                           temperature=float(temperature), model=os.environ.get("MINENGINE_MODEL") or None,
                           clock=clock, preemption_mode=preemption, kv_cache_dtype=kv_dtype,
                           quantization=quantization, labs=parse_labs(os.environ.get("MINENGINE_LABS")))


def live_speed_control(lang: str) -> float:
    """Steps per second of the live view (0 = as fast as the engine runs); one slider per language (as the
    preset selectbox: a browser keeps a keyed widget's old option labels), one shared value."""
    st.sidebar.subheader(t("live_run", lang))
    speed = st.sidebar.select_slider(
        t("live_speed", lang), SPEEDS, value=st.session_state.get("live_speed", DEFAULT_SPEED),
        key=f"live_speed_{lang}", format_func=lambda v: t("full_speed", lang) if v == 0 else str(v))
    st.session_state["live_speed"] = speed
    return speed


def show(messages: list[tuple[str, str]]) -> None:
    for kind, text in messages:
        getattr(st, kind)(text)


# ---- the live run ---------------------------------------------------------------------------------------------
def start_run(config: DashboardConfig, workload: Workload, speed: float, lang: str) -> None:
    """Build a fresh engine for the submitted settings and hand it to a ``LivePlayer`` (Run pressed)."""
    st.session_state["submitted"] = (config, workload)
    st.session_state.pop("live", None)
    try:
        first = kernel_state().state == "not_started"  # this process's first engine builds or loads the kernel
        with st.spinner(t("loading_engine_kernel" if first else "loading_engine", lang)):
            run = WorkloadRun(config, workload)
    except ValueError as exc:
        st.session_state["run_error"] = ("bad_input", str(exc))
        return
    st.session_state.pop("run_error", None)
    st.session_state["live"] = LivePlayer(run, speed=speed)


def finished_result(player: LivePlayer) -> RunResult:
    """The live run's result, kept per session under its (config, workload) so the views can find it."""
    run = player.stream
    res = run.result()
    st.session_state.setdefault("results", {})[(run.config, run.workload)] = res
    return res


def live_view(player: LivePlayer, lang: str, speed: float) -> None:
    """The run in progress: pause / resume / finish now (``speed`` from the sidebar), then the block pool, the
    batch bars and the token timeline, redrawn every ``TICK_S`` seconds by a fragment (only this part of the
    page reruns) with the steps the engine took meanwhile."""
    cols = st.columns([1, 1, 4])
    if player.paused:
        cols[0].button(t("live_resume", lang), key="live_resume", on_click=player.resume, type="primary")
    else:
        cols[0].button(t("live_pause", lang), key="live_pause", on_click=player.pause)
    cols[1].button(t("finish_now", lang), key="live_finish",
                   on_click=lambda: st.session_state.update(finish_requested=True))
    player.speed = speed

    @st.fragment(run_every=None if player.paused or player.done else TICK_S)
    def frame() -> None:
        try:
            player.tick()
        except Exception as exc:  # the engine's guards (a run that does not finish) or any engine error: a message
            st.session_state["run_error"] = ("run_failed", str(exc))
            st.session_state.pop("live", None)
            st.rerun()
        if player.done:
            st.rerun()  # the whole page: the finished run's tabs replace the live view
        draw_live(player, lang)

    frame()


def show_kernel_note(lang: str) -> None:
    """One line while the CPU attention kernel is built or waited for, or after it fell back to the torch path
    (``minengine.viz.kernel_note``); nothing once it is ready."""
    note = kernel_note(kernel_state(), lang)
    if note is not None:
        kind, text = note
        getattr(st, kind)(text)


def kernel_note_view(lang: str) -> None:
    """``show_kernel_note`` below a finished run: while the kernel is still on its way, a fragment redraws the
    line every ``KERNEL_NOTE_TICK_S`` (its seconds count up) and, once it is ready or fell back, reruns the page
    once so the line goes and the timer stops."""
    in_progress = kernel_state().state in IN_PROGRESS

    @st.fragment(run_every=KERNEL_NOTE_TICK_S if in_progress else None)
    def note() -> None:
        if in_progress and kernel_state().state not in IN_PROGRESS:
            st.rerun()  # the whole page: the fragment is registered again without a timer
        show_kernel_note(lang)

    note()


def draw_live(player: LivePlayer, lang: str) -> None:
    show_kernel_note(lang)
    traces = player.traces
    run = player.stream
    if not traces:
        st.caption(t("live_waiting", lang))
        return
    last = traces[-1]
    state = t("live_paused", lang) if player.paused else t("live_running", lang)
    clock = clock_label(run.config.clock, lang)
    st.markdown(t("live_status", lang).format(state=state, step=last.step, finished=run.num_finished,
                                              total=run.num_requests, time_s=last.end_time - traces[0].start_time,
                                              clock=clock))
    played_speed_note(player, lang, clock)
    left, right = st.columns(2)
    with left:
        st.plotly_chart(block_pool_figure(last, lang, request_ids=run_request_ids(traces)), key="live_pool")
    with right:
        st.plotly_chart(batch_composition_figure(traces, lang, min_steps=LIVE_MIN_STEPS), key="live_batch")
        st.markdown("  \n".join(step_sentence(tr, lang) for tr in traces[-LIVE_STORY_STEPS:]))
    st.plotly_chart(step_token_timeline_figure(traces, lang, clock_label(run.config.clock, lang)),
                    key="live_timeline")
    st.caption(t("cap_live", lang))


def played_speed_note(player: LivePlayer, lang: str, clock: str) -> None:
    """The speed the live view really plays (``LivePlayer.played_speed``, measured from its own ticks) beside the
    asked one; a warning saying why when a busy machine makes it drop steps (``LivePlayer.falls_short``)."""
    played = player.played_speed
    if played is None or player.paused:
        return
    asked = player.speed
    if player.falls_short:
        st.warning(t("live_busy", lang).format(played=played, asked=asked, clock=clock))
    elif asked:
        st.caption(t("live_played", lang).format(played=played, asked=asked))
    else:
        st.caption(t("live_played_full", lang).format(played=played))


# ---- views ----------------------------------------------------------------------------------------------------
def run_figures(res: RunResult, lang: str) -> dict:
    """Figures of a finished run that do not depend on any widget, built once per (run, language) and kept in the
    session: a rerun for another widget (the step slider, the A/B choice, a tab's control) redraws nothing here."""
    key = (id(res), lang)
    cached = st.session_state.get("run_figures")
    if cached is not None and cached[0] == key:
        return cached[1]
    figs = {"features": captions.run_features(res.traces)}
    st.session_state["run_figures"] = (key, figs)
    return figs


def block_view(res: RunResult, lang: str) -> None:
    traces = res.traces
    features = run_figures(res, lang)["features"]
    peak = max(range(len(traces)), key=lambda i: traces[i].num_used_blocks)  # open at the fullest step

    # A fragment: moving the slider reruns only this (two figures), not the whole page (every tab's figures).
    @st.fragment
    def at_step() -> None:
        # keyed on the run length, so a shorter run never inherits an out-of-range step from a longer one
        step = st.slider(t("step_slider", lang), 0, len(traces) - 1, peak, key=f"step_{len(traces)}")
        left, right = st.columns(2)
        two_groups = traces[step].windowed_block_tables is not None  # full-attention and windowed layers' pools
        with left:
            st.plotly_chart(block_pool_figure(traces[step], lang, kv_cache_group="full" if two_groups else None),
                            key="block_pool")
            if two_groups:
                st.plotly_chart(block_pool_figure(windowed_group_trace(traces[step]), lang,
                                                  kv_cache_group="windowed"), key="windowed_block_pool")
            st.caption(captions.block_pool_caption(features, lang))
        with right:
            st.plotly_chart(block_tables_figure(traces[step], lang), key="block_tables")
            st.caption(captions.block_tables_caption(features, lang))
        st.caption(step_sentence(traces[step], lang))

    at_step()
    st.subheader(t("animation", lang))

    @st.fragment
    def animation() -> None:
        speed = st.slider(t("speed", lang), 1, 20, 4, key="speed")
        st.plotly_chart(block_pool_animation(traces, lang, frame_ms=round(1000 / speed)), key="block_anim")
        st.caption(t("cap_animation", lang))

    animation()


def batch_view(res: RunResult, lang: str, preset: str) -> None:
    features = run_figures(res, lang)["features"]
    st.plotly_chart(batch_composition_figure(res.traces, lang), key="batch")
    st.caption(captions.batch_caption(features, preset, lang))
    if "spec" in features:  # proposals are a few tokens under a budget-high axis: zoom in on the decodes
        st.plotly_chart(spec_decode_figure(res.traces, lang), key="spec_decodes")
        st.caption(t("cap_spec", lang))
    st.markdown(f"**{t('story_title', lang)}**")
    st.caption(t("story_caption", lang).format(n=len(res.traces)))
    with st.container(height=320, key="story"):
        st.markdown("  \n".join(step_sentences(res.traces, lang)))


def tbt_view(res: RunResult, lang: str, threshold_s: float, clock: str) -> None:
    st.plotly_chart(token_timeline_figure(res.request_metrics, lang, clock_label=clock), key="timeline")
    st.caption(t("cap_timeline", lang))
    st.plotly_chart(itl_figure(res.request_metrics, res.traces, threshold_s, lang, clock_label=clock), key="itl")
    stalls = find_stalls(res.request_metrics, res.traces, threshold_s, lang)
    st.caption(captions.itl_caption(len(labelled_stalls(stalls)), lang))
    st.markdown(f"**{t('stall_table', lang)}**")
    if not stalls:
        st.info(t("no_stalls", lang).format(threshold_ms=threshold_s * 1000))
        return
    marks = {id(s): STALL_MARKS[i] for i, s in enumerate(labelled_stalls(stalls))}
    st.dataframe([{t("col_label", lang): marks.get(id(s), ""), t("request", lang): s["request_id"],
                   t("col_token", lang): s["token_index"], t("col_time", lang): round(s["time_s"], 3),
                   t("col_itl", lang): round(s["itl_s"] * 1000, 1), t("col_cause", lang): s["cause"]}
                  for s in stalls], key="stalls")


def metrics_view(res: RunResult, lang: str, clock: str) -> None:
    s = res.summary
    features = run_figures(res, lang)["features"]
    ms = 1000
    st.caption(t("times_on_clock", lang).format(clock=clock))
    # One number per card: three numbers in one card did not fit its width and were cut ("12.3 / 45.6 / 7…").
    for name, values in (("ttft", (s.ttft_p50, s.ttft_p95, s.ttft_p99)), ("tpot", (s.tpot_p50, s.tpot_p95, s.tpot_p99)),
                         ("itl", (s.itl_p50, s.itl_p95, s.itl_p99))):
        cols = st.columns(3)
        for col, q, v in zip(cols, (50, 95, 99), values):
            col.metric(t(f"metric_{name}", lang).format(q=q), f"{v * ms:,.1f}")
    cols = st.columns(4)
    cols[0].metric(t("metric_throughput", lang), f"{s.output_tok_s:,.1f}")
    cols[1].metric(t("metric_preemptions", lang), f"{s.num_preemptions}")
    cols[2].metric(t("metric_prefix", lang), f"{s.prefix_hit_tokens:,} ({s.prefix_hit_rate:.0%})")
    cols[3].metric(t("metric_requests", lang), f"{s.num_requests} / {s.num_steps}")
    if s.spec_num_drafts:  # speculative decoding ran: what it bought
        cols = st.columns(3)
        cols[0].metric(t("metric_spec_acceptance", lang), f"{s.spec_acceptance_rate:.0%}")
        cols[1].metric(t("metric_spec_length", lang), f"{s.spec_mean_acceptance_length:.2f}")
        cols[2].metric(t("metric_tokens_per_step", lang), f"{s.output_tokens / max(1, s.num_steps):.2f}")
    left, right = st.columns(2)
    with left:
        st.plotly_chart(queue_figure(res.traces, lang, clock_label=clock), key="queue")
        st.caption(captions.queue_caption(features, lang))
    with right:
        st.plotly_chart(kv_usage_figure(res.traces, lang, clock_label=clock), key="kv")
        st.caption(captions.kv_caption(features, lang))
    st.plotly_chart(latency_cdf_figure(res.request_metrics, lang, clock_label=clock), key="latency")
    st.caption(t("cap_latency", lang))


def ab_runs(config_a: DashboardConfig, config_b: DashboardConfig, workload: Workload) -> tuple:
    """(run A, run B, measured) for the A/B tab. On the modelled clock each comes from this session's live run or
    the cache shared by sessions (a modelled run is the same wherever and whenever it ran). On a measured clock
    both run now, back to back, in this session (kept for its reruns): a cached run B measured by another session,
    or the live run measured minutes ago, may have met another load; ``measured`` says when (time, load)."""
    if config_a.clock.kind == "modelled":
        return get_result(config_a, workload), get_result(config_b, workload), None
    key = (config_a, config_b, workload)
    kept = st.session_state.setdefault("ab_measured", {})
    if key not in kept:
        res_a, res_b = run_workload(config_a, workload), run_workload(config_b, workload)
        kept.clear()  # one pair per session: a measured run is not reused across settings anyway
        kept[key] = (res_a, res_b, (time.strftime("%H:%M:%S"), os.getloadavg()[0], os.cpu_count()))
    return kept[key]


def ab_view(config: DashboardConfig, workload: Workload, lang: str, threshold_s: float, preset: str) -> None:
    names = list(presets.COMPARISONS)
    # one radio per language (a browser showed the Chinese radio with nothing selected), one shared value per
    # preset: each preset opens on its own comparison
    chosen = st.session_state.get(f"ab_choice_{preset}", presets.PRESET_COMPARISON.get(preset, names[0]))
    name = st.radio(t("ab_knob", lang), names, horizontal=True, key=f"ab_knob_{preset}_{lang}",
                    index=names.index(chosen), format_func=lambda n: t(f"ab_{n}", lang))
    st.session_state[f"ab_choice_{preset}"] = name
    comparison = presets.COMPARISONS[name]
    label_a, label_b = t(f"ab_{name}_a", lang), t(f"ab_{name}_b", lang)
    config_a, config_b = comparison.configs(config)
    try:
        with st.spinner(t("running_engine", lang)):
            res_a, res_b, measured = ab_runs(config_a, config_b, workload)
    except (ValueError, RuntimeError) as exc:
        st.error(t("run_failed", lang).format(error=exc))
        return
    st.markdown(ab_sentence(res_a.summary, res_b.summary, label_a, label_b, lang))
    st.markdown(ab_work_sentence(res_a.traces, res_b.traces, res_a.summary, res_b.summary, label_a, label_b, lang))
    st.caption(t("cap_ab", lang) + (" " if lang == "en" else "") + t(f"ab_look_{name}", lang))
    if measured is not None:
        when, load, cpus = measured
        st.info(t("ab_measured", lang).format(when=when, load=load, cpus=cpus))
    for label, res in ((label_a, res_a), (label_b, res_b)):
        if res.budget_raised:
            note = t("budget_raised", lang).format(cp=t("chunked_prefill", lang), tokens=res.token_budget)
            st.info(label + ("：" if lang == "zh" else ": ") + note)
    clock = clock_label(config.clock, lang)
    cols = st.columns(2)
    for col, kind in zip(cols, ("ttft", "tbt")):
        col.plotly_chart(ab_request_figure(res_a.request_metrics, res_b.request_metrics, label_a, label_b, kind,
                                           lang, clock_label=clock), key=f"ab_{kind}")
    # side by side, the same height means the same ITL: one data top for both label bands, then one y range
    top_ms = max([threshold_s * 1000] + [g * 1000 for res in (res_a, res_b) for m in res.request_metrics.values()
                                         for g in m.itls])
    itl = [itl_figure(res.request_metrics, res.traces, threshold_s, lang, clock_label=clock, y_top_ms=top_ms)
           for res in (res_a, res_b)]
    share_y_range(itl)
    cols = st.columns(2)
    for i, (label, res) in enumerate(((label_a, res_a), (label_b, res_b))):
        with cols[i]:
            st.markdown(f"**{label}**")
            st.plotly_chart(itl[i], key=f"ab_itl_{i}")
            st.plotly_chart(batch_composition_figure(res.traces, lang), key=f"ab_batch_{i}")


# ---- a live server ----------------------------------------------------------------------------------------------
def source_control(lang: str) -> str:
    """Local run or live server; one radio per language (as the preset selectbox), one shared value."""
    chosen = st.session_state.get("source_choice", SOURCES[0])
    source = st.sidebar.radio(t("source", lang), SOURCES, index=SOURCES.index(chosen), key=f"source_{lang}",
                              format_func=lambda s: t(f"source_{s}", lang))
    st.session_state["source_choice"] = source
    return source


def connect_server(url: str, window: int) -> None:
    """Connect pressed: stop this session's feed if any, start a new one (it connects in its own thread)."""
    stop_server_feed()
    try:
        feed = ServerFeed(url, history=window, alive=session_alive_check())
    except ValueError as exc:
        st.session_state["server_error"] = str(exc)
        return
    st.session_state.pop("server_error", None)
    st.session_state["server_player"] = LivePlayer(feed.start(), speed=0, keep=max(SERVER_WINDOWS))
    feed.wait_history(SERVER_CONNECT_WAIT_S)  # its history replay: the rerun after this click draws it


def disconnect_server() -> None:
    """Disconnect pressed: the feed stops; its steps stay on screen."""
    player = st.session_state.get("server_player")
    if player is not None:
        player.stream.stop()


def stop_server_feed() -> None:
    """The source changed (or a new connection replaces this one): stop the feed and forget it."""
    for key in ("server_error", "server_figures", "server_idle", "server_last_new"):
        st.session_state.pop(key, None)
    player = st.session_state.pop("server_player", None)
    if player is not None:
        player.stream.stop()


def server_page(lang: str) -> None:
    """The live-server source: URL, Connect / Disconnect, steps on screen in the sidebar; the live view."""
    st.write(t("server_intro", lang))
    sb = st.sidebar
    sb.subheader(t("server", lang))
    url = sb.text_input(t("server_url", lang), value=DEFAULT_URL, key="server_url")
    window = sb.select_slider(t("server_window", lang), SERVER_WINDOWS, value=SERVER_WINDOW, key="server_window")
    player = st.session_state.get("server_player")
    cols = sb.columns(2)
    cols[0].button(t("server_connect", lang), key="server_connect", type="primary", on_click=connect_server,
                   args=(url, window))
    cols[1].button(t("server_disconnect", lang), key="server_disconnect", on_click=disconnect_server,
                   disabled=player is None or player.stream.done)
    if "server_error" in st.session_state:
        st.error(t("server_bad_url", lang).format(error=st.session_state["server_error"]))
        return
    if player is None:
        st.write(t("server_press_connect", lang))
        return
    if url.strip().rstrip("/") != player.stream.url:
        st.caption(t("server_url_changed", lang).format(url=url.strip()))
    server_live_view(player, lang, window)


def server_live_view(player: LivePlayer, lang: str, window: int) -> None:
    """Pause / resume, then the server's figures, redrawn by a fragment every few seconds
    (``minengine.viz.server_pacing``) with the steps that arrived meanwhile (all of them: a server is shown as it
    goes, not paced)."""
    feed: ServerFeed = player.stream
    live = not feed.done
    if live:
        if player.paused:
            st.button(t("live_resume", lang), key="server_resume", on_click=player.resume, type="primary")
        else:
            st.button(t("live_pause", lang), key="server_pause", on_click=player.pause)

    idle = st.session_state.get("server_idle", False)
    if live and not player.paused and not player.traces:
        player.tick()  # steps that came on Connect (the history replay) are drawn in this very rerun
    first = not player.traces  # no step yet: look often, so the first figures come right after the first step
    tick_s = redraw_interval(not first, idle)

    @st.fragment(run_every=tick_s if live and not player.paused else None)
    def frame() -> None:
        new = player.tick()
        if live and (feed.done or (first and player.traces)):
            st.rerun()  # the whole page: the buttons follow (Disconnect off, no Pause), or the tick's interval
        # the redraw rate follows the traffic: back to the busy interval at the first new step, slower when quiet
        quiet = note_traffic(st.session_state, "server", bool(new), time.monotonic())
        if live and quiet != idle:
            st.session_state["server_idle"] = quiet
            st.rerun()  # the whole page: the fragment is registered again with the other interval
        draw_server(player, lang, window)

    frame()


def server_clock_label(feed: ServerFeed, lang: str) -> str:
    """"wall clock: live server" for ``minengine serve``; another clock the server names is shown as it is."""
    clock = feed.clock_label
    return t("clock_live_server", lang) if clock == "wall" else t("clock_live_server_other", lang).format(clock=clock)


def server_messages(feed: ServerFeed, lang: str) -> None:
    """The feed's state in words: connecting, failed (why), stopped; steps dropped by the server or here."""
    url, steps, last = feed.url, feed.num_received, feed.last_trace
    fields = {"url": url, "steps": steps, "step": None if last is None else last.step}
    early = "_early" if last is None else ""
    if feed.state == "connecting":
        st.info(t("server_connecting", lang).format(url=url))
    elif feed.state == "failed":
        key = {"unreachable": "server_unreachable", "not_minengine": "server_not_minengine",
               "bad_event": "server_bad_event", "dropped": "server_dropped" + early}[feed.error.kind]
        st.error(t(key, lang).format(error=feed.error.detail, **fields))
    elif feed.state == "stopped":
        key = "server_session_ended" if feed.stop_reason == "session_ended" else "server_stopped" + early
        st.info(t(key, lang).format(**fields))
    if feed.num_dropped:
        st.warning(t("server_num_dropped", lang).format(n=feed.num_dropped))
    if feed.num_lost:
        st.warning(t("server_num_lost", lang).format(n=feed.num_lost, keep=feed.max_pending))


def server_metric_cards(feed: ServerFeed, lang: str) -> None:
    """The server's own counters and means since it started (``GET /metrics``, read by the feed every 2 s), one
    number per card."""
    if feed.metrics is None:
        if feed.metrics_error:
            st.caption(t("server_metrics_error", lang).format(error=feed.metrics_error))
        return
    m = feed.metrics

    def fmt(key: str, scale: float = 1.0, spec: str = ",.0f", suffix: str = "") -> str:
        return "–" if m.get(key) is None else f"{m[key] * scale:{spec}}{suffix}"

    st.caption(t("server_metrics" if feed.state == "connected" else "server_metrics_last", lang))
    # Counters and means only: the gauges (running, waiting, KV use) are in the status line and the figures,
    # step by step; a /metrics reading up to 2 s old beside them would disagree.
    cards = (("sm_finished", fmt("requests_finished")), ("sm_prompt", fmt("prompt_tokens")),
             ("sm_generation", fmt("generation_tokens")), ("sm_preemptions", fmt("preemptions")),
             ("sm_prefix", fmt("prefix_hit_rate", 100, ".0f", " %")), ("sm_ttft", fmt("ttft_mean_s", 1000, ",.1f")),
             ("sm_itl", fmt("itl_mean_s", 1000, ",.1f")), ("sm_e2e", fmt("e2e_mean_s", 1000, ",.1f")))
    for row in (cards[:4], cards[4:]):
        for col, (key, value) in zip(st.columns(4), row):
            col.metric(t(key, lang), value)


def draw_server(player: LivePlayer, lang: str, window: int) -> None:
    feed: ServerFeed = player.stream
    server_messages(feed, lang)
    traces = player.traces[-window:]
    info = feed.info or {}
    if not traces:
        if feed.state == "connected":
            st.info(t("server_waiting", lang).format(url=feed.url, model=info.get("model", "?")))
        return
    last = traces[-1]
    state = {"connected": t("live_paused", lang) if player.paused else t("server_state_connected", lang),
             "stopped": t("server_state_stopped", lang), "failed": t("server_state_failed", lang)}.get(feed.state, "")
    st.markdown(t("server_status", lang).format(
        url=feed.url, state=state, step=last.step, running=last.num_running, waiting=last.num_waiting,
        finished=feed.num_finished, model=info.get("model", "?"), blocks=last.num_total_blocks,
        block_size=info.get("block_size", "?"), budget=last.token_budget, seqs=info.get("max_num_seqs", "?")))
    server_metric_cards(feed, lang)
    figs = server_figures(traces, lang, server_clock_label(feed, lang))
    if "pool" in figs:
        left, right = st.columns(2)
        left.plotly_chart(figs["pool"], key="server_pool")
        right.plotly_chart(figs["tables"], key="server_tables")
    else:
        st.info(t("server_no_blocks", lang))
    st.plotly_chart(figs["batch"], key="server_batch")
    left, right = st.columns(2)
    left.plotly_chart(figs["timeline"], key="server_timeline")
    right.plotly_chart(figs["itl"], key="server_itl")
    left, right = st.columns(2)
    left.plotly_chart(figs["queue"], key="server_queue")
    right.plotly_chart(figs["kv"], key="server_kv")
    st.caption(t("cap_server", lang).format(window=len(traces)))


def server_figures(traces: list, lang: str, clock: str) -> dict:
    """The live-server figures of ``traces``, kept for the next redraw while no new step came (an idle server
    costs no plotly work)."""
    key = (traces[0].step, traces[-1].step, len(traces), lang, clock)
    cached = st.session_state.get("server_figures")
    if cached is not None and cached[0] == key:
        return cached[1]
    last, figs = traces[-1], {}
    if all(tr.block_tables is not None for tr in traces):
        figs["pool"] = block_pool_figure(last, lang, request_ids=run_request_ids(traces))
        figs["tables"] = block_tables_figure(last, lang)
    figs["batch"] = batch_composition_figure(traces, lang, min_steps=LIVE_MIN_STEPS)
    figs["timeline"] = step_token_timeline_figure(traces, lang, clock)
    metrics = step_request_metrics(traces)
    figs["itl"] = itl_figure(metrics, traces, auto_stall_threshold(metrics), lang, clock_label=clock,
                             origin=traces[0].start_time)
    figs["queue"] = queue_figure(traces, lang, clock_label=clock)
    figs["kv"] = kv_usage_figure(traces, lang, clock_label=clock)
    st.session_state["server_figures"] = (key, figs)
    return figs


# ---- page -----------------------------------------------------------------------------------------------------
def preset_control(lang: str) -> str:
    """The workload preset. One selectbox per language: a browser keeps showing a keyed selectbox's old option
    labels when only format_func changes. The choice itself survives the switch through a plain session value."""
    st.sidebar.subheader(t("workload", lang))
    chosen = st.session_state.get("preset_choice", presets.PRESETS[0])
    preset = st.sidebar.selectbox(t("preset", lang), presets.PRESETS, index=presets.PRESETS.index(chosen),
                                  key=f"preset_{lang}", format_func=lambda p: t(f"preset_{p}", lang))
    st.session_state["preset_choice"] = preset
    return preset


def main() -> None:
    st.set_page_config(page_title="minengine", layout="wide")
    lang = language_control()
    st.title(t("app_title", lang))
    if source_control(lang) == "server":
        server_page(lang)
        return
    stop_server_feed()  # back to a local run: the server's feed (if any) goes
    st.write(t("app_intro", lang))

    preset = preset_control(lang)
    workload, messages = workload_controls(preset, lang)
    clock = clock_controls(lang)
    config = engine_controls(preset, lang, clock)
    threshold_ms = st.sidebar.number_input(t("stall_threshold", lang).format(k=AUTO_STALL_FACTOR), min_value=0.0,
                                           max_value=10_000.0, value=0.0, step=5.0, key="threshold")
    speed = live_speed_control(lang)

    st.info(t(f"preset_{preset}_help", lang).format(cp=t("chunked_prefill", lang),
                                                    hol=t("head_of_line_blocking", lang),
                                                    hit=t("prefix_cache_hit", lang), victim=t("victim", lang)))
    if workload is not None and workload.scale_note is not None:
        key, fields = workload.scale_note
        messages.append(("info", t(key, lang).format(**dict(fields))))
    show(messages)
    if config.model is None and not (Path(BUNDLED_MODEL) / "config.json").exists():
        st.error(t("model_missing", lang).format(path=BUNDLED_MODEL))
        return

    if st.button(t("run", lang), type="primary", disabled=workload is None, key="run"):
        start_run(config, workload, speed, lang)
    if "submitted" not in st.session_state:
        st.write(t("press_run", lang))
        if workload is not None:  # the run's own requests, and the browser loads plotly before the live view
            st.plotly_chart(workload_figure(workload, lang), key="workload")
        return
    if st.session_state["submitted"] != (config, workload):
        st.warning(t("stale_run", lang))
    config, workload = st.session_state["submitted"]
    if "run_error" in st.session_state:
        key, error = st.session_state["run_error"]
        st.error(t(key, lang).format(error=error))
        return
    if live_run_goes_on(lang, speed):
        return
    res = st.session_state.get("results", {}).get((config, workload))
    if res is not None:
        finished_view(config, workload, res, lang, threshold_ms)


def live_run_goes_on(lang: str, speed: float) -> bool:
    """This session's live run, if any: finish it now when asked, else draw its live view. True while it goes on
    (or failed: the message is on the page); False once there is none, its result kept by ``finished_result``."""
    player = st.session_state.get("live")
    if player is None:
        return False
    try:
        if st.session_state.pop("finish_requested", False):
            with st.spinner(t("running_engine", lang)):
                player.finish()
    except Exception as exc:  # the engine's guards (a run that does not finish) or any engine error: a message
        st.session_state.pop("live", None)
        st.error(t("run_failed", lang).format(error=exc))
        return True
    if not player.done:
        live_view(player, lang, speed)
        return True
    finished_result(player)
    st.session_state.pop("live")  # the engine (and its KV cache) can go
    return False


def finished_view(config: DashboardConfig, workload: Workload, res: RunResult, lang: str,
                  threshold_ms: float) -> None:
    """A finished run: how long it took, notes, then its five tabs (``threshold_ms`` 0 = the automatic stall
    threshold)."""
    clock = clock_label(config.clock, lang)
    st.caption(t("run_time", lang).format(seconds=res.wall_time_s, steps=len(res.traces), clock=clock))
    if res.parts:  # MINENGINE_LABS: the engine ran on parts a learner wrote
        st.caption(res.parts)
    if res.budget_raised:
        st.info(t("budget_raised", lang).format(cp=t("chunked_prefill", lang), tokens=res.token_budget))
    kernel_note_view(lang)  # a compile still going on counts up; a fallback to the torch path stays true

    # 0 = auto, from the run on screen; the A/B tab uses the same threshold for both of its runs
    threshold_s = threshold_ms / 1000 if threshold_ms > 0 else auto_stall_threshold(res.request_metrics)
    tabs = st.tabs([t(k, lang) for k in ("tab_blocks", "tab_batch", "tab_tbt", "tab_metrics", "tab_ab")])
    with tabs[0]:
        block_view(res, lang)
    with tabs[1]:
        batch_view(res, lang, workload.name)
    with tabs[2]:
        tbt_view(res, lang, threshold_s, clock)
    with tabs[3]:
        metrics_view(res, lang, clock)
    with tabs[4]:
        ab_view(config, workload, lang, threshold_s, workload.name)


# The sidebar's page list names what each page shows (a plain pages/ folder would list this file as "app"); a URL
# keeps working as before: the scheduler at /, the fleet at /Fleet; a real fleet's replicas at /Router.
PAGES = [st.Page(main, title="Scheduler", default=True), st.Page("pages/Fleet.py", title="Fleet"),
         st.Page("pages/Router.py", title="Router")]
st.navigation(PAGES).run()

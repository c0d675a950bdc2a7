"""The dashboard's Router page: a fleet of ``minengine serve`` replicas behind vLLM's router (``python -m minengine
fleet-serve``), followed live, replica beside replica.

``app.py`` lists this file as "Router" beside "Scheduler" and "Fleet" (``st.navigation``); it also runs alone. No
engine logic here: Connect asks the router for its replicas and opens one step feed each
(``minengine.viz.router_feed.open_replica_feeds``); each feed is played by a ``LivePlayer``, as the Scheduler page's
live-server source plays one, and redrawn at the same pace (``minengine.viz.server_pacing``). Which replica served
each request, and each replica's counts, come from a ``RoutingTally`` of every step the replicas sent since Connect
(the figures keep only the window); the block pools are ``minengine.viz`` builders. Pause stops reading every
feed at once (each server keeps its own backlog of steps, as in the live-server view).
"""

from __future__ import annotations

import time

import streamlit as st

from minengine.viz import block_pool_figure, run_request_ids
from minengine.viz.i18n import t
from minengine.viz.live import LivePlayer
from minengine.viz.router_feed import RouterError, RoutingTally, clock_offset, open_replica_feeds
from minengine.viz.router_figures import replica_label, replica_requests_figure
from minengine.viz.server_feed import DEFAULT_URL, ServerFeed
from minengine.viz.server_pacing import (
    SERVER_CONNECT_WAIT_S,
    SERVER_WINDOW,
    SERVER_WINDOWS,
    note_traffic,
    redraw_interval,
)
from minengine.viz.streamlit_session import session_alive_check

REPLICAS_PER_ROW = 4  # more replicas than this wrap onto the next row, so a pool figure keeps a readable width
RECENT_REQUESTS = 30  # rows of the requests -> replica table


def connect_router(url: str, api_key: str, window: int) -> None:
    """Connect pressed: stop this session's feeds if any, ask the router for its replicas, start one feed each,
    and wait a moment for their history replays (the rerun after this click draws them)."""
    stop_router_feeds()
    try:
        feeds = open_replica_feeds(url, api_key or None, history=window, alive=session_alive_check())
    except (ValueError, RouterError) as exc:
        st.session_state["router_error"] = ("router_error", {"error": str(exc)})
        return
    if not feeds:
        st.session_state["router_error"] = ("router_no_workers", {"url": url.strip()})
        return
    st.session_state["router_connected_url"] = url.strip().rstrip("/")
    st.session_state["router_players"] = {u: LivePlayer(f, speed=0, keep=max(SERVER_WINDOWS)) for u, f in feeds.items()}
    st.session_state["router_tally"] = RoutingTally(list(feeds))
    deadline = time.monotonic() + SERVER_CONNECT_WAIT_S
    for feed in feeds.values():
        feed.wait_history(max(0.0, deadline - time.monotonic()))


def disconnect_router() -> None:
    """Disconnect pressed: every feed stops; their steps stay on screen."""
    for player in st.session_state.get("router_players", {}).values():
        player.stream.stop()


def stop_router_feeds() -> None:
    """A new connection replaces this one: stop every feed and forget them."""
    for key in ("router_error", "router_figures", "router_idle", "router_last_new", "router_connected_url",
                "router_tally"):
        st.session_state.pop(key, None)
    for player in st.session_state.pop("router_players", {}).values():
        player.stream.stop()


def pause_router(players: dict[str, LivePlayer]) -> None:
    """Pause pressed: no replica's feed is read until Resume (the figures and counts stay as they are)."""
    for player in players.values():
        player.pause()


def resume_router(players: dict[str, LivePlayer]) -> None:
    """Resume pressed: every replica's feed is read again, from where it stopped."""
    for player in players.values():
        player.resume()


def tick_replicas(players: dict[str, LivePlayer]) -> int:
    """Take every replica's new steps and count them in this session's ``RoutingTally``; how many came."""
    tally: RoutingTally = st.session_state["router_tally"]
    new = 0
    for url, player in players.items():
        steps = player.tick()
        tally.add(url, steps, clock_offset(player.stream) or 0.0)
        new += len(steps)
    return new


def feed_message(feed: ServerFeed, lang: str) -> None:
    """One replica's feed state in words, with the live-server view's messages."""
    last = feed.last_trace
    fields = {"url": feed.url, "steps": feed.num_received, "step": None if last is None else last.step}
    early = "_early" if last is None else ""
    if feed.state == "connecting":
        st.info(t("server_connecting", lang).format(url=feed.url))
    elif feed.state == "failed":
        key = {"unreachable": "server_unreachable", "not_minengine": "server_not_minengine",
               "bad_event": "server_bad_event", "dropped": "server_dropped" + early}[feed.error.kind]
        st.error(t(key, lang).format(error=feed.error.detail, **fields))
    elif feed.state == "stopped":
        key = "server_session_ended" if feed.stop_reason == "session_ended" else "server_stopped" + early
        st.info(t(key, lang).format(**fields))
    if feed.num_dropped:
        st.warning(t("server_num_dropped", lang).format(n=feed.num_dropped))


def router_live_view(players: dict[str, LivePlayer], lang: str, window: int) -> None:
    """The replicas, redrawn by a fragment at the live-server view's pace (``server_pacing``) with the steps that
    arrived meanwhile."""
    live = not all(p.stream.done for p in players.values())
    paused = any(p.paused for p in players.values())
    if live:
        if paused:
            st.button(t("live_resume", lang), key="router_resume", on_click=resume_router, args=(players,),
                      type="primary")
        else:
            st.button(t("live_pause", lang), key="router_pause", on_click=pause_router, args=(players,))
    idle = st.session_state.get("router_idle", False)
    if live and not paused and not any(p.traces for p in players.values()):
        tick_replicas(players)  # steps that came on Connect (the history replays) are drawn at once
    first = not any(p.traces for p in players.values())

    @st.fragment(run_every=redraw_interval(not first, idle) if live and not paused else None)
    def frame() -> None:
        new = tick_replicas(players)
        ended = all(p.stream.done for p in players.values())
        if live and (ended or (first and any(p.traces for p in players.values()))):
            st.rerun()  # the whole page: Disconnect goes off, or the fragment takes the busy interval
        quiet = note_traffic(st.session_state, "router", bool(new), time.monotonic())
        if live and quiet != idle:
            st.session_state["router_idle"] = quiet
            st.rerun()  # the whole page: the fragment is registered again with the other interval
        draw_router(players, lang, window)

    frame()


def draw_router(players: dict[str, LivePlayer], lang: str, window: int) -> None:
    """Each replica's state and block pool side by side, then requests per replica and the recent requests."""
    traces = {u: p.traces[-window:] for u, p in players.items()}
    offsets = {u: off for u, p in players.items() if (off := clock_offset(p.stream)) is not None}
    routing = st.session_state["router_tally"].routing()
    urls = list(players)
    for row in range(0, len(urls), REPLICAS_PER_ROW):
        for col, url in zip(st.columns(min(len(urls), REPLICAS_PER_ROW)), urls[row:row + REPLICAS_PER_ROW]):
            with col:
                replica_panel(url, players[url], traces[url], routing.replicas[url], lang, urls.index(url))
    left, right = st.columns(2)
    left.plotly_chart(replica_requests_figure(routing, lang), key="router_requests")
    with right:
        st.markdown(f"**{t('router_recent', lang)}**")
        now = time.time()
        rows = [{t("request", lang): r.request_id, t("router_replica", lang): replica_label(r.replica),
                 t("router_col_first_seen", lang): round(now - r.first_time_s, 1) if r.replica in offsets else None,
                 t("router_col_tokens", lang): r.num_tokens, t("router_col_finished", lang): r.finished}
                for r in reversed(routing.routes[-RECENT_REQUESTS:])]
        st.dataframe(rows, key="router_routes", hide_index=True)
    st.caption(t("router_caption", lang).format(steps=sum(c.steps for c in routing.replicas.values())))


def replica_panel(url: str, player: LivePlayer, traces: list, counts, lang: str, index: int) -> None:
    """One replica: its name, its feed's state, a status line and its block pool at its latest step."""
    feed: ServerFeed = player.stream
    st.markdown(f"**{t('router_replica', lang)} {replica_label(url)}**")
    feed_message(feed, lang)
    if not traces:
        if feed.state == "connected":
            st.caption(t("server_waiting", lang).format(url=url, model=(feed.info or {}).get("model", "?")))
        return
    last = traces[-1]
    state = {"connected": t("live_paused", lang) if player.paused else t("server_state_connected", lang),
             "stopped": t("server_state_stopped", lang), "failed": t("server_state_failed", lang)}.get(feed.state, "")
    st.caption(t("router_replica_status", lang).format(
        state=state, step=last.step, running=last.num_running, waiting=last.num_waiting, used=counts.used_blocks,
        total=counts.total_blocks, requests=counts.requests, hit=counts.prefix_hit_tokens,
        queried=counts.prefix_queried_tokens))
    if all(tr.block_tables is not None for tr in traces):
        st.plotly_chart(pool_figure(url, traces, lang), key=f"router_pool_{index}")
    else:
        st.info(t("server_no_blocks", lang))


def pool_figure(url: str, traces: list, lang: str):
    """A replica's block pool at its latest step, kept for the next redraw while that replica took no step."""
    key = (traces[0].step, traces[-1].step, len(traces), lang)
    kept = st.session_state.setdefault("router_figures", {})
    if url not in kept or kept[url][0] != key:
        kept[url] = (key, block_pool_figure(traces[-1], lang, request_ids=run_request_ids(traces)))
    return kept[url][1]


def main() -> None:
    st.set_page_config(page_title="minengine router", layout="wide")
    lang = st.sidebar.radio("Language / 语言", ["en", "zh"], horizontal=True, key="router_lang",
                            format_func=lambda x: {"en": "English", "zh": "中文"}[x])
    st.title(t("router_title", lang))
    st.write(t("router_intro", lang))
    sb = st.sidebar
    sb.subheader(t("router", lang))
    url = sb.text_input(t("router_url", lang), value=DEFAULT_URL, key="router_url")
    api_key = sb.text_input(t("router_api_key", lang), type="password", key="router_api_key")
    window = sb.select_slider(t("server_window", lang), SERVER_WINDOWS, value=SERVER_WINDOW, key="router_window")
    players = st.session_state.get("router_players")
    cols = sb.columns(2)
    cols[0].button(t("server_connect", lang), key="router_connect", type="primary", on_click=connect_router,
                   args=(url, api_key, window))
    cols[1].button(t("server_disconnect", lang), key="router_disconnect", on_click=disconnect_router,
                   disabled=players is None or all(p.stream.done for p in players.values()))
    if "router_error" in st.session_state:
        key, fields = st.session_state["router_error"]
        st.error(t(key, lang).format(**fields))
        return
    if players is None:
        st.write(t("router_press_connect", lang))
        return
    if url.strip().rstrip("/") != st.session_state.get("router_connected_url"):
        st.caption(t("router_url_changed", lang).format(url=url.strip()))
    router_live_view(players, lang, window)


main()

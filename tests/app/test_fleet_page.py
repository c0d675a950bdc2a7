"""The dashboard's Fleet page (``pages/Fleet.py``) driven headless by ``streamlit.testing.v1.AppTest``: a colocated and
a disaggregated simulation with the modelled hardware named, both languages, the lanes figures, and bad input shown
as a message (never a traceback). Small windows: a few seconds per run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from tests.streamlit_colors import rewritten_colors  # noqa: E402

PAGE = Path(__file__).resolve().parents[2] / "pages" / "Fleet.py"


@pytest.fixture
def page():
    at = AppTest.from_file(str(PAGE), default_timeout=300)
    at.run()
    assert not at.exception
    at.sidebar.number_input(key="fleet_n").set_value(200)
    at.run()
    return at


def chart_titles(at: AppTest) -> list[str]:
    """Every chart's title; each chart is also checked for a colour Streamlit's frontend would repaint."""
    for c in at.get("plotly_chart"):
        assert rewritten_colors(c.proto.spec) == [], c.proto.spec[:200]
    return [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]


def test_colocated_then_disaggregated(page):
    at = page
    assert "Simulate" in [b.label for b in at.button] and not at.get("plotly_chart")
    at.button(key="fleet_run").click().run()
    assert not at.exception
    captions = [c.value for c in at.caption]
    assert captions[0].startswith("4 x H100 SXM (TP 1), colocated")
    titles = chart_titles(at)
    assert len(titles) == 5 and sum("lanes" in t for t in titles) == 2
    assert all("modelled: H100 SXM, Llama-3-8B shapes" in t for t in titles[:3])  # the hardware is named
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["KV transfers (mean ms)"].startswith("0 ")

    at.sidebar.radio(key="fleet_layout").set_value("disaggregated").run()
    assert any("press Simulate" in w.value for w in at.warning)  # the shown run is the old one
    at.sidebar.selectbox(key="fleet_link").set_value("ethernet-100g").run()
    at.button(key="fleet_run").click().run()
    assert not at.exception and not at.warning
    assert "disaggregated over 100 Gb/s Ethernet" in at.caption[0].value
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["KV transfers (mean ms)"].startswith("200 ")
    lanes = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert lanes["data"][0]["y"] == ["P0", "P1", "D0", "D1"]


def test_chinese_and_bad_input(page):
    at = page
    at.sidebar.radio(key="fleet_lang").set_value("zh").run()
    at.button(key="fleet_run").click().run()
    assert not at.exception
    assert "集群" in at.title[0].value and "混合部署" in at.caption[0].value
    assert "副本泳道" in chart_titles(at)[0]
    at.sidebar.radio(key="fleet_layout").set_value("disaggregated").run()
    at.sidebar.number_input(key="fleet_gpus").set_value(1).run()
    assert not at.exception and "at least 2 replicas" in at.error[0].value  # the message names the limit
    at.sidebar.radio(key="fleet_layout").set_value("colocated").run()
    at.sidebar.selectbox(key="fleet_hw").set_value("l4").run()
    at.sidebar.selectbox(key="fleet_model").set_value("llama-3-70b").run()
    assert not at.exception and "do not fit" in at.error[0].value


def test_kv_store_is_one_more_lane(page):
    """With the fleet KV store (DRAM + SSD) and the conductor router: the store's lanes under the replicas' (DRAM and
    SSD use, loads in flight), its metrics, and where prompt tokens came from against the window's ideal."""
    at = page
    if "mooncake" in at.sidebar.selectbox(key="fleet_trace").options:
        at.sidebar.selectbox(key="fleet_trace").set_value("mooncake").run()
    at.sidebar.selectbox(key="fleet_router").set_value("conductor").run()
    at.sidebar.radio(key="fleet_store").set_value("ssd").run()
    at.sidebar.number_input(key="fleet_store_gpn").set_value(1).run()  # one node per GPU: loads cross the network
    at.button(key="fleet_run").click().run()
    assert not at.exception and not at.error
    assert "KV store 1 TB DRAM + 4.0 TB SSD per 1-GPU node, 400 Gb/s InfiniBand" in at.caption[0].value
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["served from the KV store"].endswith("%")
    assert "loaded / written (GB)" in metrics and "loads (declined: recompute cheaper)" in metrics
    kv, queue = (json.loads(c.proto.spec) for c in at.get("plotly_chart")[:2])
    assert kv["data"][0]["y"][-2:] == ["store", "store SSD"] and queue["data"][0]["y"][-1] == "store loads"
    assert len(kv["data"][0]["y"]) == 4 + 2
    titles = chart_titles(at)
    assert any(t.startswith("Where prompt tokens came from") for t in titles)
    at.sidebar.radio(key="fleet_lang").set_value("zh").run()
    at.button(key="fleet_run").click().run()
    assert not at.exception and "存储" in json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]["y"][-2]

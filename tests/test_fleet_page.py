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

PAGE = Path(__file__).resolve().parents[1] / "pages" / "Fleet.py"


@pytest.fixture
def page():
    at = AppTest.from_file(str(PAGE), default_timeout=300)
    at.run()
    assert not at.exception
    at.sidebar.number_input(key="fleet_n").set_value(200)
    at.run()
    return at


def chart_titles(at: AppTest) -> list[str]:
    return [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]


def test_colocated_then_disaggregated(page):
    at = page
    assert "Simulate" in [b.label for b in at.button] and not at.get("plotly_chart")
    at.button(key="fleet_run").click().run()
    assert not at.exception
    captions = [c.value for c in at.caption]
    assert captions[0].startswith("4 x H100 SXM (TP 1), colocated")
    titles = chart_titles(at)
    assert len(titles) == 4 and sum("lanes" in t for t in titles) == 2
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

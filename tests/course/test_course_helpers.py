"""The course's helpers beyond checks: the teaching clock, the state recorder and its figure, the cost-model figures,
the /metrics reader."""

from __future__ import annotations

import pytest

from minengine import SamplingParams
from minengine.request import RequestStatus


def test_teaching_clock_is_the_modelled_h100_and_fresh_per_engine():
    from minengine.course import CLOCK_LABEL, modelled_engine, run_to_completion, teaching_clock

    assert CLOCK_LABEL == "modelled: H100 SXM, Llama-3-8B shapes"
    assert teaching_clock() is not teaching_clock() and teaching_clock()() == 0.0
    durations = []
    for _ in range(2):
        eng = modelled_engine(max_num_batched_tokens=64, trace_block_tables=False)
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        eng.add_request("a", {"prompt_token_ids": [5] * 40}, params)
        run_to_completion(eng)
        durations.append([t.duration for t in eng.traces])
        assert eng.clock.label == CLOCK_LABEL
    assert durations[0] == durations[1] and min(durations[0]) > 0.005  # GPU magnitudes, bit-identical twice


def test_state_recorder_sees_every_transition_and_the_figure_knows_them():
    from minengine.course import modelled_engine
    from minengine.course.states import StateRecorder
    from minengine.viz.state_machine import REQUEST_TRANSITIONS, state_machine_figure

    eng = modelled_engine(block_size=16, num_kv_blocks=16, max_num_batched_tokens=512, preemption_mode="swap",
                          swap_space_blocks=6, enable_prefix_caching=False, trace_block_tables=False)
    rec = StateRecorder(eng)
    arrivals = [(0, f"r{i}", {"prompt_token_ids": [(11 * i + k) % 2000 + 3 for k in range(48)]},
                 SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)) for i in range(6)]
    arrivals.append((2, "gone", {"prompt_token_ids": [5] * 20}, SamplingParams(temperature=0.0, max_tokens=100)))
    rec.run(arrivals, aborts=[(30, "gone")])
    eng.add_request("late", {"prompt_token_ids": [7] * 20}, SamplingParams(max_tokens=50), deadline=eng.clock() + 0.02)
    while eng.has_unfinished_requests():
        rec.step()
    pairs = set(rec.pairs())
    known = {(a, b) for a, b, _ in REQUEST_TRANSITIONS}
    assert pairs <= known
    assert {(RequestStatus.RUNNING, RequestStatus.SWAPPED), (RequestStatus.RUNNING, RequestStatus.PREEMPTED),
            (RequestStatus.WAITING, RequestStatus.FINISHED_ABORTED)} <= pairs
    assert any(b is RequestStatus.FINISHED_TIMEOUT for _, b in pairs)
    for rid in ["r0", "r5", "gone", "late"]:  # every history starts waiting, ends finished, and moves along arrows
        path = rec.history(rid)
        assert path[0] is RequestStatus.WAITING and path[-1].finished
        assert all((a, b) in known for a, b in zip(path, path[1:]))
    fig = state_machine_figure(rec.pairs())
    assert {t.replace("<br>", "_") for t in fig.data[0].text} == {s.name for s in RequestStatus}
    with pytest.raises(ValueError, match="not in the state machine"):
        state_machine_figure([(RequestStatus.FINISHED_LENGTH, RequestStatus.RUNNING)])


def test_state_machine_labels_overlap_nothing():
    """Edge labels must not overlap: every label box (estimated from its text at the figure's fixed size)
    is clear of every other label and every state, inside the figure, whichever arrows were taken."""
    from collections import Counter

    from minengine.viz import state_machine as sm

    def overlap(a, b):
        return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]

    pairs = [(a, b) for a, b, _ in sm.REQUEST_TRANSITIONS]
    for counts in (Counter(), Counter(dict.fromkeys(pairs, 999)), Counter(dict.fromkeys(pairs[::2], 12)),
                   Counter(dict.fromkeys(pairs[1::3], 7))):
        boxes, nodes = sm.label_boxes(sm.label_layout(counts)), sm.node_boxes()
        sx, sy = sm._px_per_unit()
        for i, box in enumerate(boxes):
            assert not any(overlap(box, other) for other in boxes[:i]), (i, counts)
            assert not any(overlap(box, node) for node in nodes), (i, counts)
            assert sm._X_RANGE[0] * sx <= box[0] and box[2] <= sm._X_RANGE[1] * sx
            assert sm._Y_RANGE[0] * sy <= box[1] and box[3] <= sm._Y_RANGE[1] * sy


def test_cost_figures_place_steps_under_the_roofs():
    from minengine.timing import StepCostModel, StepWork
    from minengine.viz.cost_figures import roofline_figure, roofs_figure

    m = StepCostModel("h100", "llama-3-8b")
    steps = {"decode": m.cost(StepWork.of([(1, 1000, 1)] * 8)), "prefill": m.cost(StepWork.of([(2048, 0, 1)]))}
    fig = roofline_figure(m, steps)
    hw = m.hardware
    peak = hw.peak_flops_for(m.shape.dtype_bytes) * hw.mfu
    for trace, cost in zip(fig.data[2:], steps.values()):
        x, y = trace.x[0], trace.y[0] * 1e12
        assert x == cost.arithmetic_intensity
        assert y <= min(peak, x * hw.memory_bandwidth * hw.mbu) * 1.0001  # a step never beats its roof
    bars = roofs_figure(steps)
    assert [b.name for b in bars.data][:2] == ["compute time (FLOPs / effective peak)",
                                                "memory time (bytes / effective bandwidth)"]


def test_metric_reader_finds_samples_and_defaults_to_zero():
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from minengine.course.serving import metric

    registry = CollectorRegistry()  # the text a server exports, as prometheus_client writes it
    Counter("vllm:request_success", "finished", ["finished_reason"], registry=registry).labels("length").inc(3)
    Gauge("vllm:num_requests_running", "running", registry=registry).set(2)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert metric(families, "vllm:request_success", finished_reason="length") == 3.0
    assert metric(families, "vllm:request_success", finished_reason="abort") == 0.0  # never moved: no sample yet
    assert metric(families, "vllm:num_requests_running") == 2.0
    with pytest.raises(KeyError):
        metric(families, "vllm:nope")


def test_check_close_states_its_tolerance_and_hides_the_hint_until_tried(capsys):
    from minengine.course import check, check_close, check_function

    assert not check_close("tight", 1.1, 1.0, rel_tol=1e-6, hint="think again")
    out = capsys.readouterr().out
    assert "not within 0.0001% of the measured value" in out and "hint: think again" in out
    assert not check_close("loose", 2.0, 1.0, rel_tol=0.02, abs_tol=0.5)
    assert "not within 2% or 0.5 of" in capsys.readouterr().out
    assert not check_close("exact", 2.0, 1.0, rel_tol=0.0)
    assert "not equal to the measured value" in capsys.readouterr().out
    assert check_close("close", 1.0 + 1e-9, 1.0, rel_tol=1e-6)
    for verdict in (check("a", None, 3, hint="the formula"), check_close("b", None, 3.0, hint="the formula"),
                    check_function("c", None, [((1,), 1)], hint="the formula")):
        assert not verdict
    out = capsys.readouterr().out
    assert out.count("not answered yet") == 3 and "the formula" not in out


def test_check_function_with_a_tolerance_checks_every_case(capsys):
    """``rel_tol``: numbers within the tolerance pass on every case; a formula right on one case only, a result
    that is not a number, and a negative tolerance fail; objects with a name are named in the message."""
    from minengine.course import check_function
    from minengine.timing.hardware import HARDWARE

    cases = [((HARDWARE["h100"], 2.0), 2.0 * HARDWARE["h100"].mfu), ((HARDWARE["cpu"], 3.0), 3.0)]
    assert check_function("f", lambda hw, x: x * hw.mfu * 1.001, cases, rel_tol=0.01)
    h100_only = HARDWARE["h100"].mfu
    assert not check_function("f", lambda hw, x: x * h100_only, cases, rel_tol=0.01)  # right for the H100 only
    assert not check_function("f", lambda hw, x: "3.0", cases, rel_tol=0.01)
    assert not check_function("f", lambda hw, x: x * hw.mfu * 1.05, cases, rel_tol=0.01)
    out = capsys.readouterr().out
    assert f"wrong for ('CPU (2 cores, fitted)', 3.0): got {3.0 * h100_only:.5g}" in out and out.count("FAIL") == 3
    with pytest.raises(ValueError, match="rel_tol"):
        check_function("f", abs, cases, rel_tol=-1)


def test_check_function_names_a_long_argument_by_its_size(capsys):
    """A run's ``request_metrics`` as an argument: a FAIL names it by type and size, not by pages of repr; short
    arguments are shown as they are."""
    from minengine.course import check_function

    metrics = {f"r{i}": 0.001 * i for i in range(40)}
    cases = [(([1, 2], 3), 3), ((metrics, 2), len(metrics))]
    assert not check_function("f", lambda xs, slo: len(xs), cases)  # forgot the second argument
    assert not check_function("f", lambda xs, slo: 3, cases)  # a constant right on the first case only
    out = capsys.readouterr().out
    assert "wrong for ([1, 2], 3): got 2" in out and "wrong for (<dict of 40 items>, 2): got 3" in out
    assert "r39" not in out and out.count("FAIL") == 2


# A stand-in for ``python -m minengine serve``: sleeps, optionally prints and exits, then answers /health.
_FAKE_SERVER = """
import http.server, sys, time
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
delay, exit_code = float(argv[0]), int(argv[1])
print("loading the model", flush=True)
time.sleep(delay)
if exit_code:
    print("boom: no such model", flush=True)
    sys.exit(exit_code)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def _fake_server(tmp_path, delay_s: float, exit_code: int = 0, **kwargs):
    import sys

    from minengine.course.serving import ServerProcess

    script = tmp_path / "fake_server.py"
    script.write_text(_FAKE_SERVER)
    return ServerProcess([str(delay_s), str(exit_code)], program=[sys.executable, str(script)], **kwargs)


def test_server_process_waits_for_a_slow_start_and_says_so(tmp_path, capsys):
    server = _fake_server(tmp_path, delay_s=2.5, timeout_s=60, progress_every_s=1.0)
    try:
        assert server.running
        out = capsys.readouterr().out
        assert "still starting the server" in out and "loading the model" in out  # progress with its last line
    finally:
        assert server.stop() is not None and not server.running


def test_server_process_fails_with_a_clear_message_not_a_traceback(tmp_path):
    from minengine.course.serving import ServerStartError

    with pytest.raises(ServerStartError, match=r"did not answer /health within 1 s") as late:
        _fake_server(tmp_path, delay_s=60, timeout_s=1.0, progress_every_s=100)
    message = late.value._render_traceback_()  # what IPython shows instead of a traceback
    assert message[0].startswith("ServerStartError: the server did not answer")
    assert any("loading the model" in line for line in message) and any("MINENGINE_CPU_KERNEL=0" in line
                                                                        for line in message)
    assert not any("Traceback" in line or ".py\", line" in line for line in message)
    with pytest.raises(ServerStartError, match=r"exited with code 3") as died:
        _fake_server(tmp_path, delay_s=0, exit_code=3)
    assert "boom: no such model" in str(died.value)


def test_course_log_axes_label_decades_only():
    """Log axes must not print stray minor-tick digits ("2", "5" between decades): every chapter's setup cell
    (its first or second code cell) installs the course template, and under it every axis of a new figure
    (overlaid ones too) has no minor log labels (a kaleido render of such an axis 1-3,000 gives the ticks 1, 10,
    100, 1000 and nothing else)."""
    import json
    from pathlib import Path

    import plotly.graph_objects as go
    import plotly.io as pio

    from minengine.viz.template import use_course_template

    before = pio.templates.default
    try:
        assert use_course_template() == "plotly+minengine"
        fig = go.Figure(go.Scatter(x=[1, 3000], y=[1, 2]))
        fig.update_layout(xaxis={"type": "log"}, yaxis2={"type": "log", "overlaying": "y"})
        axes = fig.to_dict()["layout"]["template"]["layout"]
        assert axes["xaxis"]["minorloglabels"] == axes["yaxis"]["minorloglabels"] == "none"

    finally:
        pio.templates.default = before
    for path in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        assert any("use_course_template()" in "".join(c["source"]) for c in cells[:2]), path.name  # the setup cell


def test_course_right_axes_tick_at_round_values():
    """A right axis (``overlaying="y"``) ticks, by plotly.js's default (``tickmode="sync"``, plotly.js 3+), on the
    left axis's grid lines at whatever values fall there (249, 406, 563, ...): every overlaid axis of a chapter asks
    for automatic round ticks and draws no grid of its own."""
    import json
    from pathlib import Path

    found = 0
    for path in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            src = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
            for line in (ln for ln in src.splitlines() if 'overlaying="y"' in ln):
                found += 1
                assert 'tickmode="auto"' in line and "showgrid=False" in line, (path.name, line)
    assert found >= 5  # chapters 4, 7, 8, 11 and 12 have one


def test_attention_traffic_counts_the_bytes_chapters_8_and_11_quote():
    from minengine.course.attention_traffic import attention_flops, dense_bytes, flash_bytes, gather_bytes

    n = c = 64
    d = 16
    assert dense_bytes(n, c, d) == 2 * (4 * n * d + 4 * n * n)  # Q, K, V, O once; S and P written and read
    # one tile holding every query reads each K/V block once: Q, O, K, V once, no n x n term
    assert flash_bytes(n, c, d, q_tile=n) == 2 * 4 * n * d
    # one query per tile re-reads the K/V blocks up to its own position (whole 16-token blocks)
    per_query_kv = sum(-(-(t + 1) // 16) * 16 for t in range(n))
    assert flash_bytes(n, c, d, q_tile=1) == 2 * (2 * n * d + 2 * d * per_query_kv)
    # a GQA group of 4 shares each K/V tile: Q and O of 4 heads, the K/V once
    assert flash_bytes(n, c, d, q_tile=n, group=4) == 2 * (2 * n * d * 4 + 2 * d * c)
    assert gather_bytes(20, d) == 2 * 2 * d * (32 + 20)  # two whole blocks read, 20 tokens written, K and V
    assert attention_flops(1, 10, d, heads=2) == 4 * d * 2 * 10  # a decode sees all 10 keys

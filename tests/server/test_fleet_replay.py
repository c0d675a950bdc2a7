"""``minengine.fleet.replay`` on a tiny real fleet: two ``minengine serve`` replicas behind vllm-router's
``cache_aware`` policy (``fleet-serve``), a few text requests two of which re-send an earlier prompt's head. The
records say which replica served each request and what its prefix cache held; both are checked against the
replicas' own ``/metrics`` counters, and the simulator, configured as this fleet with a clock fitted to a replica's
measured steps, places and hits the same requests."""

from __future__ import annotations

import re
import signal

import httpx
import pytest

from minengine.fleet.replay import (
    POLICY_ROUTERS,
    WindowRequest,
    measure_step_costs,
    replay_through_router,
    replica_steps,
    simulate_window,
    twin_config,
)
from minengine.timing.model_shape import ModelShape
from tests.server_helpers import finished_requests, free_ports, start_fleet

pytest.importorskip("vllm_router", reason="vllm-router is not installed (pip install -c constraints.txt "
                    "vllm-router): the fleet runs behind it")


def prefix_hits(url: str) -> int:
    """The replica's ``vllm:prefix_cache_hits_total`` (prompt tokens served from its prefix cache)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return round(sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$", text, re.M)))


def test_replay_records_match_the_replicas_counters_and_the_twin(bundled_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bundled_model)
    heads = ["ROMEO:\nBut soft, what light through yonder window breaks? It is the east.\n" * 3,
             "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo? Deny thy father.\n" * 3]
    texts = [heads[0] + "Arise", heads[1] + "Or if", heads[0] + "fair sun", heads[1] + "and I'll", heads[0] + "Who"]
    window = [WindowRequest(f"r{i}", 1.0 * i, t, tok.encode(t), 3) for i, t in enumerate(texts)]  # one at a time
    port = free_ports(3)
    fleet, lines, _ = start_fleet(["--num-replicas", "2", "--port", str(port), "--policy", "cache_aware",
                                   "--startup-timeout", "50", "--router-log-level", "warning", "--",
                                   bundled_model, "--max-model-len", "512", "--uvicorn-log-level", "warning"])
    workers = [f"http://127.0.0.1:{port + 1 + i}" for i in range(2)]
    try:
        shape = ModelShape.from_hf_config(bundled_model, dtype_bytes=4)
        costs = measure_step_costs(workers[0], shape, prompt_lens=(16, 64, 256), batch_sizes=(1, 4))
        calibration = [finished_requests(u) for u in workers]
        hits_before = [prefix_hits(u) for u in workers]
        real = replay_through_router(f"http://127.0.0.1:{port}", workers, window, timeout_s=60)
        served = [finished_requests(u) - c for u, c in zip(workers, calibration)]
        hits = [prefix_hits(u) - h for u, h in zip(workers, hits_before)]
        info = replica_steps(workers[0])[0]
    finally:
        fleet.send_signal(signal.SIGTERM)
        code = fleet.wait(timeout=60)
    assert code == 0, "".join(lines[-20:])
    assert [r.request_id for r in real.records] == [w.request_id for w in window]
    assert real.requests_per_replica() == served  # where the steps say each request ran = each replica's count
    for i in range(2):
        assert sum(r.cached_tokens for r in real.records if r.replica == i) == hits[i]
    assert [r.prompt_tokens for r in real.records] == [len(w.prompt_token_ids) for w in window]
    assert all(r.output_tokens == 3 and 0 < r.ttft_s < 30 for r in real.records)
    first, resent = real.records[:2], real.records[2:]
    assert all(r.cached_tokens == 0 for r in first)
    for r in resent:  # cache_aware sent each re-sent head where it went before, and that replica's cache held it
        earlier = real.records[int(r.request_id[1:]) - 2]
        assert r.replica == earlier.replica and r.cached_tokens >= 48 and r.cached_tokens % 16 == 0
    assert costs.r2 > 0 and len(costs.points) >= 4 and costs.hardware.combine == "sum"
    twin = simulate_window(window, twin_config(info, costs.hardware, shape, 2, POLICY_ROUTERS["cache_aware"]))
    assert sorted(twin.requests_per_replica()) == sorted(real.requests_per_replica())
    assert [r.cached_tokens for r in twin.records] == [r.cached_tokens for r in real.records]

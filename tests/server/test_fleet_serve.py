"""``python -m minengine fleet-serve``: two real replicas behind the real vllm-router, driven with the ``openai``
client; the router's round-robin shows in each replica's own ``/metrics``, and SIGTERM leaves no process."""

from __future__ import annotations

import signal
import socket
import time

import httpx
import psutil
import pytest

from minengine.entrypoints.fleet_serve import (
    Fleet,
    FleetArgs,
    FleetStartError,
    replica_threads,
    router_command,
)
from tests.server_helpers import finished_requests, free_ports, start_fleet

pytest.importorskip("vllm_router", reason="vllm-router is not installed (pip install -c constraints.txt "
                    "vllm-router): the fleet runs behind it")


def test_two_replicas_behind_the_router_round_robin_then_sigterm_leaves_no_process(bundled_model):
    from openai import OpenAI

    port = free_ports(3)
    fleet, lines, pids = start_fleet(["--num-replicas", "2", "--port", str(port), "--policy", "round_robin",
                                      "--startup-timeout", "50", "--", bundled_model, "--max-model-len", "256",
                                      "--uvicorn-log-level", "warning"])
    try:
        assert len(pids) >= 4, pids  # the fleet, two replicas, the router
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        for i in range(6):
            out = client.completions.create(model=model, prompt=f"To be {i}", max_tokens=3, temperature=0)
            assert out.choices[0].text and out.usage.completion_tokens == 3
        counts = [finished_requests(f"http://127.0.0.1:{port + 1 + i}") for i in range(2)]
        assert counts == [3, 3], counts
    finally:
        fleet.send_signal(signal.SIGTERM)
        code = fleet.wait(timeout=60)
    assert code == 0, "".join(lines[-20:])
    _, alive = psutil.wait_procs([p for p in map(_process, pids) if p is not None], timeout=10)
    assert not alive, alive


def test_a_replica_that_dies_stops_the_fleet_with_code_1(bundled_model):
    port = free_ports(2)
    fleet, lines, pids = start_fleet(["--num-replicas", "1", "--port", str(port), "--startup-timeout", "50", "--",
                                      bundled_model, "--max-model-len", "128"])
    try:
        replica = next(p for p in psutil.Process(fleet.pid).children() if "serve" in p.cmdline())
        replica.kill()
        code = fleet.wait(timeout=60)
    finally:
        if fleet.poll() is None:
            fleet.kill()
    time.sleep(0.2)  # the reader thread takes the last lines
    assert code == 1 and any(f"replica 0 (http://127.0.0.1:{port + 1}) exited with code -9" in line
                             for line in lines), "".join(lines[-20:])
    _, alive = psutil.wait_procs([p for p in map(_process, pids) if p is not None], timeout=10)
    assert not alive, alive


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def test_a_replica_that_fails_to_start_is_named_with_its_output(tmp_path):
    port = free_ports(2)
    fleet = Fleet(FleetArgs([str(tmp_path / "no-model")], num_replicas=1, port=port, startup_timeout_s=50))
    with pytest.raises(FleetStartError, match=r"replica 0 \(http://127.0.0.1:\d+\) did not start(.|\n)*no-model"):
        fleet.start()
    assert fleet.router is None and not fleet.replicas[0].running


def test_clear_errors_before_anything_starts(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {taken} on 127.0.0.1 is in use"):
            Fleet(FleetArgs(["m"], num_replicas=1, port=taken))
        with pytest.raises(ValueError, match=f"port {taken} on 127.0.0.1 is in use"):
            Fleet(FleetArgs(["m"], num_replicas=2, port=taken - 2))
    with pytest.raises(ValueError, match="--policy must be one of"):
        router_command(["http://h:1"], "127.0.0.1", 8000, "fastest")
    with pytest.raises(ValueError, match="power_of_two .* needs at least 2"):
        router_command(["http://h:1"], "127.0.0.1", 8000, "power_of_two")
    with pytest.raises(ValueError, match="--worker-urls: 'h:1' is not an http"):
        router_command(["h:1"], "127.0.0.1", 8000, "round_robin")
    with pytest.raises(ValueError, match="--num-replicas must be >= 1"):
        FleetArgs(["m"], num_replicas=0)
    with pytest.raises(ValueError, match=r"--port 65535: the router and replicas need ports 65535..65537"):
        FleetArgs(["m"], num_replicas=2, port=65535)
    with pytest.raises(ValueError, match="--startup-timeout must be in"):
        FleetArgs(["m"], startup_timeout_s=0)
    assert [replica_threads(n, cores=4) for n in (1, 2, 3, 8)] == [4, 2, 1, 1]
    # the router's Prometheus exporter: a free port of its own unless named (its default would clash between fleets)
    ports = [int(cmd[cmd.index("--prometheus-port") + 1])
             for cmd in (router_command(["http://h:1"], "127.0.0.1", 8000, "round_robin") for _ in range(2))]
    assert all(ports) and 29000 not in ports
    named = router_command(["http://h:1"], "127.0.0.1", 8000, "round_robin", extra=["--prometheus-port", "29100"])
    assert named.count("--prometheus-port") == 1 and named[named.index("--prometheus-port") + 1] == "29100"
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install vllm-router"):
        router_command(["http://h:1"], "127.0.0.1", 8000, "round_robin")


def test_worker_urls_run_only_the_router_in_front_of_running_replicas(bundled_model):
    from tests.server_helpers import running_server

    with running_server(bundled_model) as replica:
        fleet = Fleet(FleetArgs([], worker_urls=[replica.url], port=free_ports(1), policy="cache_aware"))
        with fleet:
            assert fleet.replicas == [] and fleet.worker_urls == [replica.url]
            model = httpx.get(replica.url + "/v1/models", timeout=10).json()["data"][0]["id"]
            body = {"model": model, "prompt": "To be", "max_tokens": 2}
            reply = httpx.post(fleet.url + "/v1/completions", json=body, timeout=30)
            assert reply.status_code == 200, reply.text
            pids = fleet.pids()
        assert finished_requests(replica.url) == 1  # the router sent it to the replica
    _, alive = psutil.wait_procs([p for p in map(_process, pids) if p is not None], timeout=10)
    assert not alive and fleet.router.returncode is not None


@pytest.mark.parametrize("argv, message", [
    (["fleet-serve", "--num-replicas", "2"], "give the replicas' serve arguments"),
    (["fleet-serve", "--", "m", "--port", "9000"], "--port after the fleet's flags"),
    (["fleet-serve", "--worker-urls", "http://h:1", "--", "m"], "--worker-urls runs only the router"),
])
def test_the_command_line_names_what_is_wrong(argv, message, capsys):
    from minengine.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err

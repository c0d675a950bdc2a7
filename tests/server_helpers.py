"""Start minengine's OpenAI server in this process, on a free loopback port, for a test."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import psutil

from minengine import LLMEngine
from minengine.entrypoints.async_engine import AsyncLLMEngine
from minengine.entrypoints.cli_args import FrontendArgs
from minengine.entrypoints.fleet_serve import free_ports  # noqa: F401  (tests import it from here)
from minengine.entrypoints.openai_server import make_server
from minengine.entrypoints.server_process import child_env

SERVER_CONFIG = dict(max_model_len=512, num_kv_blocks=256, max_num_batched_tokens=256, max_num_seqs=64)


def free_socket() -> socket.socket:
    """A socket bound to 127.0.0.1 on a port the OS picked (no fixed ports: tests may run side by side)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class RunningServer:
    """A uvicorn server in a background thread. ``url`` is its base URL; ``engine`` the ``LLMEngine`` behind
    it (read it only while the server is idle: the engine loop owns it)."""

    def __init__(self, engine: LLMEngine, frontend: FrontendArgs | None = None, **async_kwargs):
        self.async_engine = AsyncLLMEngine(engine, **async_kwargs)
        self.engine = engine
        self._sock = free_socket()
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = make_server(self.async_engine, frontend, log_level="warning")
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self, timeout: float = 30.0) -> RunningServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Until the engine has no unfinished request (raises on timeout)."""
        deadline = time.monotonic() + timeout
        while self.engine.has_unfinished_requests() or self.async_engine.num_unfinished_streams:
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine still busy: {list(self.engine.scheduler.requests)}")
            time.sleep(0.01)


@contextlib.contextmanager
def running_server(model: str, frontend: FrontendArgs | None = None, **config):
    """``with running_server(model, max_model_len=...) as server:`` a fresh engine served on a free port (with the
    server settings of ``frontend``: api keys, chat template, limits...)."""
    server = RunningServer(LLMEngine.from_config(model=model, **{**SERVER_CONFIG, **config}), frontend).start()
    try:
        yield server
    finally:
        server.stop()


def finished_requests(url: str) -> int:
    """The replica's finished requests: the sum of its ``vllm:request_success_total`` series."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return round(sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M)))


def start_fleet(args: list[str]) -> tuple[subprocess.Popen, list[str], list[int]]:
    """``python -m minengine fleet-serve ARGS`` started and waited for until its router is up: (the process, its
    output lines so far, growing as it prints, and the pids of the fleet and every process under it)."""
    fleet = subprocess.Popen([sys.executable, "-m", "minengine", "fleet-serve", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=child_env())
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(fleet.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 55
        while not any(line.startswith("minengine fleet: router") for line in lines):
            assert fleet.poll() is None and time.monotonic() < deadline, "".join(lines[-20:])
            time.sleep(0.2)
    except BaseException:
        fleet.send_signal(signal.SIGTERM)  # the fleet stops what it started
        try:
            fleet.wait(timeout=60)
        finally:
            fleet.kill()
        raise
    return fleet, lines, [fleet.pid] + [c.pid for c in psutil.Process(fleet.pid).children(recursive=True)]

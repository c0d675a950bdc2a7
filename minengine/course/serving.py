"""Chapter 9's helpers: run ``python -m minengine serve`` as a real process, read its ``/metrics`` and its step feed.

Nothing here serves requests: the server is the project's own CLI in a subprocess (the same command a user runs),
the requests go through the official ``openai`` client or ``httpx``, and ``/metrics`` is parsed with
``prometheus_client``'s text parser.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

import minengine
from minengine.metrics.trace import StepTrace
from minengine.viz.live import trace_from_dict


def free_port() -> int:
    """A TCP port on 127.0.0.1 that the OS says is free now (bound, read and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env() -> dict:
    """The environment for a child ``python -m minengine``: this process's, with the ``minengine`` it imported
    first on ``PYTHONPATH`` (so the server runs the same code as the notebook) and unbuffered output."""
    root = str(Path(minengine.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1"}


class ServerProcess:
    """``python -m minengine serve ARGS --port PORT`` running in a subprocess on 127.0.0.1.

    Attributes:
        url: the base URL, ``http://127.0.0.1:PORT``.
        command: the command line that started it.
        process: the ``subprocess.Popen``.

    The process is terminated at interpreter exit too, so a notebook that stops half-way leaves no server behind.
    """

    def __init__(self, args: list[str], timeout_s: float = 180.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "minengine", "serve", *args, "--port", str(self.port),
                        "--uvicorn-log-level", "warning"]
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=child_env())
        atexit.register(self.stop)
        self._wait_healthy(timeout_s)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                output = self.process.stdout.read()
                raise RuntimeError(f"the server exited with code {self.process.returncode}:\n{output}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not answer /health within {timeout_s:.0f} s")
            time.sleep(0.2)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Terminate the server (SIGTERM, then SIGKILL after ``timeout_s``); returns its exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        return self.process.returncode


def read_metrics(url: str) -> dict:
    """``GET url/metrics`` parsed with ``prometheus_client``: {family name: family} (names without ``_total``)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def metric(families: dict, name: str, sample: str | None = None, **labels) -> float:
    """The value of one sample: family ``name`` (e.g. "vllm:generation_tokens"), sample name ``sample`` (default:
    the family's ``_total`` for counters, else the family name), whose labels include ``labels``; 0.0 when the
    family has no such sample yet (a labelled counter that never moved).

    Raises:
        KeyError: no family ``name``.
    """
    family = families[name]
    wanted = sample or (name + "_total" if family.type == "counter" else name)
    for s in family.samples:
        if s.name == wanted and all(s.labels.get(k) == str(v) for k, v in labels.items()):
            return s.value
    return 0.0


def _trace_from_event(data: dict) -> StepTrace:
    """A step event's ``StepTrace`` (the event adds ``duration`` and ``num_dropped`` to ``StepTrace.to_dict()``)."""
    return trace_from_dict({k: v for k, v in data.items() if k in StepTrace.__dataclass_fields__})


def read_steps(url: str, history: int, timeout_s: float = 30.0) -> tuple[dict, list[StepTrace]]:
    """The server's last ``history`` steps from ``GET url/v1/engine/steps?history=N`` (server-sent events): the
    ``engine`` event (a dict) and the replayed steps as ``StepTrace``s. Returns once the replay reaches the step the
    server had done when the feed opened (or nothing was to replay).

    Raises:
        TimeoutError: the replay did not arrive within ``timeout_s``.
    """
    engine, steps, event = None, [], None
    with httpx.stream("GET", url + "/v1/engine/steps", params={"history": history, "block_tables": "false"},
                      timeout=timeout_s) as response:
        deadline = time.monotonic() + timeout_s
        for line in response.iter_lines():
            if time.monotonic() > deadline:
                raise TimeoutError("the step feed did not replay its history in time")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if event == "engine":
                    engine = data
                    if engine["num_steps"] == 0 or history == 0:
                        return engine, steps
                elif event == "step":
                    steps.append(_trace_from_event(data))
                    if data["step"] >= engine["num_steps"] - 1:
                        return engine, steps
    return engine, steps

"""SIGTERM with streams in flight: ``minengine serve`` waits ``--shutdown-timeout`` seconds for them,
then ends the rest with an error chunk and ``[DONE]``, and exits; a stream that finishes within the drain is
delivered whole. A real server process, signalled as Kubernetes or Ctrl-C would."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx

from minengine import LLMEngine
from minengine.entrypoints.cli_args import FrontendArgs
from minengine.entrypoints.server_process import ServerProcess
from tests.server_helpers import SERVER_CONFIG, RunningServer


def stream_events(url: str, max_tokens: int, on_second_event) -> list[str]:
    body = {"prompt": "ROMEO:", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 2:  # streaming: now stop the server
                    on_second_event()
    return events


def test_a_stream_that_finishes_within_the_drain_is_delivered_whole(bundled_model):
    """24 tokens finish well within a 60 s drain (the same shutdown path as SIGTERM's, in process: a server
    process costs ~20 s to start here, so only the signal case below pays for one)."""
    server = RunningServer(LLMEngine.from_config(model=bundled_model, **SERVER_CONFIG),
                           FrontendArgs(shutdown_timeout=60.0)).start()
    stopper = threading.Thread(target=server.stop)
    events = stream_events(server.url, 24, stopper.start)
    stopper.join(timeout=60)
    assert not stopper.is_alive() and events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert not [c for c in chunks if "error" in c]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(len(c["choices"][0]["text"]) > 0 for c in chunks) >= 2


def test_sigterm_drains_the_streams_in_flight_then_exits(bundled_model):
    """4,000 tokens do not finish within a 1 s drain: that stream gets an error chunk (503, the server is
    shutting down) and [DONE], and the process exits soon after."""
    shutdown_timeout = 1.0
    server = ServerProcess([bundled_model, "--max-model-len", "4096", "--shutdown-timeout", str(shutdown_timeout)],
                           timeout_s=180)
    proc = server.process
    signalled = []
    try:
        events = stream_events(server.url, 4000, lambda: (proc.send_signal(signal.SIGTERM),
                                                          signalled.append(time.monotonic())))
        ended = time.monotonic()
        proc.wait(timeout=60)
        exited = time.monotonic()
    finally:
        server.stop(timeout_s=10)  # kills it only if it is still running
    out = server.output_text()
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    error = chunks[-1]["error"]
    assert error["code"] == 503 and "shutting down" in error["message"], chunks[-1]
    assert not any(c["choices"][0]["finish_reason"] for c in chunks[:-1])
    assert ended - signalled[0] < shutdown_timeout + 15, ended - signalled[0]  # the drain's limit, not the stream's
    assert "ended 1 requests still running" in out, out
    assert exited - signalled[0] < shutdown_timeout + 30
    assert proc.returncode in (0, -signal.SIGTERM), (proc.returncode, out)  # uvicorn re-raises the signal

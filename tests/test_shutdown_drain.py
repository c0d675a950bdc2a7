"""SIGTERM with streams in flight (issue 21): ``minengine serve`` waits ``--shutdown-timeout`` seconds for them,
then ends the rest with an error chunk and ``[DONE]``, and exits; a stream that finishes within the drain is
delivered whole. A real server process, signalled as Kubernetes or Ctrl-C would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.server_helpers import free_socket


def start_server(model: str, shutdown_timeout: float) -> tuple[subprocess.Popen, str]:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()  # the server binds it next
    proc = subprocess.Popen([sys.executable, "-m", "minengine", "serve", model, "--port", str(port),
                             "--max-model-len", "4096", "--shutdown-timeout", str(shutdown_timeout),
                             "--uvicorn-log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "server did not come up"
        time.sleep(0.2)


@pytest.mark.parametrize("shutdown_timeout, max_tokens, finishes", [(60.0, 24, True), (1.0, 4000, False)])
def test_sigterm_drains_the_streams_in_flight_then_exits(bundled_model, shutdown_timeout, max_tokens, finishes):
    """24 tokens finish well within a 60 s drain; 4,000 do not within 1 s: that stream gets an error chunk
    (503, the server is shutting down) and [DONE]. Either way the process exits soon after."""
    proc, url = start_server(bundled_model, shutdown_timeout)
    try:
        body = {"prompt": "ROMEO:", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        events, signalled = [], None
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if signalled is None and len(events) == 2:  # streaming: now stop the server
                    proc.send_signal(signal.SIGTERM)
                    signalled = time.monotonic()
        ended = time.monotonic()
        proc.wait(timeout=60)
        exited = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.stdout.read()
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c for c in chunks if "choices" in c]
    if finishes:
        assert not [c for c in chunks if "error" in c]
        assert texts[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(len(c["choices"][0]["text"]) > 0 for c in texts) >= 2
    else:
        error = chunks[-1]["error"]
        assert error["code"] == 503 and "shutting down" in error["message"], chunks[-1]
        assert not any(c["choices"][0]["finish_reason"] for c in texts)
        assert ended - signalled < shutdown_timeout + 15, ended - signalled  # the drain's limit, not the stream's
        assert "ended 1 requests still running" in out, out
    assert exited - signalled < shutdown_timeout + 30
    assert proc.returncode in (0, -signal.SIGTERM), (proc.returncode, out)  # uvicorn re-raises the signal

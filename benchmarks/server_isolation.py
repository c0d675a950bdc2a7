"""What one heavy call costs the other clients of ``minengine serve`` (issue 21): ``/health``'s latency while a
1 MB prompt is tokenized (in the server's tokenizer thread), how fast a 25 MB body is refused (413, before it is
parsed), and how long SIGTERM takes to end a server whose stream would run for minutes (``--shutdown-timeout``).

Run: ``python -m benchmarks.server_isolation`` (bundled model, CPU, 1 torch thread). Writes
``benchmarks/results/server_isolation.json``; docs/server.md's server-errors paragraph quotes it. Wall-clock times,
medians where repeated, with the machine's load average recorded beside them.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
from pathlib import Path

import httpx

from minengine.entrypoints.server_process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "server_isolation.json"
PROMPT_1MB = "ROMEO: what light through yonder window. " * 25_000  # 1.05 MB, about 250k tokens


def health_during_huge_prompt(url: str) -> dict:
    """/health latencies (s) sampled while one call's 1 MB prompt is tokenized, and that call's duration."""
    done = {}

    def call():
        t = time.monotonic()
        r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT_1MB, "max_tokens": 1}, timeout=600)
        done["s"], done["status"] = time.monotonic() - t, r.status_code

    idle = []
    for _ in range(20):
        t = time.monotonic()
        httpx.get(url + "/health", timeout=60)
        idle.append(time.monotonic() - t)
    thread = threading.Thread(target=call)
    thread.start()
    busy = []
    while thread.is_alive():
        t = time.monotonic()
        httpx.get(url + "/health", timeout=60)
        busy.append(time.monotonic() - t)
        time.sleep(0.02)
    thread.join()
    return {"call_s": done["s"], "call_status": done["status"], "health_idle_median_s": statistics.median(idle),
            "health_busy_median_s": statistics.median(busy), "health_busy_max_s": max(busy),
            "health_busy_samples": len(busy)}


def refuse_25_mb(url: str) -> dict:
    body = json.dumps({"prompt": "ROMEO: " * (25 * 2**20 // 7), "max_tokens": 1}).encode()
    times = []
    for _ in range(3):
        t = time.monotonic()
        r = httpx.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                       timeout=600)
        times.append(time.monotonic() - t)
        assert r.status_code == 413, r.text
    return {"body_bytes": len(body), "refused_413_median_s": statistics.median(times)}


def start(*flags: str) -> ServerProcess:
    return ServerProcess(["--max-model-len", "4096", "--num-cpu-threads", "1", *flags], timeout_s=120,
                         env={"OMP_NUM_THREADS": "1"})


def sigterm_with_a_long_stream(shutdown_timeout: float) -> dict:
    """Seconds from SIGTERM to the process's exit while a stream of 4,000 tokens runs, and how it ended."""
    server = start("--shutdown-timeout", str(shutdown_timeout))
    proc, url, lines = server.process, server.url, []

    def stream():
        body = {"prompt": "ROMEO:", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
            lines.extend(line for line in r.iter_lines() if line)

    thread = threading.Thread(target=stream)
    thread.start()
    time.sleep(2.0)  # the stream is running
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    exit_s = time.monotonic() - t
    thread.join(timeout=60)
    return {"shutdown_timeout_s": shutdown_timeout, "sigterm_to_exit_s": exit_s, "exit_code": proc.returncode,
            "stream_ended_with_error_chunk": any('"error"' in line for line in lines[-3:]),
            "stream_ended_with_done": bool(lines) and lines[-1] == "data: [DONE]"}


def main() -> None:
    load = os.getloadavg()
    server = start()
    try:
        result = {"health": health_during_huge_prompt(server.url), "body_25_mb": refuse_25_mb(server.url)}
    finally:
        server.stop(timeout_s=60)
    result["sigterm"] = sigterm_with_a_long_stream(1.0)
    result["load_average_before_after"] = [round(x, 2) for x in (*load, *os.getloadavg())]
    result["machine"] = f"{os.cpu_count()} CPUs"
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

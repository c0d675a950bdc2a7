"""Does a long-running ``minengine serve`` stop growing? RSS and the engine's history over many requests.

A server keeps a history (step traces, finished requests' metrics) for its dashboard and ``summary()``; it is
bounded in bytes by ``--max-history-bytes`` (``minengine/metrics/history.py``). This benchmark serves the
bundled model in this process (uvicorn in a thread, the real OpenAI routes), sends ``--num-requests``
completions from a few client threads, and samples the process's RSS and the history's size as it goes.

What it shows: once the history's budget is full, RSS levels off (the slope over the last half, MB per 1,000
requests, is near 0) and the history measured again from the engine stays under its cap. With ``--max-history-
bytes`` large (the budget never fills in the run) RSS keeps growing instead.

Run: ``python -m benchmarks.server_memory`` (20,000 requests; ``--quick``: 300 requests and a 2 MiB cap, the
test's setting). Writes ``benchmarks/results/server_memory.json`` (``--json PATH`` elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "server_memory.json"
PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "HAMLET:\nTo be", "First Citizen:\nBefore we proceed",
           "KING RICHARD III:\nNow is the winter"]


def rss_mb() -> float:
    """This process's resident set size now (MB), from /proc (the peak from getrusage where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def slope_per_1000(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys over xs, times 1,000 (MB per 1,000 requests); 0 with fewer than 2 points."""
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


class InProcessServer:
    """The bundled model behind the OpenAI server (uvicorn in a thread of this process, a free loopback port)."""

    def __init__(self, max_history_bytes: int, max_history_steps: int):
        from minengine import LLMEngine
        from minengine.entrypoints.async_engine import AsyncLLMEngine
        from minengine.entrypoints.openai_server import make_server

        engine = LLMEngine.from_config(max_model_len=256, num_kv_blocks=256, max_num_batched_tokens=256,
                                       max_num_seqs=32, max_history_bytes=max_history_bytes)
        self.aengine = AsyncLLMEngine(engine, max_history_steps=max_history_steps)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = make_server(self.aengine, None, log_level="warning")
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("the server did not start")

    def call(self, fn):
        """``fn(engine)`` run in the engine loop between two steps (from a client thread)."""
        return asyncio.run_coroutine_threadsafe(self.aengine.call(fn), self.aengine._loop).result(timeout=120)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()


def run(num_requests: int, max_history_bytes: int, max_history_steps: int, clients: int, max_tokens: int,
        samples: int) -> dict:
    """Serve ``num_requests`` completions and sample RSS and the history ``samples`` times."""
    server = InProcessServer(max_history_bytes, max_history_steps)
    url, aengine, history = server.url, server.aengine, server.aengine.history
    rows, done, lock = [], [0], threading.Lock()
    every = max(1, num_requests // samples)

    def sample() -> None:
        measured = server.call(lambda e: history.measured_bytes())
        e = aengine.engine
        rows.append({"requests": done[0], "rss_mb": round(rss_mb(), 2), "history_bytes": measured,
                     "history_budget_bytes": history.fifo.total_bytes, "traces_kept": len(e.traces),
                     "finished_kept": sum(m.finished_time is not None for m in e.request_metrics.values()),
                     "entries_dropped": history.fifo.num_dropped})

    def one(i: int, client: httpx.Client) -> None:
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 1 + i % max_tokens, "temperature": 0,
                "ignore_eos": True}
        r = client.post(url + "/v1/completions", json=body, timeout=120)
        r.raise_for_status()
        with lock:
            done[0] += 1
            due = done[0] % every == 0
        if due:
            sample()

    start = time.monotonic()
    cpu0 = time.process_time()
    try:
        with httpx.Client() as client, ThreadPoolExecutor(clients) as pool:
            for f in [pool.submit(one, i, client) for i in range(num_requests)]:
                f.result()
        sizes = entry_sizes(server)
    finally:
        server.stop()
    wall, cpu = time.monotonic() - start, time.process_time() - cpu0
    half = [r for r in rows if r["requests"] >= num_requests / 2]
    return {"num_requests": num_requests, "max_history_bytes": max_history_bytes,
            "max_history_steps": max_history_steps, "clients": clients, "max_tokens": max_tokens,
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_average": os.getloadavg(),
            "rss_first_mb": rows[0]["rss_mb"] if rows else None, "rss_last_mb": rows[-1]["rss_mb"] if rows else None,
            "rss_slope_last_half_mb_per_1000": round(slope_per_1000([r["requests"] for r in half],
                                                                     [r["rss_mb"] for r in half]), 3),
            "history_max_measured_bytes": max((r["history_bytes"] for r in rows), default=0),
            **sizes, "samples": rows}


def entry_sizes(server: InProcessServer) -> dict:
    """Median bytes of a kept step trace and of a kept finished request, and bytes per output token of the
    latter (least squares over the kept requests), as ``entry_bytes`` counts them."""
    from minengine.metrics.history import entry_bytes

    def measure(e):
        traces = [entry_bytes(t) for t in e.traces]
        finished = [(m.num_output_tokens, entry_bytes(m)) for m in e.request_metrics.values()
                    if m.finished_time is not None]
        return traces, finished

    traces, finished = server.call(measure)
    per_token = slope_per_1000([n for n, _ in finished], [b for _, b in finished]) / 1000
    return {"trace_median_bytes": statistics.median(traces) if traces else None,
            "finished_median_bytes": statistics.median(b for _, b in finished) if finished else None,
            "finished_bytes_per_output_token": round(per_token, 1)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-requests", type=int, default=20_000)
    p.add_argument("--max-history-bytes", type=int, default=None, help="default: EngineConfig's")
    p.add_argument("--max-history-steps", type=int, default=10_000)
    p.add_argument("--clients", type=int, default=8, help="client threads sending requests at once")
    p.add_argument("--max-tokens", type=int, default=16, help="request i asks for 1 + i %% this many tokens")
    p.add_argument("--samples", type=int, default=40, help="RSS / history samples over the run")
    p.add_argument("--quick", action="store_true", help="300 requests, a 2 MiB history cap (the test's size)")
    p.add_argument("--json", type=Path, default=OUT)
    a = p.parse_args(argv)
    from minengine.config import DEFAULT_MAX_HISTORY_BYTES

    if a.quick:
        a.num_requests, a.max_history_bytes, a.samples = 300, 2 * 2**20, 10
    cap = a.max_history_bytes or DEFAULT_MAX_HISTORY_BYTES
    result = run(a.num_requests, cap, a.max_history_steps, a.clients, a.max_tokens, a.samples)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(result, indent=1))
    print(f"{'requests':>9} {'RSS MB':>8} {'history B':>11} {'traces':>7} {'finished':>8} {'dropped':>8}")
    for r in result["samples"]:
        print(f"{r['requests']:>9} {r['rss_mb']:>8.1f} {r['history_bytes']:>11} {r['traces_kept']:>7} "
              f"{r['finished_kept']:>8} {r['entries_dropped']:>8}")
    print(f"RSS slope over the last half: {result['rss_slope_last_half_mb_per_1000']} MB per 1,000 requests; "
          f"history cap {cap} B, largest measured {result['history_max_measured_bytes']} B; entry medians: trace "
          f"{result['trace_median_bytes']} B, finished request {result['finished_median_bytes']} B "
          f"(+{result['finished_bytes_per_output_token']} B per output token); wall {result['wall_s']} s, "
          f"CPU {result['cpu_s']} s")
    return result


if __name__ == "__main__":
    main()

"""What one oversized prompt costs ``minengine serve`` and its other clients: ``"a " * 4_000_000`` (7.6 MB, 4M
tokens, under the 8 MiB body limit) sent to a ``--max-model-len 512`` server, and a 5-token request sent while
it is handled.
Measured: how long the big one takes to be refused (400) and the small one to be answered, the server's CPU
time over each round, and its resident memory before and after (the refused prompt's tokens are never made,
``minengine/tokenize_within.py``).

Run: ``python -m benchmarks.oversized_prompt [--repeats N]`` (bundled model, CPU). Writes
``benchmarks/results/oversized_prompt.json``. Wall-clock and CPU seconds, medians over the repeats, with the
machine's load average beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import httpx

from minengine.config import BUNDLED_MODEL
from minengine.entrypoints.server_process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "oversized_prompt.json"
BIG = {"prompt": "a " * 4_000_000}
SMALL = {"prompt": "ROMEO: soft", "max_tokens": 2}


def rss_mb(pid: int) -> float:
    """Resident memory of a process (MB), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_round(url: str, small_delay_s: float) -> dict:
    """The big request, and ``small_delay_s`` later the small one (the big one is being parsed or tokenized by
    then): each one's status and wall seconds."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def timed(body, delay_s=0.0):
            await asyncio.sleep(delay_s)
            start = time.monotonic()
            r = await client.post("/v1/completions", json=body)
            return r.status_code, time.monotonic() - start

        (big_status, big_s), (small_status, small_s) = await asyncio.gather(timed(BIG),
                                                                                timed(SMALL, small_delay_s))
    return {"big_status": big_status, "big_s": big_s, "small_status": small_status, "small_s": small_s}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--small-delay", type=float, default=0.3, help="seconds between the big and the small")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    server = ServerProcess([BUNDLED_MODEL, "--max-model-len", "512"], env={"OMP_NUM_THREADS": "1"})
    try:
        pid = server.process.pid
        asyncio.run(one_round(server.url, args.small_delay))  # warm: the first generation, the first big body
        rss_before = rss_mb(pid)
        rounds = []
        for _ in range(args.repeats):
            cpu = cpu_s(pid)
            rounds.append({**asyncio.run(one_round(server.url, args.small_delay)), "server_cpu_s": cpu_s(pid) - cpu,
                           "rss_after_mb": rss_mb(pid)})
    finally:
        server.stop()
    result = {"repeats": args.repeats, "small_delay_s": args.small_delay, "load_average": os.getloadavg(),
              "rss_before_mb": rss_before,
              "rounds": rounds, **{f"median_{k}": statistics.median(r[k] for r in rounds)
                                   for k in ("big_s", "small_s", "server_cpu_s", "rss_after_mb")}}
    assert all(r["big_status"] == 400 and r["small_status"] == 200 for r in rounds), rounds
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"big prompt refused in {result['median_big_s']:.2f} s (median), the small request answered in "
          f"{result['median_small_s']:.2f} s; server CPU {result['median_server_cpu_s']:.2f} s a round; RSS "
          f"{rss_before:.0f} MB before, {result['median_rss_after_mb']:.0f} MB after")
    return result


if __name__ == "__main__":
    main()

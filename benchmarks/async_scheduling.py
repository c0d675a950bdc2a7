"""Async scheduling: does the driver's host time hide behind the workers' forward? World size 1 and 2.

For each setting, the bundled model serves ``--num-requests`` decodes (prompts of ``--prompt-len`` tokens, EOS
ignored) and, once every request decodes, times ``--steps`` engine steps (median per step):
  - step wall time: ``time.perf_counter`` around ``LLMEngine.step()`` (in steady state one step per call);
  - host time: the driver's CPU time in that call (``time.process_time``: scheduling, encoding the step for the
    workers, update, detokenizing, outputs; waiting on the workers costs none);
  - forward time: the workers' time for the step (rank 0's ``WorkerReply.execute_time_s``: decoding the
    message, inputs, forward with its all-reduces, sampling); in-process ("uni") the ``ModelRunner.execute`` time.
Without async scheduling a step lasts about host + forward (the driver waits, then the workers wait); with it,
about max(host, forward): ``hidden`` is (host + forward - wall) / host, the share of the host time the overlap
hid (1 = all of it). On a loaded machine these wall times move with other processes; ``overlap`` depends less on
them: the share of the driver's host intervals (a step() call up to the step sent, and from the answer taken)
during which a worker was computing a step (its ``WorkerReply.started_at .. finished_at``, on the same
``time.monotonic`` clock). Without async scheduling it should be ~0; on a loaded machine it is not (a driver
descheduled right after sending a step counts as host time while the worker runs), so each async row is read
against its sync row, the baseline of that error. 1 torch thread per process. On a machine with fewer cores
than processes (TP 2 = 2 workers + the driver on 2 cores) the driver's work competes with a worker for a core
and less can hide. The machine load (``uptime``, before and after) is printed with the table; the sweep is
repeated ``--rounds`` times, interleaved, and each number is the median over the rounds.

    python benchmarks/async_scheduling.py                       # uni, TP 1 and TP 2, async off and on
    python benchmarks/async_scheduling.py --num-requests 64 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minengine import LLMEngine, SamplingParams  # noqa: E402
from minengine.config import EngineConfig  # noqa: E402

SETTINGS = [  # (label, tensor_parallel_size, distributed_executor_backend, async_scheduling)
    ("in-process (uni)", 1, "uni", False),
    ("TP 1, 1 worker", 1, "mp", False),
    ("TP 1, 1 worker, async", 1, "mp", True),
    ("TP 2", 2, "mp", False),
    ("TP 2, async", 2, "mp", True),
]


def measure(tp: int, backend: str, async_scheduling: bool, num_requests: int, prompt_len: int, steps: int,
            warmup: int) -> dict:
    engine = LLMEngine(EngineConfig(tensor_parallel_size=tp, distributed_executor_backend=backend,
                                    async_scheduling=async_scheduling, max_num_seqs=num_requests,
                                    max_num_batched_tokens=max(2048, num_requests * prompt_len),
                                    num_cpu_threads=1, max_model_len=prompt_len + warmup + steps + 64,
                                    disable_log_stats=True, trace_block_tables=False))
    try:
        forward: list[float] = []
        if backend == "uni":  # in-process: time the runner directly
            execute = engine.runner.execute

            def timed(sched):
                t0 = time.perf_counter()
                out = execute(sched)
                forward.append(time.perf_counter() - t0)
                return out

            engine.runner.execute = timed
        params = SamplingParams(temperature=0, max_tokens=warmup + steps + 32, ignore_eos=True)
        for i in range(num_requests):
            engine.add_request(str(i), {"prompt_token_ids": [3 + (i * 7 + j) % 2000 for j in range(prompt_len)]},
                               params)
        started: set[str] = set()
        while len(started) < num_requests:  # prefills
            started.update(o.request_id for o in engine.step())
        for _ in range(warmup):
            engine.step()
        walls, hosts, fwds = [], [], []
        host_spans: list[tuple[float, float]] = []  # the driver working (not waiting for the workers)
        busy_spans: list[tuple[float, float]] = []  # rank 0 computing a step
        marks: dict[str, float] = {}
        if backend != "uni":
            submit, collect = engine.runner.submit, engine.runner.collect

            def timed_submit(sched):
                submit(sched)
                marks["submitted"] = time.monotonic()

            def timed_collect():
                out = collect()
                marks["collected"] = time.monotonic()
                r = engine.runner.last_replies[0]
                busy_spans.append((r.started_at, r.finished_at))
                return out

            engine.runner.submit, engine.runner.collect = timed_submit, timed_collect
        for _ in range(steps):
            forward.clear()
            marks.clear()
            m0 = time.monotonic()
            c0, t0 = time.process_time(), time.perf_counter()
            engine.step()
            c1, t1 = time.process_time(), time.perf_counter()
            m1 = time.monotonic()
            # The driver's own work: scheduling up to the step sent, and processing from the answer taken (not the
            # moments between, where a descheduled driver would look busy while it only waits).
            host_spans.append((m0, marks.get("submitted", m1)))
            if "collected" in marks:
                host_spans.append((marks["collected"], m1))
            if backend == "uni":
                fwd = sum(forward)
                host = (t1 - t0) - fwd  # one thread: what is not the forward is host work
            else:
                fwd = engine.runner.last_replies[0].execute_time_s
                host = c1 - c0
            walls.append(t1 - t0)
            hosts.append(host)
            fwds.append(fwd)
        wall, host, fwd = (1e3 * statistics.median(x) for x in (walls, hosts, fwds))
        return {"wall_ms": wall, "host_ms": host, "forward_ms": fwd, "host_plus_forward_ms": host + fwd,
                "hidden": (host + fwd - wall) / host if host > 0 else float("nan"),
                "overlap": overlap(host_spans, busy_spans) if busy_spans else float("nan")}
    finally:
        engine.shutdown()


def overlap(host: list[tuple[float, float]], busy: list[tuple[float, float]]) -> float:
    """The share of the total length of the ``host`` intervals covered by the (disjoint) ``busy`` ones."""
    total = sum(b - a for a, b in host)
    covered = sum(max(0.0, min(b, d) - max(a, c)) for a, b in host for c, d in busy)
    return covered / total if total > 0 else float("nan")


def without_nan(value):
    """``value`` with every NaN float (no worker spans to measure: the uniprocess rows) as None, JSON's null:
    ``NaN`` is not JSON, and strict readers (``JSON.parse``, jq) refuse the file."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: without_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_nan(v) for v in value]
    return value


def markdown(rows: list[dict], load: str) -> str:
    lines = [f"machine load: {load}", "",
             "| setting | step wall (ms) | host (ms) | forward (ms) | host + forward (ms) | host hidden | "
             "host time while a worker computes |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        share = "-" if r["overlap"] != r["overlap"] else f"{r['overlap']:.0%}"
        lines.append(f"| {r['setting']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['forward_ms']:.2f} | "
                     f"{r['host_plus_forward_ms']:.2f} | {r['hidden']:.0%} | {share} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30, help="timed decode steps per setting")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3,
                    help="sweeps over the settings, interleaved; each number is the median over rounds")
    ap.add_argument("--settings", default=",".join(str(i) for i in range(len(SETTINGS))),
                    help="indices into SETTINGS, comma-separated")
    ap.add_argument("--out", type=Path, default=None, help="directory for async_scheduling.{md,json}")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    chosen = [int(x) for x in a.settings.split(",")]
    runs: dict[int, list[dict]] = {i: [] for i in chosen}
    loads = [os.popen("uptime").read().strip()]
    for _ in range(a.rounds):  # interleaved, so a load spike from other processes hits every setting alike
        for i in chosen:
            label, tp, backend, async_scheduling = SETTINGS[i]
            r = measure(tp, backend, async_scheduling, a.num_requests, a.prompt_len, a.steps, a.warmup)
            runs[i].append(r)
            print(f"{label:>24}: wall {r['wall_ms']:.2f} ms, host {r['host_ms']:.2f}, forward {r['forward_ms']:.2f}, "
                  f"hidden {r['hidden']:.0%}, overlap {r['overlap']:.0%}", flush=True)
    loads.append(os.popen("uptime").read().strip())
    rows = []
    for i in chosen:
        r = {k: statistics.median(x[k] for x in runs[i]) for k in runs[i][0]}
        r["hidden"] = (r["host_ms"] + r["forward_ms"] - r["wall_ms"]) / r["host_ms"]
        rows.append({"setting": SETTINGS[i][0], **r})
    load = " / ".join(loads)
    table = markdown(rows, load)
    print(table)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "async_scheduling.md").write_text(table)
        result = without_nan({"load": load, "rows": rows, "runs": runs})
        (a.out / "async_scheduling.json").write_text(json.dumps(result, indent=2, allow_nan=False))
    return rows


if __name__ == "__main__":
    main()

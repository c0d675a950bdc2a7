"""Host overhead per step: the scheduler's side and the runner's input preparation, at 1 to 1,024 running decodes.

For N running requests that all decode (contexts of C tokens), it times, per step and without a model:
  - ``Scheduler.schedule()`` + ``Scheduler.update_from_output()`` (the scheduler's host time; fake sampled tokens),
  - input preparation: ``ForwardBatch.build`` with the runner's persistent ``BlockTable``, for the torch attention
    (decode groups) and for the Triton kernel (block tables),
median over ``--steps`` steps after warm-up, 1 thread, in this process's CPU time (``time.process_time``: on a
shared machine wall time also counts the turns other processes take on the core). It prints a table, and writes
a markdown table, a JSON and a plotly figure (cost vs N per context; HTML, and PNG when kaleido is installed) to
``--out``.

    python benchmarks/host_overhead.py                          # N = 1..1024, C = 128..8192
    python benchmarks/host_overhead.py --num-requests 1,256 --contexts 512 --steps 10

Targets (issue 13): <= 1 ms in total per step at 256 running decodes, <= 4 ms at 1,024, linear growth at worst.
On a GPU the forward of a small model's decode step takes a few ms: host time above that idles the device.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minengine.core.doors import make_scheduler  # noqa: E402
from minengine.core.kv_cache_manager import KVCacheManager, cdiv  # noqa: E402
from minengine.core.scheduler import Scheduler  # noqa: E402
from minengine.request import Request  # noqa: E402
from minengine.sampling_params import SamplingParams  # noqa: E402
from minengine.worker.block_table import BlockTable  # noqa: E402
from minengine.worker.forward_batch import ForwardBatch  # noqa: E402

BLOCK_SIZE = 16
RESULTS = Path(__file__).resolve().parent / "results"
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def make_decoding_scheduler(num_requests: int, context: int, extra_tokens: int,
                            enable_prefix_caching: bool = True) -> Scheduler:
    """A scheduler with ``num_requests`` running requests whose prompts (``context`` tokens, distinct) are
    already prefilled, so every following step is ``num_requests`` decodes."""
    max_len = context + extra_tokens + 1
    kv = KVCacheManager(num_requests * cdiv(max_len, BLOCK_SIZE) + 1, BLOCK_SIZE, enable_prefix_caching)
    sched = make_scheduler(kv, max_num_batched_tokens=max(num_requests * context, 1), max_num_seqs=num_requests,
                      max_model_len=max_len)
    params = SamplingParams(temperature=0, max_tokens=extra_tokens, ignore_eos=True)
    for i in range(num_requests):
        # Small ints (< 256) are shared Python objects: 1,024 x 8,192 prompt tokens stay cheap to hold.
        prompt = [3 + (i + j) % 250 for j in range(context)]
        prompt[0] = 3 + i % 250
        prompt[1] = 3 + i // 250
        sched.add_request(Request(str(i), prompt, params, arrival_time=0.0))
    out = sched.schedule()  # the whole prefill in one step (the token budget is num_requests * context)
    if len(out.scheduled) != num_requests:
        raise RuntimeError(f"expected {num_requests} prefills, got {len(out.scheduled)}")
    sched.update_from_output(out, {s.request_id: [5] for s in out.scheduled})
    return sched


def time_steps(sched: Scheduler, steps: int, warmup: int = 3) -> dict[str, float]:
    """Median CPU milliseconds per decode step of the scheduler's side and of the two input preparations."""
    tables = {"torch": BlockTable(), "triton": BlockTable()}
    timings: dict[str, list[float]] = {"schedule_update_ms": [], "prepare_torch_ms": [], "prepare_triton_ms": []}
    for i in range(warmup + steps):
        t0 = time.process_time()
        out = sched.schedule()
        t1 = time.process_time()
        ForwardBatch.build(out, BLOCK_SIZE, "cpu", tables["torch"])
        t2 = time.process_time()
        ForwardBatch.build(out, BLOCK_SIZE, "cpu", tables["triton"], attention_backend="triton")
        t3 = time.process_time()
        sched.update_from_output(out, {s.request_id: [5] for s in out.scheduled if s.sample})
        t4 = time.process_time()
        if len(out.scheduled) != sched.num_running or any(s.num_new_tokens != 1 for s in out.scheduled):
            raise RuntimeError("expected a pure decode step")
        if i >= warmup:
            timings["schedule_update_ms"].append(1e3 * ((t1 - t0) + (t4 - t3)))
            timings["prepare_torch_ms"].append(1e3 * (t2 - t1))
            timings["prepare_triton_ms"].append(1e3 * (t3 - t2))
    result = {k: statistics.median(v) for k, v in timings.items()}
    result["total_torch_ms"] = result["schedule_update_ms"] + result["prepare_torch_ms"]
    result["total_triton_ms"] = result["schedule_update_ms"] + result["prepare_triton_ms"]
    return result


def markdown_table(rows: list[dict]) -> str:
    lines = ["| running decodes | context (tokens) | schedule + update (ms) | input prep, torch attention (ms) | "
             "input prep, Triton (ms) | total, torch (ms) | total, Triton (ms) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['num_requests']} | {r['context']} | {r['schedule_update_ms']:.3f} | "
                     f"{r['prepare_torch_ms']:.3f} | {r['prepare_triton_ms']:.3f} | {r['total_torch_ms']:.3f} | "
                     f"{r['total_triton_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def make_figure(rows: list[dict]):
    """Cost per step vs running requests (log-log), one line per context and part."""
    import plotly.graph_objects as go

    fig = go.Figure()
    contexts = sorted({r["context"] for r in rows})
    colors = ["#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd", "#8c564b"]
    for context, color in zip(contexts, colors * len(contexts)):
        rs = sorted((r for r in rows if r["context"] == context), key=lambda r: r["num_requests"])
        n = [r["num_requests"] for r in rs]
        fig.add_scatter(x=n, y=[r["schedule_update_ms"] for r in rs], mode="lines+markers",
                        name=f"schedule + update, C={context}", line=dict(dash="solid", color=color))
        fig.add_scatter(x=n, y=[r["prepare_torch_ms"] for r in rs], mode="lines+markers",
                        name=f"input prep, CPU attention, C={context}", line=dict(dash="dot", color=color))
        fig.add_scatter(x=n, y=[r["prepare_triton_ms"] for r in rs], mode="lines+markers",
                        name=f"input prep, GPU (Triton), C={context}", line=dict(dash="dash", color=color))
    for n_ref, ms in ((256, 1.0), (1024, 4.0)):
        fig.add_scatter(x=[n_ref], y=[ms], mode="markers", marker=dict(symbol="x", size=12, color="black"),
                        name=f"target: {ms:g} ms at N={n_ref}")
    fig.update_layout(title="Host time per decode step vs running requests (1 thread)",
                      xaxis=dict(title="running decode requests N", type="log"),
                      yaxis=dict(title="ms per step", type="log"), width=1000, height=600)
    return fig


def parse_ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",")]
    if any(v < 1 for v in values):
        raise ValueError(f"expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=parse_ints, default=parse_ints("1,4,16,64,256,1024"))
    ap.add_argument("--contexts", type=parse_ints, default=parse_ints("128,512,2048,8192"))
    ap.add_argument("--steps", type=int, default=20, help="timed decode steps per setting (after 3 warm-up)")
    ap.add_argument("--out", type=Path, default=None, help="directory for host_overhead.{md,json,html,png}")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)

    rows = []
    print(f"{'N':>5} {'C':>5} {'sched+upd ms':>12} {'prep torch ms':>13} {'prep triton ms':>14} {'total ms':>9}")
    for context in a.contexts:
        for n in a.num_requests:
            sched = make_decoding_scheduler(n, context, extra_tokens=a.steps + 8)
            r = {"num_requests": n, "context": context, **time_steps(sched, a.steps)}
            rows.append(r)
            print(f"{n:>5} {context:>5} {r['schedule_update_ms']:>12.3f} {r['prepare_torch_ms']:>13.3f} "
                  f"{r['prepare_triton_ms']:>14.3f} {r['total_torch_ms']:>9.3f}", flush=True)
            del sched
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "host_overhead.md").write_text(markdown_table(rows))
        (a.out / "host_overhead.json").write_text(json.dumps(rows, indent=2))
        fig = make_figure(rows)
        fig.write_html(a.out / "host_overhead.html", include_plotlyjs="cdn")
        try:
            fig.write_image(a.out / "host_overhead.png", scale=1)
            if a.out.resolve() == RESULTS:  # docs/benchmarks.md shows a copy (the site serves only docs/)
                shutil.copyfile(RESULTS / "host_overhead.png", DOCS_IMG / "host_overhead.png")
        except Exception as exc:  # kaleido (and a browser) are optional
            print(f"no PNG ({type(exc).__name__}: {exc}); the HTML figure is written")
    return rows


if __name__ == "__main__":
    main()

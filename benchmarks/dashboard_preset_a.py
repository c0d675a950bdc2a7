"""How long the dashboard's preset (a) takes on this CPU: what pressing Run computes, cold (no cache).

Preset (a) is the textbook case: 10 requests decoding when one long prompt (8,000 tokens x scale) arrives.
Pressing Run in ``app.py`` runs it under the chosen config and, for the A/B tab, once more with chunked prefill
off (the chunked-on run is the same config, a cache hit), then draws every figure. Timed here without
Streamlit:

    OMP_NUM_THREADS=2 python benchmarks/dashboard_preset_a.py                 # default scale 0.25
    OMP_NUM_THREADS=2 python benchmarks/dashboard_preset_a.py --scale 1.0     # the full 8,000 tokens
    python benchmarks/dashboard_preset_a.py --model /path/to/model --threads 1

Target (issue 4): the run of preset (a) completes in under a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import minengine.viz as viz
from minengine.viz import presets
from minengine.viz.runner import DashboardConfig, run_workload


def draw_everything(res, lang: str = "en") -> None:
    """Every figure the page draws for one run (the A/B tab's two extra figures excluded)."""
    tr = res.traces[max(range(len(res.traces)), key=lambda i: res.traces[i].num_used_blocks)]
    viz.block_pool_figure(tr, lang)
    viz.block_tables_figure(tr, lang)
    viz.block_pool_animation(res.traces, lang)
    viz.batch_composition_figure(res.traces, lang)
    viz.token_timeline_figure(res.request_metrics, lang)
    viz.itl_figure(res.request_metrics, res.traces, 0.05, lang)
    viz.queue_figure(res.traces, lang)
    viz.kv_usage_figure(res.traces, lang)
    viz.latency_cdf_figure(res.request_metrics, lang)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=0.25, help="long prompt = 8,000 x scale tokens (default 0.25)")
    ap.add_argument("--model", default=os.environ.get("MINENGINE_MODEL"), help="model dir (default: bundled)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    defaults = presets.PRESET_ENGINE_DEFAULTS["a"]
    config = DashboardConfig(model=args.model, **defaults)
    workload = presets.textbook_long_prompt(long_prompt_scale=args.scale)
    long_len = workload.requests[-1].prompt_len
    print(f"preset (a): 10 decoding requests + a {long_len:,}-token prompt (8,000 x {args.scale:g}); "
          f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs")

    timings = {}
    t0 = time.perf_counter()
    res_on = run_workload(config, workload)
    timings["run, chunked prefill on (the page's config)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    res_off = run_workload(DashboardConfig(model=args.model, **{**defaults, "enable_chunked_prefill": False}),
                           workload)
    timings["run, chunked prefill off (A/B tab)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    draw_everything(res_on)
    timings["build every figure"] = time.perf_counter() - t0
    for name, seconds in timings.items():
        print(f"  {name:<45} {seconds:6.1f} s")
    total = sum(timings.values())
    print(f"  {'total for one press of Run (cold cache)':<45} {total:6.1f} s  "
          f"({'under' if total < 60 else 'OVER'} the 60 s target)")
    for name, res in (("on", res_on), ("off", res_off)):
        s = res.summary
        print(f"  chunked prefill {name:>3}: {s.num_steps} steps, P99 ITL {s.itl_p99 * 1000:.1f} ms, "
              f"P99 TTFT {s.ttft_p99 * 1000:.1f} ms, {s.output_tok_s:.1f} output tok/s")


if __name__ == "__main__":
    main()

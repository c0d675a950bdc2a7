"""What pressing Run in the dashboard costs on this CPU, and whether its lessons hold on a busy machine.

Preset (a) is the textbook case: 10 requests decoding when one long prompt (8,000 tokens x scale) arrives.
Pressing Run in ``app.py`` runs it under the chosen config (live, step by step) and, for the A/B tab, once more
with chunked prefill off, then draws every figure. Timed here without Streamlit, cold (no cache), with the
lessons the presets teach checked on the chosen clock:

    (a) chunked prefill lowers P99 TBT;  (b) the shared system prompt's blocks are shared (ref count > 1);
    (c) the small KV pool forces preemptions.

    python benchmarks/dashboard_preset_a.py                         # modelled H100 SXM, Llama-3-8B shapes
    python benchmarks/dashboard_preset_a.py --busy 2                # two busy loops beside it: nothing flips
    python benchmarks/dashboard_preset_a.py --clock cpu --busy 2    # measured CPU time of this process
    python benchmarks/dashboard_preset_a.py --scale 1.0 --hardware l4 --model qwen2.5-7b

Target (issue 4): one press of Run completes in under a minute on 2 CPU cores. The modelled numbers are the same
on every machine and every run (the lessons cannot flip); measured CPU time follows this machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import minengine.viz as viz
from minengine.timing import ClockSpec
from minengine.viz import presets
from minengine.viz.runner import DashboardConfig, run_workload


def draw_everything(res, lang: str = "en") -> None:
    """Every figure the page draws for one run (the A/B tab's two extra figures excluded)."""
    tr = res.traces[max(range(len(res.traces)), key=lambda i: res.traces[i].num_used_blocks)]
    threshold = viz.auto_stall_threshold(res.request_metrics)
    viz.block_pool_figure(tr, lang)
    viz.block_tables_figure(tr, lang)
    viz.block_pool_animation(res.traces, lang)
    viz.batch_composition_figure(res.traces, lang)
    viz.token_timeline_figure(res.request_metrics, lang, clock_label=res.clock_label)
    viz.itl_figure(res.request_metrics, res.traces, threshold, lang, clock_label=res.clock_label)
    viz.queue_figure(res.traces, lang, clock_label=res.clock_label)
    viz.kv_usage_figure(res.traces, lang, clock_label=res.clock_label)
    viz.latency_cdf_figure(res.request_metrics, lang, clock_label=res.clock_label)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=0.25, help="long prompt = 8,000 x scale tokens (default 0.25)")
    ap.add_argument("--model", default=os.environ.get("MINENGINE_MODEL"), help="model dir (default: bundled)")
    ap.add_argument("--clock", choices=("modelled", "cpu"), default="modelled",
                    help="modelled (default) or measured CPU time of this process")
    ap.add_argument("--hardware", default="h100", help="modelled hardware preset (default h100)")
    ap.add_argument("--shape", default="llama-3-8b", help="modelled model shape preset (default llama-3-8b)")
    ap.add_argument("--tp", type=int, default=1, help="modelled tensor-parallel degree (default 1)")
    ap.add_argument("--busy", type=int, default=0, help="busy-loop processes to run beside it (default 0)")
    args = ap.parse_args()
    clock = (ClockSpec("modelled", hardware=args.hardware, model=args.shape, tp=args.tp) if args.clock == "modelled"
             else ClockSpec("cpu"))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        run(args, clock)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def run(args, clock: ClockSpec) -> None:
    defaults = presets.PRESET_ENGINE_DEFAULTS["a"]
    config = DashboardConfig(model=args.model, clock=clock, **defaults)
    workload = presets.textbook_long_prompt(long_prompt_scale=args.scale)
    long_len = workload.requests[-1].prompt_len
    print(f"preset (a): 10 decoding requests + a {long_len:,}-token prompt (8,000 x {args.scale:g}); clock "
          f"{clock.label!r}; {os.cpu_count()} CPUs, {args.busy} busy loop(s) beside")

    timings = {}
    t0 = time.perf_counter()
    res_on = run_workload(config, workload)
    timings["run, chunked prefill on (the page's config)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    res_off = run_workload(DashboardConfig(model=args.model, clock=clock,
                                           **{**defaults, "enable_chunked_prefill": False}), workload)
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
        print(f"  chunked prefill {name:>3}: {s.num_steps} steps, P99 TBT {s.itl_p99 * 1000:.1f} ms, "
              f"P99 TTFT {s.ttft_p99 * 1000:.1f} ms, {s.output_tok_s:.1f} output tok/s")

    res_b = run_workload(DashboardConfig(model=args.model, clock=clock, **presets.PRESET_ENGINE_DEFAULTS["b"]),
                         presets.shared_system_prompt())
    res_c = run_workload(DashboardConfig(model=args.model, clock=clock, **presets.PRESET_ENGINE_DEFAULTS["c"]),
                         presets.memory_pressure())
    shared = [tr for tr in res_b.traces if max(tr.block_ref_counts) > 1]
    lessons = [
        ("(a) chunked prefill lowers P99 TBT", res_on.summary.itl_p99 < res_off.summary.itl_p99,
         f"{res_on.summary.itl_p99 * 1000:.1f} vs {res_off.summary.itl_p99 * 1000:.1f} ms"),
        ("(b) the system prompt's blocks are shared", bool(shared),
         f"ref count > 1 at {len(shared)} of {len(res_b.traces)} steps, up to "
         f"{max(max(tr.block_ref_counts) for tr in res_b.traces)}"),
        ("(c) the small pool preempts", res_c.summary.num_preemptions > 0,
         f"{res_c.summary.num_preemptions} preemptions"),
    ]
    for text, holds, detail in lessons:
        print(f"  {text:<45} {'yes' if holds else 'NO'}  ({detail})")


if __name__ == "__main__":
    main()

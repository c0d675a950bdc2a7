"""What each dashboard preset's A/B tab opens on, as the page computes it, as a Markdown table (docs/dashboard.md's
section).

    MINENGINE_DATA=/work/shared/data python benchmarks/dashboard_ab.py

Each preset's workload and engine settings are the page's defaults (``presets.PRESET_ENGINE_DEFAULTS``; (a) at its
1/4 scale, (d) the first 40 requests of the Azure conversation trace at 1/8 lengths and ``presets.TRACE_SPEEDUP``),
on the page's default clock (modelled H100 SXM, Llama-3-8B shapes), the bundled model. Run A and run B of
``presets.COMPARISONS[presets.PRESET_COMPARISON[preset]]`` as the A/B tab runs them; the numbers are the ones its two
sentences print (P99 TBT, P99 TTFT, output tok/s; tokens computed, steps, preemptions, blocks swapped out). On the
modelled clock they are the same on every machine; ``tests/viz/test_presets.py`` checks each row's direction.
"""

from __future__ import annotations

import argparse

from minengine.viz import presets
from minengine.viz.i18n import t
from minengine.viz.runner import DashboardConfig, run_workload
from minengine.workloads import azure_conv_path, find_data_dir, load_azure_trace


def workload(preset: str):
    """The preset's workload as the page builds it by default (None: (d) without the Azure trace)."""
    if preset == "a":
        return presets.textbook_long_prompt(long_prompt_scale=1 / 4)
    if preset == "b":
        return presets.shared_system_prompt()
    if preset == "c":
        return presets.memory_pressure()
    if preset == "d":
        path = azure_conv_path(find_data_dir())
        if path is None:
            return None
        trace = list(load_azure_trace(str(path), max_requests=40, length_scale=1 / 8))
        return presets.from_trace(trace, 1 / 8, speedup=presets.TRACE_SPEEDUP)
    if preset == "e":
        return presets.custom()
    return presets.speculative_decoding()


def pct(a: float, b: float) -> str:
    return f"{(a - b) / b * 100:+.0f} %" if b else "n/a"


def row(preset: str) -> str:
    wl = workload(preset)
    comparison = presets.COMPARISONS[presets.PRESET_COMPARISON[preset]]
    if wl is None:
        return f"| ({preset}) | {comparison.name} | (Azure trace absent: set MINENGINE_DATA) | | | |"
    config_a, config_b = comparison.configs(DashboardConfig(**presets.PRESET_ENGINE_DEFAULTS[preset]))
    a, b = run_workload(config_a, wl), run_workload(config_b, wl)
    sa, sb = a.summary, b.summary
    tok_a = sum(tr.num_scheduled_tokens for tr in a.traces)
    tok_b = sum(tr.num_scheduled_tokens for tr in b.traces)
    work = (f"{tok_a:,} vs {tok_b:,} tokens in {len(a.traces)} vs {len(b.traces)} steps; "
            f"{sa.num_preemptions} vs {sb.num_preemptions} preemptions, "
            f"{sa.num_swapped_out_blocks} vs {sb.num_swapped_out_blocks} blocks swapped out")
    label_a, label_b = (t(f"ab_{comparison.name}_{x}", "en").split(": ", 1)[1] for x in "ab")
    return (f"| ({preset}) | {label_a} vs {label_b} "
            f"| {sa.itl_p99 * 1e3:.1f} vs {sb.itl_p99 * 1e3:.1f} ms ({pct(sa.itl_p99, sb.itl_p99)}) "
            f"| {sa.ttft_p99 * 1e3:.1f} vs {sb.ttft_p99 * 1e3:.1f} ms ({pct(sa.ttft_p99, sb.ttft_p99)}) "
            f"| {sa.output_tok_s:,.0f} vs {sb.output_tok_s:,.0f} ({pct(sa.output_tok_s, sb.output_tok_s)}) "
            f"| {work} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="".join(presets.PRESETS), help="which presets (default: all)")
    args = ap.parse_args(argv)
    print("| preset | A vs B | P99 TBT | P99 TTFT | output tok/s | work |")
    print("|---|---|---:|---:|---:|---|")
    for preset in args.presets:
        print(row(preset), flush=True)


if __name__ == "__main__":
    main()

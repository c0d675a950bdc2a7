"""Scheduling policies on real request traces: one Markdown table of latency, throughput, goodput and cache use.

Replays two real traces online on a virtual clock (``minengine.workloads.replay``) through every scheduling
policy of the engine (``minengine.core.policies.POLICIES``; only the default when that module is absent):

- the Azure LLM inference trace 2023, conversation service (Patel et al., "Splitwise", ISCA 2024): real
  arrival times (sped up) and token lengths (scaled down); no prefix sharing;
- the Mooncake FAST'25 trace (Qin et al., "Mooncake", FAST 2025): real lengths (scaled down) and prefix
  structure (hash ids become shared token ids, so the prefix cache hits as in the real conversations).

Every run uses the same requests, the same engine settings and greedy decoding; only the policy differs. By
default times are measured step durations of the tiny model on this machine (``--clock cpu``: this process's CPU
time per step, idle gaps skipped), so compare rows with each other, not with a GPU deployment; rerunning moves the
numbers by timing noise. ``--clock modelled`` times every step with the roofline cost model instead
(``--hardware``, ``--model-shape``; deterministic, the same on every machine).

    python benchmarks/serving_policies.py                   # bundled model, a few minutes on 2 CPU cores
    python benchmarks/serving_policies.py --azure-requests 200 --mooncake-requests 120   # larger
    python benchmarks/serving_policies.py --clock modelled --hardware h100 --model-shape llama-3-8b
Prints the tables; ``--write`` also writes ``benchmarks/results/serving_policies.md`` and its section
of ``docs/workloads.md`` (tracked files: only rewrite them on purpose).
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from pathlib import Path

import torch

from minengine.config import EngineConfig
from minengine.engine.llm_engine import LLMEngine
from minengine.timing import ClockSpec
from minengine.workloads import (
    SLO,
    find_data_dir,
    goodput,
    load_azure_trace,
    load_mooncake_trace,
    replay,
    speed_up,
)
from minengine.workloads.traces import azure_conv_path, mooncake_path

RESULTS = Path(__file__).resolve().parent / "results" / "serving_policies.md"


def policy_names() -> list[str]:
    """Every policy the engine has, or just the default when this build has no policy registry."""
    try:
        from minengine.core.policies import POLICIES
    except ImportError:
        return ["default"]
    return list(POLICIES)


def engine_config(a: argparse.Namespace, policy: str) -> EngineConfig:
    fields = dict(model=a.model, block_size=a.block_size, num_kv_blocks=a.num_kv_blocks,
                  max_num_batched_tokens=a.max_num_batched_tokens, max_num_seqs=a.max_num_seqs,
                  max_model_len=a.max_model_len, trace_block_tables=False, seed=0)
    if policy != "default":
        fields["scheduling_policy"] = policy
    if a.preemption_mode is not None:
        fields["preemption_mode"] = a.preemption_mode
    return EngineConfig(**fields)


def clock_spec(a: argparse.Namespace) -> ClockSpec:
    return ClockSpec(a.clock, hardware=a.hardware, model=a.model_shape, block_size=a.block_size)


def run_one(a: argparse.Namespace, trace, policy: str, slo: SLO) -> dict:
    engine = LLMEngine(engine_config(a, policy), clock=clock_spec(a).make())
    result = replay(engine, trace, seed=0)
    s = result.summary()
    return {"policy": policy, "finished": s.num_requests, "requests": len(trace), "ttft_p50": s.ttft_p50,
            "ttft_p99": s.ttft_p99, "tbt_p99": s.itl_p99, "output_tok_s": s.output_tok_s,
            "goodput": goodput(result.request_metrics, slo), "preemptions": s.num_preemptions,
            "prefix_hit_rate": s.prefix_hit_rate, "clipped": result.num_clipped, "wall_s": result.wall_time_s,
            "outputs": result.output_token_ids}


def markdown_table(rows: list[dict]) -> str:
    def ms(x: float) -> str:
        return "n/a" if math.isnan(x) else f"{x * 1000:.0f}"

    lines = ["| policy | finished | P50 TTFT (ms) | P99 TTFT (ms) | P99 TBT (ms) | output tok/s | goodput (req/s) "
             "| preemptions | prefix hit rate |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['finished']}/{r['requests']} | {ms(r['ttft_p50'])} | {ms(r['ttft_p99'])} "
                     f"| {ms(r['tbt_p99'])} | {r['output_tok_s']:.0f} | {r['goodput']:.2f} | {r['preemptions']} "
                     f"| {r['prefix_hit_rate']:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF checkpoint dir (default: the bundled tiny model)")
    p.add_argument("--data-dir", default=None, help="the shared/data folder (default: ../shared/data)")
    p.add_argument("--policies", nargs="*", default=None, help="policy names (default: all)")
    p.add_argument("--azure-requests", type=int, default=48, help="first N requests of the Azure conv trace")
    p.add_argument("--azure-scale", type=float, default=1 / 8, help="length scale of the Azure trace")
    p.add_argument("--azure-speedup", type=float, default=24.0, help="Azure arrivals this many times faster")
    p.add_argument("--mooncake-requests", type=int, default=64, help="first N requests of the Mooncake trace")
    p.add_argument("--mooncake-scale", type=float, default=1 / 32, help="length scale of the Mooncake trace")
    p.add_argument("--mooncake-speedup", type=float, default=1.0, help="Mooncake arrivals this many times faster")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-kv-blocks", type=int, default=256, help="small enough that long prompts contend")
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--preemption-mode", default=None, help="recompute or swap (default: the engine's)")
    p.add_argument("--slo-ttft-ms", type=float, default=500.0)
    p.add_argument("--slo-tbt-ms", type=float, default=100.0, help="per-request P99 time between tokens")
    p.add_argument("--clock", default="cpu", choices=["cpu", "perf", "modelled"],
                   help="cpu: each step's CPU time of this process (default; other processes on the machine do not "
                        "inflate it, CPU only); perf: each step's wall time (use on a GPU); modelled: each step's "
                        "roofline time on --hardware for --model-shape")
    p.add_argument("--hardware", default="h100", help="modelled clock: hardware preset")
    p.add_argument("--model-shape", default="llama-3-8b", help="modelled clock: model shape preset")
    p.add_argument("--write", action="store_true",
                   help="write the results file (--out) and the docs page's section (--readme); without it, only print")
    p.add_argument("--out", default=str(RESULTS), help="the Markdown file --write writes")
    p.add_argument("--readme", default=str(Path(__file__).resolve().parent.parent / "docs" / "workloads.md"),
                   help="the page whose serving-policies section --write fills ('' = leave it alone)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)

    data_dir = find_data_dir(a.data_dir)
    azure, mooncake = azure_conv_path(data_dir), mooncake_path(data_dir)
    if azure is None or mooncake is None:
        raise SystemExit("the traces are missing: pass --data-dir (the shared/data folder)")
    slo = SLO(ttft_s=a.slo_ttft_ms / 1000, tbt_p99_s=a.slo_tbt_ms / 1000)
    vocab = LLMEngine(engine_config(a, "default")).hf_config.vocab_size
    traces = {
        "Azure conv 2023": faster(load_azure_trace(azure, max_requests=a.azure_requests,
                                                   length_scale=a.azure_scale), a.azure_speedup),
        "Mooncake FAST'25": faster(load_mooncake_trace(mooncake, max_requests=a.mooncake_requests,
                                                       length_scale=a.mooncake_scale, block_size=a.block_size,
                                                       vocab_size=vocab), a.mooncake_speedup),
    }
    policies = a.policies or policy_names()
    cfg = engine_config(a, policies[0])
    out = ["# Scheduling policies on real traces", "",
           "Generated by `python benchmarks/serving_policies.py` "
           f"({time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, torch threads 1). "
           + (f"Virtual-clock replay: times are the measuring machine's step durations ({clock_spec(a).label}), idle "
              "gaps skipped. " if a.clock != "modelled" else
              f"Virtual-clock replay: every step lasts its {clock_spec(a).label} (roofline cost model; the tokens "
              "are computed by the tiny model), idle gaps skipped. ")
           +
           "Lengths are scaled down for a CPU and the tiny model: these are not the traces' real sizes.", "",
           f"Engine: model `{Path(cfg.model).name}`, block_size {cfg.block_size}, num_kv_blocks {cfg.num_kv_blocks}, "
           f"max_num_batched_tokens {cfg.max_num_batched_tokens}, max_num_seqs {cfg.max_num_seqs}, "
           f"preemption_mode {cfg.preemption_mode}, prefix caching on. Greedy, `ignore_eos`, output lengths from "
           f"the trace. Goodput SLO: {slo} (per request). Trace requests carry no priority, so `priority` "
           "sees equal priorities.", ""]
    started = time.perf_counter()
    for name, trace in traces.items():
        rows = []
        for policy in policies:
            rows.append(run_one(a, trace, policy, slo))
            print(f"{name:18s} {policy:18s} done in {rows[-1]['wall_s']:.1f} s", flush=True)
        clipped = rows[0]["clipped"]
        # a policy changes when tokens are computed, never which: greedy outputs must agree across policies
        differ = sorted({rid for r in rows[1:] for rid, ids in r["outputs"].items() if rows[0]["outputs"][rid] != ids})
        out += [f"## {name}", "",
                f"{len(trace)} requests from `{Path(trace.source.split(' (')[0]).name}`, length_scale "
                f"{trace.length_scale:g}"
                + (f" ({trace.tokens_per_hash_block} tokens per 512-token hash block)"
                   if trace.tokens_per_hash_block else "")
                + f", arrivals {name_speed(trace.source)}, mean rate {trace.mean_rate:.1f} req/s"
                + (f"; {clipped} requests clipped to max_model_len {cfg.max_model_len}" if clipped else "") + ".",
                "", markdown_table(rows), "",
                "Greedy outputs identical across policies: "
                + ("yes." if not differ else f"NO, {len(differ)} requests differ ({', '.join(differ[:5])}).") + "",
                ""]
    out.append(f"Data: Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA 2024); Mooncake trace (Qin et "
               f"al., Mooncake, FAST 2025). Total wall time {time.perf_counter() - started:.0f} s.")
    text = "\n".join(out) + "\n"
    print("\n" + text)
    if a.write:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
        if a.readme:
            update_readme(Path(a.readme), text)
        print(f"wrote {a.out}" + (f" and the section of {a.readme}" if a.readme else ""))
    else:
        print("(printed only: pass --write to update the results file and the README)")


README_BEGIN, README_END = "<!-- serving-policies:begin -->", "<!-- serving-policies:end -->"


def update_readme(readme: Path, results: str) -> None:
    """Put the comparison tables into the page (docs/workloads.md) between its two marker comments (headings become bold
    lines there, so the page's own outline is unchanged)."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{readme} has no {README_BEGIN} ... {README_END} section to fill")
    body = "\n".join(f"**{line[3:]}**" if line.startswith("## ") else line
                     for line in results.splitlines()[1:]).strip()  # drop the file's own title
    head, rest = text.split(README_BEGIN, 1)
    readme.write_text(f"{head}{README_BEGIN}\n{body}\n{README_END}{rest.split(README_END, 1)[1]}")


def faster(trace, factor: float):
    """The trace with arrivals ``factor`` times faster (more load from the same requests), noted in its source."""
    return trace if factor == 1 else speed_up(trace, factor)


def name_speed(source: str) -> str:
    """'x8 faster than recorded' from a ``speed_up`` source note, else 'at their recorded times'."""
    if "faster)" in source:
        return source[source.rindex("(arrivals ") + len("(arrivals "):-1] + " than recorded"
    return "at their recorded times"


if __name__ == "__main__":
    main()

"""The fleet simulator's routers against the real router: one trace window through 2 real ``minengine serve``
replicas behind vllm-router, and through the simulator configured as that fleet, for each policy both have.

For each policy (vllm-router's ``round_robin``, ``power_of_two``, ``cache_aware``; the simulator's ``round-robin``,
``power-of-two``, ``cache-aware``): start the fleet (``minengine.entrypoints.fleet_serve.Fleet``), replay the window
through its router (``minengine.fleet.replay.replay_through_router``), stop it, and run the window on the twin
(``twin_config`` with the replicas' own engine settings and a clock fitted to replica 0's measured steps, measured
once on the first fleet, ``measure_step_costs``). The window: the requests of the Mooncake trace's most re-sent
first blocks (``shared_prefix_requests``, conversations that re-send their history), prompts as text, arrivals
stretched to ``--span`` seconds.

    python benchmarks/fleet_vs_router.py --quick            # 24 requests in 40 s per policy: about 4 minutes
    python benchmarks/fleet_vs_router.py --write            # 48 requests in 80 s; the table into docs/fleet.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

README = ROOT / "docs" / "fleet.md"
RESULTS = ROOT / "benchmarks" / "results" / "fleet_vs_router.json"
BEGIN, END = "<!-- fleet-vs-router:begin -->", "<!-- fleet-vs-router:end -->"
MODEL = str(ROOT / "minengine" / "assets" / "tiny-shakespeare-llama")


def busiest_first(counts: list[int]) -> str:
    """Per-replica request counts, the busiest first ("24 / 0"): replica numbers differ between the real router
    (its own worker order) and the simulator, so the counts are compared as a split."""
    return " / ".join(str(c) for c in sorted(counts, reverse=True))


def window(a: argparse.Namespace, tokenizer):
    from minengine.fleet.replay import shared_prefix_requests, text_window
    from minengine.workloads import find_data_dir, load_mooncake_trace, mooncake_path

    path = mooncake_path(find_data_dir())
    if path is None:
        raise SystemExit("the Mooncake trace is not in the data directory (MINENGINE_DATA)")
    trace = load_mooncake_trace(path, length_scale=a.length_scale)
    chosen = shared_prefix_requests(trace, a.num_prefixes, trace.tokens_per_hash_block, a.num_requests)
    span = chosen[-1].arrival_time - chosen[0].arrival_time
    return text_window(chosen, tokenizer, time_scale=a.span / span if span > 0 else 1.0, max_tokens=a.max_tokens)


def run_policy(policy: str, requests, a: argparse.Namespace, shape, costs):
    """(real result, the replicas' engine event, the fitted costs) for one policy on a fresh fleet."""
    from minengine.entrypoints.fleet_serve import Fleet, FleetArgs, free_ports
    from minengine.fleet.replay import measure_step_costs, replay_through_router, replica_steps

    args = FleetArgs([MODEL, "--uvicorn-log-level", "warning"], num_replicas=2, port=free_ports(3),
                     policy=policy, router_log_level="warning")
    with Fleet(args) as fleet:
        if costs is None:
            costs = measure_step_costs(fleet.worker_urls[0], shape)
        info = replica_steps(fleet.worker_urls[0])[0]
        real = replay_through_router(fleet.url, fleet.worker_urls, requests)
    return real, info, costs


def table(rows: list[tuple]) -> str:
    out = ["| policy (real / simulated) | side | requests per replica (busiest first) | prefix hit rate | "
           "TTFT P50 (ms) | TTFT P90 (ms) | in steps P50 (ms) |", "|---|---|---|---:|---:|---:|---:|"]
    for label, side, r in rows:
        out.append(f"| {label} | {side} | {busiest_first(r.requests_per_replica())} | {r.prefix_hit_rate:.1%} | "
                   f"{r.ttft_percentile(50) * 1e3:.0f} | {r.ttft_percentile(90) * 1e3:.0f} | "
                   f"{r.ttft_percentile(50, 'prefill_s') * 1e3:.0f} |")
    return "\n".join(out)


def agreement(real, sim) -> tuple[int, float, float]:
    """(requests whose prefix hit is the same real and simulated, the median real - simulated TTFT, the median real
    TTFT outside the engine's steps: TTFT - ``prefill_s``, seconds)."""
    same = sum(x.cached_tokens == y.cached_tokens for x, y in zip(real.records, sim.records))
    return (same, statistics.median(x.ttft_s - y.ttft_s for x, y in zip(real.records, sim.records)),
            statistics.median(x.ttft_s - x.prefill_s for x in real.records))


def cached_context_fit(costs) -> str:
    """How the fitted clock does on the measured steps of at most 32 new tokens after 1,000+ cached ones (the step of
    a prefix hit, or a decode): their median measured and fitted milliseconds."""
    hits = [p for p in costs.points if any(r.num_new_tokens <= 32 and r.context_len >= 1000 for r in p.work.requests)]
    if not hits:
        return "no measured step of a few tokens after a long cached prefix"
    measured = statistics.median(p.measured_s for p in hits) * 1e3
    fitted = statistics.median(p.predicted_s for p in hits) * 1e3
    return (f"on its {len(hits)} measured steps of at most 32 new tokens after 1,000+ cached ones (a prefix hit's "
            f"step, or a decode) the median is {measured:.1f} ms measured, {fitted:.1f} ms fitted")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="24 requests in 40 s per policy")
    p.add_argument("--policies", default="round_robin,power_of_two,cache_aware")
    p.add_argument("--num-prefixes", type=int, default=4, help="the trace's most re-sent first blocks to keep")
    p.add_argument("--length-scale", type=float, default=1 / 32, help="Mooncake prompt length factor")
    p.add_argument("--max-tokens", type=int, default=16, help="most output tokens per request")
    p.add_argument("--write", action="store_true", help="put the table into docs/fleet.md")
    p.add_argument("--out", default=str(RESULTS), help="every request's record, real and simulated (JSON)")
    a = p.parse_args(argv)
    a.num_requests, a.span = (24, 40.0) if a.quick else (48, 80.0)

    from transformers import AutoTokenizer

    from minengine.fleet.replay import POLICY_ROUTERS, simulate_window, twin_config
    from minengine.timing.model_shape import ModelShape

    policies = [s for s in a.policies.split(",") if s]
    for policy in policies:
        if policy not in POLICY_ROUTERS:
            raise SystemExit(f"--policies: {policy!r} is not one of {tuple(POLICY_ROUTERS)}")
    started, load_start = datetime.now(timezone.utc), os.getloadavg()[0]
    requests = window(a, AutoTokenizer.from_pretrained(MODEL))
    shape = ModelShape.from_hf_config(MODEL, dtype_bytes=4)  # serve's default dtype: float32
    rows, notes, costs = [], [], None
    for policy in policies:
        real, info, costs = run_policy(policy, requests, a, shape, costs)
        sim = simulate_window(requests, twin_config(info, costs.hardware, shape, 2, POLICY_ROUTERS[policy]))
        label = f"`{policy}` / `{POLICY_ROUTERS[policy]}`"
        rows += [(label, "real", real), (label, "simulated", sim)]
        same, gap, outside = agreement(real, sim)
        notes.append(f"{policy}: {same} of {len(requests)} requests with the same prefix hit real and simulated; "
                     f"median per-request TTFT real - simulated {gap * 1e3:.0f} ms; median real TTFT outside the "
                     f"engine's steps (queueing, HTTP, router, tokenizing) {outside * 1e3:.0f} ms")
        print(table(rows[-2:]), notes[-1], sep="\n", flush=True)
    prompt = sum(len(r.prompt_token_ids) for r in requests)
    h = costs.hardware
    given = argv if argv is not None else sys.argv[1:]
    cmd = " ".join(["python benchmarks/fleet_vs_router.py", *given])
    body = "\n".join([
        f"From `{cmd}` on {started:%Y-%m-%d %H:%M} UTC ({platform.machine()}, {os.cpu_count()} CPUs, shared; "
        f"`uptime` load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end), vllm-router "
        f"{_router_version()}: {len(requests)} requests of the Mooncake trace's {a.num_prefixes} most re-sent first "
        f"blocks ({prompt:,} prompt tokens, length scale {a.length_scale:g}, at most {a.max_tokens} output tokens), "
        f"arrivals stretched to {a.span:g} s, 2 replicas of the bundled model (one torch thread each).",
        "",
        table(rows),
        "",
        f"The twin's clock, fitted to {len(costs.points)} measured steps of replica 0: "
        f"{h.per_request_overhead_s * 1e6:.0f} us per request + {h.step_overhead_s * 1e3:.2f} ms per step + "
        f"FLOPs at {h.peak_flops / 1e9:.1f} GFLOP/s + "
        f"bytes at {h.memory_bandwidth / 1e9:.2f} GB/s (R^2 {costs.r2:.3f}, median error "
        f"{costs.median_relative_error:.0%}, worst {costs.worst_relative_error:.0%}); {cached_context_fit(costs)}.",
        "",
        *[f"- {n}" for n in notes]])
    print("\n" + body)
    records = {f"{side} {label}": [dataclasses.asdict(x) for x in r.records] for label, side, r in rows}
    Path(a.out).write_text(json.dumps({"command": cmd, "started": f"{started:%Y-%m-%d %H:%M} UTC",
                                       "records": records}, indent=1) + "\n")
    if a.write:
        text = README.read_text()
        if BEGIN not in text or END not in text:
            raise SystemExit(f"{README} has no {BEGIN} ... {END} section")
        head, rest = text.split(BEGIN, 1)
        README.write_text(f"{head}{BEGIN}\n{body}\n{END}{rest.split(END, 1)[1]}")
        print(f"wrote {README}")


def _router_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-router")
    except PackageNotFoundError:
        return "(not installed)"


if __name__ == "__main__":
    main()

"""Command line: ``python -m minengine run`` serves a batch of real prompts; ``generate`` prints one completion;
``bench-serve`` replays a request trace online and prints vLLM-style serving metrics and goodput."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import time
from pathlib import Path

from minengine.config import EngineConfig
from minengine.core.policies import POLICIES
from minengine.engine.llm_engine import LLMEngine
from minengine.sampling_params import SamplingParams
from minengine.workloads import SHAKESPEARE_OPENINGS, find_data_dir, load_real_prompts


def _engine_args(p: argparse.ArgumentParser) -> None:
    """One flag per ``EngineConfig`` field (``--max-num-batched-tokens`` for ``max_num_batched_tokens``...)."""
    g = p.add_argument_group("engine (EngineConfig)")
    g.add_argument("--model", default=None, help="HF checkpoint dir or hub id (default: the bundled tiny model)")
    g.add_argument("--tokenizer", default=None, help="tokenizer dir or hub id (default: the model's)")
    g.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    g.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--num-kv-blocks", type=int, default=None, help="KV blocks in the pool (default: derived)")
    g.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="KV budget in bytes (if no --num-kv-blocks)")
    g.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget per step")
    g.add_argument("--max-num-seqs", type=int, default=32, help="sequence slots")
    g.add_argument("--max-model-len", type=int, default=None, help="default: the model's max_position_embeddings")
    g.add_argument("--no-chunked-prefill", action="store_true",
                   help="prefill each prompt in one step (needs --max-num-batched-tokens >= --max-model-len)")
    g.add_argument("--long-prefill-token-threshold", type=int, default=0, help="largest prefill chunk (0 = no cap)")
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--scheduling-policy", default="decode-first", choices=list(POLICIES))
    g.add_argument("--prefill-decode-ratio", type=float, default=1.0, help="balanced: prefill : decode tokens")
    g.add_argument("--splitfuse-target-tokens", type=int, default=None,
                   help="dynamic-splitfuse: tokens per forward (default: the token budget)")
    g.add_argument("--priority-aging-steps", type=int, default=64, help="priority: steps per level of aging")
    g.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"])
    g.add_argument("--swap-space-blocks", type=int, default=None, help="CPU swap blocks (default: num_kv_blocks)")
    g.add_argument("--shrink-prefill-chunks", action="store_true", help="admission probe: shrink a chunk to fit")
    g.add_argument("--seed", type=int, default=0)


def _config(a: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=a.model, tokenizer=a.tokenizer, dtype=a.dtype, device=a.device, block_size=a.block_size,
        num_kv_blocks=a.num_kv_blocks, kv_cache_memory_bytes=a.kv_cache_memory_bytes,
        max_num_batched_tokens=a.max_num_batched_tokens, max_num_seqs=a.max_num_seqs,
        max_model_len=a.max_model_len, enable_chunked_prefill=not a.no_chunked_prefill,
        long_prefill_token_threshold=a.long_prefill_token_threshold,
        enable_prefix_caching=not a.no_prefix_caching, scheduling_policy=a.scheduling_policy,
        prefill_decode_ratio=a.prefill_decode_ratio, splitfuse_target_tokens=a.splitfuse_target_tokens,
        priority_aging_steps=a.priority_aging_steps, preemption_mode=a.preemption_mode,
        swap_space_blocks=a.swap_space_blocks, shrink_prefill_chunks=a.shrink_prefill_chunks, seed=a.seed)


def cmd_run(a: argparse.Namespace) -> None:
    from tqdm.auto import tqdm

    for flag in ("num_prompts", "num_real_prompts", "max_prompt_chars", "show"):
        if getattr(a, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(a, flag)}")
    if not 1 <= a.min_tokens <= a.max_tokens:
        raise ValueError(f"need 1 <= --min-tokens <= --max-tokens, got {a.min_tokens} and {a.max_tokens}")
    if a.data_dir is not None and not Path(a.data_dir).is_dir():
        raise ValueError(f"--data-dir {a.data_dir!r} is not a directory")
    engine = LLMEngine(_config(a))
    data_dir = find_data_dir(a.data_dir)
    rng = random.Random(a.seed)
    prompts = [SHAKESPEARE_OPENINGS[i % len(SHAKESPEARE_OPENINGS)] for i in range(a.num_prompts)]
    real = load_real_prompts(data_dir, limit=a.num_real_prompts, max_chars=a.max_prompt_chars)
    prompts += real
    print(f"model: {engine.model_path}  ({sum(p.numel() for p in engine.model.parameters()):,} parameters, "
          f"{engine.config.dtype}, {engine.runner.device})")
    print(f"KV pool: {engine.num_kv_blocks} blocks x {engine.config.block_size} tokens "
          f"({engine.kv_cache_bytes / 2**20:.1f} MiB); token budget {engine.config.max_num_batched_tokens}; "
          f"{engine.config.max_num_seqs} sequence slots")
    print(f"workload: {a.num_prompts} Shakespeare openings + {len(real)} real prompts"
          + (f" from {data_dir / 'prompts'}" if real else " (no shared/data/prompts found)"))
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=a.temperature, top_p=a.top_p, max_tokens=rng.randint(a.min_tokens,
                                a.max_tokens), seed=a.seed + i if a.temperature > 0 else None)
        engine.add_request(str(i), prompt, params)
    done = {}
    with tqdm(total=len(prompts), desc="requests") as bar:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out
                    bar.update(1)
    for rid in list(done)[: a.show]:
        out = done[rid]
        print(f"\n--- request {rid} ({len(out.prompt_token_ids)} prompt tokens, "
              f"{len(out.outputs[0].token_ids)} generated, finish: {out.outputs[0].finish_reason}) ---")
        bold, plain = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")  # highlight the completion
        print((out.prompt or "")[-200:] + bold + out.outputs[0].text + plain)
    print("\n" + engine.summary().as_table())


def cmd_generate(a: argparse.Namespace) -> None:
    engine = LLMEngine(_config(a))
    params = SamplingParams(temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens,
                            seed=a.seed if a.temperature > 0 else None)
    engine.add_request("0", a.prompt, params)
    printed = 0
    while engine.has_unfinished_requests():
        for out in engine.step():  # stream the text as it grows
            text = out.outputs[0].text
            if not text.endswith("\ufffd"):
                sys.stdout.write(text[printed:])
                sys.stdout.flush()
                printed = len(text)
    print()


def _bench_trace(a: argparse.Namespace, vocab_size: int, block_size: int):
    """The workload for ``bench-serve``: a real trace (windowed, scaled, optionally re-timed) or Poisson."""
    from minengine.workloads import (
        azure_conv_path,
        gamma_arrivals,
        load_azure_trace,
        load_mooncake_trace,
        mooncake_path,
        speed_up,
        synthetic_trace,
        with_arrivals,
    )

    cv = 1.0 / math.sqrt(a.burstiness)  # vLLM's burstiness is the gamma shape: cv = 1 / sqrt(shape)
    if a.trace == "poisson":
        rate = a.request_rate if a.request_rate is not None else 4.0
        return synthetic_trace(a.num_requests, rate, cv=cv, prompt_len=a.input_len, output_len=a.output_len,
                               range_ratio=a.range_ratio, seed=a.seed)
    data_dir = find_data_dir(a.data_dir)
    path = a.trace_path or (azure_conv_path(data_dir) if a.trace == "azure" else mooncake_path(data_dir))
    if path is None:
        raise ValueError(f"no {a.trace} trace found: pass --trace-path or --data-dir (the shared/data folder)")
    if a.trace == "azure":
        trace = load_azure_trace(path, max_requests=a.num_requests, start_s=a.start_s, length_scale=a.length_scale)
    else:
        trace = load_mooncake_trace(path, max_requests=a.num_requests, start_s=a.start_s,
                                    length_scale=a.length_scale, block_size=block_size, vocab_size=vocab_size)
    if a.request_rate is not None:  # keep the trace's lengths, replace its arrival times
        trace = with_arrivals(trace, gamma_arrivals(a.request_rate, cv, len(trace), a.seed),
                              source=f"{trace.source} (re-timed: {a.request_rate:g} req/s, cv {cv:.2f})")
    elif a.speedup != 1.0:
        trace = speed_up(trace, a.speedup)
    return trace


def cmd_bench_serve(a: argparse.Namespace) -> None:
    from minengine.workloads import SLO, ServingBenchmark, VirtualClock, find_capacity, replay

    if a.result_json and not Path(a.result_json).resolve().parent.is_dir():  # fail before the run, not after
        raise ValueError(f"--result-json: folder {str(Path(a.result_json).parent)!r} does not exist")
    slo = None
    if any(v is not None for v in (a.slo_ttft_ms, a.slo_tpot_ms, a.slo_tbt_ms)):
        slo = SLO(*(v / 1000 if v is not None else None for v in (a.slo_ttft_ms, a.slo_tpot_ms, a.slo_tbt_ms)))
    if a.burstiness is None or not a.burstiness > 0:
        raise ValueError(f"--burstiness must be > 0, got {a.burstiness!r}")
    if a.capacity and slo is None:
        raise ValueError("--capacity needs an SLO (--slo-ttft-ms, --slo-tpot-ms or --slo-tbt-ms)")
    config = _config(a)
    # CPU time measures a CPU step without the noise of other processes; on a GPU the CPU waits, so wall time
    timer = time.process_time if a.step_timer == "cpu" or (a.step_timer == "auto" and config.device == "cpu") \
        else time.perf_counter
    engine = LLMEngine(config, clock=time.perf_counter if a.wall_clock else VirtualClock(timer=timer))
    trace = _bench_trace(a, engine.hf_config.vocab_size, config.block_size)
    print(f"model: {engine.model_path} ({engine.config.dtype}, {engine.runner.device}); KV pool "
          f"{engine.num_kv_blocks} blocks x {config.block_size} tokens; token budget {config.max_num_batched_tokens}; "
          f"policy {getattr(config, 'scheduling_policy', 'decode-first')}")
    print(f"trace: {len(trace)} requests from {trace.source}; length_scale {trace.length_scale:g}"
          + (" (lengths scaled down: not the real sizes)" if trace.length_scale != 1 else "")
          + f"; arrivals over {trace.duration_s:.1f} s")
    print("clock: " + ("wall (real time)" if a.wall_clock else "virtual (step times measured as "
                       f"{'CPU' if timer is time.process_time else 'wall'} time, idle gaps skipped)"))
    result = replay(engine, trace, seed=a.seed, too_long=a.too_long)
    if result.num_clipped or result.skipped_ids:
        print(f"note: {result.num_clipped} requests clipped, {len(result.skipped_ids)} skipped to fit "
              f"max_model_len ({config.max_model_len}) and the KV pool")
    bench = ServingBenchmark.from_metrics(result.request_metrics, slo)
    print(bench.as_table())
    s = result.summary()
    print(f"steps {s.num_steps}, preemptions {s.num_preemptions}, prefix hit rate {s.prefix_hit_rate:.1%} "
          f"({s.prefix_hit_tokens} of {s.prefix_queried_tokens} tokens), peak KV blocks {s.peak_kv_blocks_used} "
          f"of {s.num_kv_blocks}, wall time {result.wall_time_s:.1f} s")
    if a.capacity:
        start = a.request_rate or trace.mean_rate  # begin the search at the replayed load
        start = start if math.isfinite(start) and start > 0 else 1.0
        cap = find_capacity(slo, config, lengths=list(trace), num_requests=max(2, min(len(trace), a.capacity_requests)),
                            start_rate=start, max_probes=a.capacity_probes, seed=a.seed, timer=timer)
        print(f"capacity (Sarathi-Serve: highest Poisson rate with >= 90% of requests within the SLO and median "
              f"scheduling delay <= 2 s): {cap.capacity:.2f} req/s")
        for p in cap.probes:
            print(f"  probe {p.rate:8.2f} req/s: attainment {p.attainment:6.1%}, median queue delay "
                  f"{p.median_queue_delay_s * 1000:8.1f} ms, goodput {p.goodput:6.2f} req/s  "
                  f"{'pass' if p.passed else 'fail'}")
    if a.result_json:
        with open(a.result_json, "w") as f:
            json.dump({"trace": trace.source, "length_scale": trace.length_scale, "slo": str(slo),
                       "benchmark": dataclasses.asdict(bench), "summary": s.as_dict()}, f, indent=2, default=str)


def _bench_serve_parser(sub) -> None:
    b = sub.add_parser("bench-serve", help="replay a request trace online; print serving metrics and goodput",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _engine_args(b)
    w = b.add_argument_group("workload")
    w.add_argument("--trace", default="azure", choices=["azure", "mooncake", "poisson"],
                   help="Azure conversation trace (Splitwise, ISCA 2024), Mooncake (FAST 2025) or synthetic")
    w.add_argument("--trace-path", default=None, help="a trace file (default: the copy in shared/data)")
    w.add_argument("--data-dir", default=None, help="the shared/data folder (default: ../shared/data)")
    w.add_argument("--num-requests", type=int, default=64, help="first N requests of the trace")
    w.add_argument("--start-s", type=float, default=None, help="window start, seconds into the trace")
    w.add_argument("--length-scale", type=float, default=1 / 16, help="factor on the trace's token lengths")
    w.add_argument("--request-rate", type=float, default=None,
                   help="req/s: replace the arrival times by a Poisson/gamma process (inf = all at once); "
                        "for --trace poisson the default is 4")
    w.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1 = Poisson, <1 bursty)")
    w.add_argument("--speedup", type=float, default=1.0, help="divide the trace's own arrival times by this")
    w.add_argument("--input-len", type=int, default=64, help="poisson: prompt tokens")
    w.add_argument("--output-len", type=int, default=32, help="poisson: output tokens")
    w.add_argument("--range-ratio", type=float, default=0.0, help="poisson: lengths uniform in len*(1 +- r)")
    w.add_argument("--too-long", default="clip", choices=["clip", "skip", "error"],
                   help="requests longer than max_model_len / the KV pool")
    w.add_argument("--wall-clock", action="store_true", help="replay in real time instead of on a virtual clock")
    w.add_argument("--step-timer", default="auto", choices=["auto", "cpu", "wall"],
                   help="virtual clock: measure steps in this process's CPU time (robust to other load; CPU only) "
                        "or wall time; auto = cpu on --device cpu")
    s = b.add_argument_group("SLO (goodput counts requests meeting all given bounds)")
    s.add_argument("--slo-ttft-ms", type=float, default=None, help="time to first token")
    s.add_argument("--slo-tpot-ms", type=float, default=None, help="time per output token")
    s.add_argument("--slo-tbt-ms", type=float, default=None, help="per-request P99 time between tokens")
    c = b.add_argument_group("capacity")
    c.add_argument("--capacity", action="store_true", help="also search the highest Poisson rate meeting the SLO")
    c.add_argument("--capacity-requests", type=int, default=32, help="requests per capacity probe")
    c.add_argument("--capacity-probes", type=int, default=8, help="most probes (short virtual-clock replays)")
    b.add_argument("--result-json", default=None, help="also write the numbers to this JSON file")
    b.set_defaults(func=cmd_bench_serve)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m minengine", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="serve a batch of real prompts and print a summary",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _engine_args(r)
    r.add_argument("--num-prompts", type=int, default=32, help="Shakespeare openings to serve")
    r.add_argument("--num-real-prompts", type=int, default=16, help="real prompts from shared/data/prompts")
    r.add_argument("--max-prompt-chars", type=int, default=2000)
    r.add_argument("--data-dir", default=None, help="the shared/data folder (default: ../shared/data)")
    r.add_argument("--min-tokens", type=int, default=32)
    r.add_argument("--max-tokens", type=int, default=96)
    r.add_argument("--temperature", type=float, default=0.8)
    r.add_argument("--top-p", type=float, default=0.95)
    r.add_argument("--show", type=int, default=3, help="completions to print")
    r.set_defaults(func=cmd_run)
    g = sub.add_parser("generate", help="print one completion", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g.add_argument("prompt")
    _engine_args(g)
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.set_defaults(func=cmd_generate)
    _bench_serve_parser(sub)
    a = p.parse_args(argv)
    try:
        a.func(a)
    except (ValueError, OSError) as exc:  # bad settings or unreadable files: a message, not a traceback
        p.exit(2, f"error: {exc}\n")


if __name__ == "__main__":
    main()

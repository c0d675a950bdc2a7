"""Command line: ``python -m minengine run`` serves a batch of real prompts; ``generate`` prints one completion;
``serve`` starts the OpenAI-compatible server; ``bench-serve`` replays a request trace online (in process, or
against any OpenAI-compatible server with ``--base-url``) and prints vLLM-style serving metrics and goodput;
``fleet-serve`` starts N ``serve`` replicas behind vllm-router (``entrypoints/fleet_serve.py``); ``lab`` lists,
grades and batch-grades the labs (``labs/README.md``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import sys
from pathlib import Path

from minengine.config import EngineConfig
from minengine.engine.arg_utils import EngineArgs
from minengine.engine.llm_engine import LLMEngine
from minengine.entrypoints.fleet_serve import add_fleet_parser
from minengine.labs.cli import add_lab_parser
from minengine.sampling_params import SamplingParams

MAX_CLI_REQUESTS = 100_000  # requests one CLI run serves at most: a larger count is a typo, not a workload


def _check_flag(a: argparse.Namespace, name: str, low: float, high: float, *, low_open: bool = False,
                high_open: bool = False, optional: bool = False, allow_inf: bool = False) -> None:
    """``--name`` must be a number in [low, high] (``low_open`` / ``high_open``: excluded); a ``ValueError``
    naming the flag otherwise (None passes when ``optional``, inf when ``allow_inf``)."""
    v = getattr(a, name)
    if v is None and optional:
        return
    if v is not None and allow_inf and v == math.inf:
        return
    ok = v is not None and math.isfinite(v) and (v > low if low_open else v >= low) \
        and (v < high if high_open else v <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"--{name.replace('_', '-')} must be in {interval}{' or inf' if allow_inf else ''}, "
                         f"got {v!r}")


def _check_text_arguments(a: argparse.Namespace) -> None:
    """Every text argument must be valid UTF-8: bytes that are not reach Python as lone surrogates."""
    for name, value in vars(a).items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                flag = name if name == "prompt" else "--" + name.replace("_", "-")
                raise ValueError(f"argument {flag}: {value!r} is not valid UTF-8 text") from None


def _check_bench_flags(a: argparse.Namespace) -> None:
    """The workload flags of ``bench-serve``, whichever ``--trace`` uses them (ValueError naming the flag)."""
    _check_flag(a, "num_requests", 1, MAX_CLI_REQUESTS)
    _check_flag(a, "start_s", 0, math.inf, high_open=True, optional=True)
    _check_flag(a, "length_scale", 0, 1000, low_open=True)
    _check_flag(a, "request_rate", 0, math.inf, low_open=True, high_open=True, optional=True, allow_inf=True)
    _check_flag(a, "burstiness", 1e-6, 1e6)
    _check_flag(a, "speedup", 1e-6, 1e6)
    _check_flag(a, "input_len", 1, 10**6)
    _check_flag(a, "output_len", 1, 10**6)
    _check_flag(a, "range_ratio", 0, 1, high_open=True)
    _check_flag(a, "capacity_requests", 2, MAX_CLI_REQUESTS, optional=True)
    _check_flag(a, "capacity_probes", 1, 100)
    for name in ("slo_ttft_ms", "slo_tpot_ms", "slo_tbt_ms"):
        _check_flag(a, name, 0, math.inf, low_open=True, high_open=True, optional=True)


def _engine_args(p: argparse.ArgumentParser) -> None:
    """The engine flags: ``EngineArgs.add_cli_args`` (one definition for every command; vLLM's flag names, with
    every ``EngineConfig`` field and the vLLM-only ones such as ``--tensor-parallel-size``, ``--enforce-eager``,
    ``--num-gpu-blocks-override``, ``--generation-config``; ``--dtype auto``)."""
    EngineArgs.add_cli_args(p)


def _config(a: argparse.Namespace) -> EngineConfig:
    """The ``EngineConfig`` of the parsed flags (``EngineArgs.from_cli_args(a).create_engine_config()``)."""
    return EngineArgs.from_cli_args(a).create_engine_config()


PROMPT_TAIL_CHARS = 200  # `run` shows this much of a prompt's end before its completion


def prompt_tail(prompt: str, max_chars: int = PROMPT_TAIL_CHARS) -> str:
    """The end of ``prompt`` in at most ``max_chars`` characters plus a leading "…" when cut. The cut falls on a
    word boundary (the first whitespace inside the kept part), so the text never starts mid-word; a kept part with
    no whitespace at all is cut where it is.

    Raises:
        ValueError: ``max_chars`` < 1.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars!r}")
    if len(prompt) <= max_chars:
        return prompt
    kept = prompt[-max_chars:]
    if not prompt[-max_chars - 1].isspace():  # the cut is inside a word: start at the next word
        words = kept.split(maxsplit=1)
        if len(words) == 2 and not kept[0].isspace():
            kept = kept[len(kept) - len(words[1]):]
    return "…" + kept.lstrip()


def cmd_run(a: argparse.Namespace) -> None:
    from tqdm.auto import tqdm

    from minengine.workloads import SHAKESPEARE_OPENINGS, find_data_dir, load_real_prompts

    for flag in ("num_prompts", "num_real_prompts", "max_prompt_chars", "show"):
        if getattr(a, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(a, flag)}")
    _check_flag(a, "num_prompts", 0, MAX_CLI_REQUESTS)
    if not 1 <= a.min_tokens <= a.max_tokens:
        raise ValueError(f"need 1 <= --min-tokens <= --max-tokens, got {a.min_tokens} and {a.max_tokens}")
    if a.data_dir is not None and not Path(a.data_dir).is_dir():
        raise ValueError(f"--data-dir {a.data_dir!r} is not a directory")
    data_dir = find_data_dir(a.data_dir)
    real = load_real_prompts(data_dir, limit=a.num_real_prompts, max_chars=a.max_prompt_chars)  # fail early
    engine = LLMEngine(_config(a))
    rng = random.Random(a.seed)
    prompts = [SHAKESPEARE_OPENINGS[i % len(SHAKESPEARE_OPENINGS)] for i in range(a.num_prompts)]
    prompts += real
    weights = (f"{sum(p.numel() for p in engine.model.parameters()):,} parameters" if engine.model is not None
               else f"weights in {engine.config.tensor_parallel_size} worker process(es)")
    print(f"model: {engine.model_path}  ({weights}, {engine.config.dtype}, {engine.runner.device})")
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
        print(prompt_tail(out.prompt or "") + bold + out.outputs[0].text + plain)
    print("\n" + engine.summary().as_table())


def cmd_generate(a: argparse.Namespace) -> None:
    config = _config(a)
    engine = LLMEngine(config)
    # Every rank of an external launcher's group generates the same text: rank 0 alone prints it.
    show = config.distributed_executor_backend != "external_launcher" or os.environ.get("RANK") == "0"
    params = SamplingParams(temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens,
                            seed=a.seed if a.temperature > 0 else None)
    engine.add_request("0", a.prompt, params)
    printed = 0
    while engine.has_unfinished_requests():
        for out in engine.step():  # stream the text as it grows
            text = out.outputs[0].text
            if show and not text.endswith("\ufffd"):
                sys.stdout.write(text[printed:])
                sys.stdout.flush()
                printed = len(text)
    if show:
        print()


def _bench_trace(a: argparse.Namespace, vocab_size: int, block_size: int):
    """The workload for ``bench-serve``: a real trace (windowed, scaled, optionally re-timed) or Poisson."""
    from minengine.workloads import (
        azure_conv_path,
        find_data_dir,
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


def _clock_spec(a: argparse.Namespace, config: EngineConfig):
    """The ``ClockSpec`` of bench-serve's ``--clock`` flags; "auto" = CPU time on the CPU, per-step wall time on
    a GPU (where the CPU waits for the device)."""
    from minengine.timing import ClockSpec

    kind = a.clock
    if kind == "auto":
        kind = "cpu" if config.device == "cpu" else "perf"
    return ClockSpec(kind, hardware=a.hardware, model=a.model_shape, tp=a.clock_tp, block_size=config.block_size,
                     kv_cache_dtype=config.kv_cache_dtype, quantization=config.quantization)


def _warm_up(engine: LLMEngine) -> None:
    """Two short requests through the engine, then forget them: the first steps of a process pay one-off
    costs (allocator, kernels, caches) that a measured clock would charge to the benchmark's first requests."""
    vocab = engine.hf_config.vocab_size
    for i in range(2):
        engine.add_request(f"warmup-{i}", {"prompt_token_ids": [(17 * j + i) % vocab for j in range(32)]},
                           SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    engine.reset_stats()


def cmd_serve(a: argparse.Namespace) -> None:
    from minengine.entrypoints.async_engine import AsyncLLMEngine
    from minengine.entrypoints.chat_utils import load_chat_template
    from minengine.entrypoints.cli_args import FrontendArgs
    from minengine.entrypoints.openai_server import run_server
    from minengine.executor.start_method import spawned_workers_unless_set

    if a.model_tag is not None:  # ``serve MODEL`` as ``vllm serve MODEL``
        a.model = a.model_tag
    if not 0 < a.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {a.port}")
    if a.max_history_steps < 0:
        raise ValueError(f"--max-history-steps must be >= 0, got {a.max_history_steps}")
    frontend = FrontendArgs.from_cli_args(a)  # checked before the model loads
    api_keys = frontend.api_key or ([os.environ["VLLM_API_KEY"]] if os.environ.get("VLLM_API_KEY") else None)
    # a bad --chat-template path fails before the model loads too
    frontend = dataclasses.replace(frontend, api_key=api_keys,
                                   chat_template=load_chat_template(frontend.chat_template))
    config = _config(a)
    if config.distributed_executor_backend == "external_launcher":  # only rank 0 would see the requests
        raise ValueError("--distributed-executor-backend external_launcher is for offline runs (every rank must be "
                         "given the same requests): serve with mp, and several machines with fleet-serve")
    with spawned_workers_unless_set():  # as `vllm serve`: the server owns its (guarded) main module
        engine = AsyncLLMEngine(LLMEngine(config), max_history_steps=a.max_history_steps)
    print(f"minengine serving {config.served_model_name!r} ({engine.engine.model_path}) on http://{a.host}:{a.port} "
          f"(OpenAI API under /v1{', API key required but for /health, /ping, /version' if api_keys else ''}, "
          "Prometheus at /metrics, step feed at "
          "/v1/engine/steps)", flush=True)
    if config.labs:
        from minengine.labs.door import describe_parts

        print(f"minengine: {describe_parts(engine.engine)}", flush=True)
    run_server(engine, a.host, a.port, a.uvicorn_log_level, frontend, generation_config=a.generation_config)


def _add_option(parser: argparse.ArgumentParser, group, flag: str, **kwargs) -> None:
    """Add ``flag`` to ``group`` unless the engine flags already define it (they are generated from
    ``EngineConfig``, which has ``served_model_name`` too)."""
    if flag not in parser._option_string_actions:
        group.add_argument(flag, **kwargs)


def _serve_parser(sub) -> None:
    from minengine.entrypoints.cli_args import FrontendArgs  # no torch, no FastAPI

    s = sub.add_parser("serve", help="start the OpenAI-compatible server (FastAPI + uvicorn)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("model_tag", nargs="?", default=None, help="the model, as in `vllm serve MODEL` (or --model)")
    _engine_args(s)
    h = s.add_argument_group("server")
    h.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: all)")
    h.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    _add_option(s, h, "--served-model-name", default=None,
                help="the model name in the API and the metrics (None: --model, or tiny-shakespeare-llama)")
    h.add_argument("--max-history-steps", type=int, default=10_000,
                   help="step traces and finished requests' metrics kept in memory")
    h.add_argument("--uvicorn-log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (warning: no access log)")
    h.add_argument("--disable-log-requests", action="store_true",
                   help="vLLM's flag, accepted: minengine logs no request's prompt or parameters in any case "
                        "(vLLM's default since it added --enable-log-requests)")
    FrontendArgs.add_cli_args(h)
    s.set_defaults(func=cmd_serve)


def cmd_bench_serve(a: argparse.Namespace) -> None:
    from minengine.workloads import SLO, ServingBenchmark, find_capacity, replay

    if a.result_json and not Path(a.result_json).resolve().parent.is_dir():  # fail before the run, not after
        raise ValueError(f"--result-json: folder {str(Path(a.result_json).parent)!r} does not exist")
    _check_bench_flags(a)
    slo = None
    if any(v is not None for v in (a.slo_ttft_ms, a.slo_tpot_ms, a.slo_tbt_ms)):
        slo = SLO(*(v / 1000 if v is not None else None for v in (a.slo_ttft_ms, a.slo_tpot_ms, a.slo_tbt_ms)))
    if a.burstiness is None or not a.burstiness > 0:
        raise ValueError(f"--burstiness must be > 0, got {a.burstiness!r}")
    if a.capacity and slo is None:
        raise ValueError("--capacity needs an SLO (--slo-ttft-ms, --slo-tpot-ms or --slo-tbt-ms)")
    if not isinstance(a.clock_tp, int) or a.clock_tp < 1:
        raise ValueError(f"--clock-tp must be >= 1, got {a.clock_tp!r}")
    if a.max_concurrency is not None and a.base_url is None:  # the in-process replay has no such limit
        raise ValueError("--max-concurrency limits the requests in flight to a --base-url server; the in-process "
                         "engine admits by its own --max-num-seqs")
    config = _config(a)
    if a.base_url is not None:
        return _bench_remote(a, config, slo)
    spec = _clock_spec(a, config)
    engine = LLMEngine(config, clock=spec.make())
    if spec.kind in ("cpu", "perf", "wall"):
        _warm_up(engine)
    trace = _bench_trace(a, engine.hf_config.vocab_size, config.block_size)
    print(f"model: {engine.model_path} ({engine.config.dtype}, {engine.runner.device}, torch threads "
          f"{config.num_cpu_threads if config.num_cpu_threads is not None else 'unchanged'}); KV pool "
          f"{engine.num_kv_blocks} blocks x {config.block_size} tokens; token budget {config.max_num_batched_tokens}; "
          f"policy {config.scheduling_policy}")
    print(f"trace: {len(trace)} requests from {trace.source}; length_scale {trace.length_scale:g}"
          + (" (lengths scaled down: not the real sizes)" if trace.length_scale != 1 else "")
          + f"; arrivals over {trace.duration_s:.1f} s")
    explain = {"modelled": "each step lasts what the roofline cost model gives for these shapes; tokens computed "
                           "by the loaded model; idle gaps skipped",
               "cpu": "step times measured as this process's CPU time, idle gaps skipped",
               "perf": "step times measured as wall time, idle gaps skipped", "wall": "real time"}
    print(f"clock: {spec.label} ({explain[spec.kind]})")
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
    cap = None
    if a.capacity:
        cap = find_capacity(slo, config, lengths=list(trace), num_requests=a.capacity_requests,
                            max_probes=a.capacity_probes, seed=a.seed, clock=spec)
        print(f"maximum throughput ({cap.num_requests} requests of the trace's lengths all at once, {spec.label}): "
              f"{cap.max_throughput:,.2f} req/s, up to {cap.peak_running} running at once")
        print(f"capacity (Sarathi-Serve: highest Poisson rate, at most the maximum throughput, with >= 90% of "
              f"requests within the SLO, median scheduling delay <= 2 s and >= 95% as many completed as arrived; "
              f"{cap.num_requests} requests per probe, "
              f"the first {cap.warmup_requests} not measured): {cap.describe()}")
        for p in cap.probes:
            print(f"  probe {p.rate:8.2f} req/s: attainment {p.attainment:6.1%}, median queue delay "
                  f"{p.median_queue_delay_s * 1000:8.1f} ms, goodput {p.goodput:6.2f} req/s, throughput "
                  f"{p.throughput:6.2f} req/s, completed/arrived {p.completed_fraction:5.2f}  "
                  f"{'pass' if p.passed else 'fail'}")
        if cap.bound == "probes":
            print("  (raise --capacity-probes to search further)")
        if cap.peak_running and not cap.steady:
            print("  (raise --capacity-requests for a steady state)")
    if a.result_json:
        with open(a.result_json, "w") as f:
            json.dump({"trace": trace.source, "length_scale": trace.length_scale, "slo": str(slo), "clock": spec.label,
                       "benchmark": dataclasses.asdict(bench), "summary": s.as_dict(),
                       "capacity": None if cap is None else {
                           "capacity": cap.capacity, "failing_rate": cap.failing_rate, "bound": cap.bound,
                           "max_throughput": cap.max_throughput, "peak_running": cap.peak_running,
                           "requests_per_probe": cap.num_requests, "warmup_requests": cap.warmup_requests,
                           "steady": cap.steady, "text": cap.describe()}},
                      f, indent=2, default=str)


def _bench_serve_parser(sub) -> None:
    b = sub.add_parser("bench-serve", help="replay a request trace online; print serving metrics and goodput",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _engine_args(b)
    w = b.add_argument_group("workload")
    w.add_argument("--trace", default="azure", choices=["azure", "mooncake", "poisson"],
                   help="Azure conversation trace (Splitwise, ISCA 2024), Mooncake (FAST 2025) or synthetic")
    w.add_argument("--trace-path", default=None, help="a trace file (None: the copy in shared/data)")
    w.add_argument("--data-dir", default=None, help="the shared/data folder (None: ../shared/data)")
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
    k = b.add_argument_group("clock (how time is measured or modelled)")
    k.add_argument("--clock", default="auto", choices=["auto", "cpu", "perf", "wall", "modelled"],
                   help="cpu: each step's CPU time of this process, idle gaps skipped (robust to other load; CPU "
                        "only); perf: each step's wall time, idle gaps skipped (GPU); wall: real time; modelled: "
                        "each step's roofline time on --hardware for --model-shape (deterministic); auto: cpu on "
                        "--device cpu, else perf")
    k.add_argument("--hardware", default="h100", help="modelled clock: h100, h200, a100, l4, rtx4090 or cpu")
    k.add_argument("--model-shape", default="llama-3-8b",
                   help="modelled clock: llama-3-8b, qwen2.5-7b, llama-3-70b, bundled, or a config.json path")
    k.add_argument("--clock-tp", type=int, default=1, help="modelled clock: tensor-parallel GPUs")
    s = b.add_argument_group("SLO (goodput counts requests meeting all given bounds)")
    s.add_argument("--slo-ttft-ms", type=float, default=None, help="time to first token")
    s.add_argument("--slo-tpot-ms", type=float, default=None, help="time per output token")
    s.add_argument("--slo-tbt-ms", type=float, default=None, help="per-request P99 time between tokens")
    c = b.add_argument_group("capacity")
    c.add_argument("--capacity", action="store_true", help="also search the highest Poisson rate meeting the SLO")
    c.add_argument("--capacity-requests", type=int, default=None,
                   help="requests per capacity probe (None: 8 x --max-num-seqs, enough for a steady state)")
    c.add_argument("--capacity-probes", type=int, default=8,
                   help="most probes (virtual-clock replays), after one saturating run for the maximum throughput")
    r = b.add_argument_group("remote server (instead of an engine in this process)")
    r.add_argument("--base-url", default=None,
                   help="drive this OpenAI-compatible server (e.g. http://127.0.0.1:8000) in real time; "
                        "--model then only gives the vocabulary for synthetic prompts")
    _add_option(b, r, "--served-model-name", default=None, help="model name to send (None: the server's first)")
    r.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (None: no limit)")
    b.add_argument("--result-json", default=None, help="also write the numbers to this JSON file")
    b.set_defaults(func=cmd_bench_serve)


def _bench_remote(a: argparse.Namespace, config: EngineConfig, slo) -> None:
    """``bench-serve --base-url``: the same trace and table, measured by an HTTP client against a server."""
    import asyncio

    import httpx
    from transformers import AutoConfig

    from minengine.entrypoints.bench_client import replay_http
    from minengine.workloads import ServingBenchmark

    if a.capacity or a.clock not in ("auto", "wall"):
        raise ValueError("--capacity and --clock are for the in-process engine; --base-url always measures real "
                         "time on the client")
    if a.max_concurrency is not None and a.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {a.max_concurrency}")
    vocab_size = AutoConfig.from_pretrained(config.model).vocab_size
    trace = _bench_trace(a, vocab_size, config.block_size)
    print(f"server: {a.base_url}; trace: {len(trace)} requests from {trace.source}; length_scale "
          f"{trace.length_scale:g}; arrivals over {trace.duration_s:.1f} s (real time)")
    try:
        result = asyncio.run(replay_http(a.base_url, trace, model=a.served_model_name, vocab_size=vocab_size,
                                         seed=a.seed, max_concurrency=a.max_concurrency))
    except httpx.HTTPError as exc:
        raise ValueError(f"--base-url {a.base_url}: {exc}") from exc
    print(f"model: {result.model} (max_model_len {result.max_model_len}); clock: wall, measured by the client")
    if result.num_clipped:
        print(f"note: {result.num_clipped} requests clipped to fit the server's max_model_len")
    bench = ServingBenchmark.from_metrics(result.request_metrics, slo)
    print(bench.as_table())
    print(f"failed requests {len(result.errors)}, wall time {result.wall_time_s:.1f} s")
    for rid, err in list(result.errors.items())[:5]:
        print(f"  {rid}: {err}")
    if a.result_json:
        with open(a.result_json, "w") as f:
            json.dump({"base_url": a.base_url, "trace": trace.source, "length_scale": trace.length_scale,
                       "slo": str(slo), "benchmark": dataclasses.asdict(bench), "errors": result.errors}, f,
                      indent=2, default=str)


def _say_kernel_status(status) -> None:
    """The CPU attention kernel's build as it happens (``cpu_attention.on_change``), on stderr so that piped
    completions stay clean: building, waiting for another process, fallen back (with the reason), and ready after
    one of those; a cached build loads silently."""
    from minengine.layers.cpu_attention import KernelState

    if status.state in (KernelState.WAITING, KernelState.BUILDING, KernelState.FALLBACK) or (
            status.state is KernelState.READY and status.in_background):
        print(f"minengine: {status.message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser: run, generate, bench-serve and serve, each with ``EngineArgs``' flags; ``lab``
    (``minengine/labs/cli.py``)."""
    p = argparse.ArgumentParser(prog="python -m minengine", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="serve a batch of real prompts and print a summary",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _engine_args(r)
    r.add_argument("--num-prompts", type=int, default=32, help="Shakespeare openings to serve")
    r.add_argument("--num-real-prompts", type=int, default=16, help="real prompts from shared/data/prompts")
    r.add_argument("--max-prompt-chars", type=int, default=2000, help="cut each real prompt to this many characters")
    r.add_argument("--data-dir", default=None, help="the shared/data folder (None: ../shared/data)")
    r.add_argument("--min-tokens", type=int, default=32, help="fewest tokens to generate per request")
    r.add_argument("--max-tokens", type=int, default=96, help="most tokens to generate per request")
    r.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (0 = greedy)")
    r.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass")
    r.add_argument("--show", type=int, default=3, help="completions to print")
    r.set_defaults(func=cmd_run)
    g = sub.add_parser("generate", help="print one completion", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g.add_argument("prompt", help="the prompt text")
    _engine_args(g)
    g.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    g.set_defaults(func=cmd_generate)
    _bench_serve_parser(sub)
    _serve_parser(sub)
    add_fleet_parser(sub)
    add_lab_parser(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    p = build_parser()
    a = p.parse_args(argv)
    from minengine.layers import cpu_attention

    stop_saying = cpu_attention.on_change(_say_kernel_status)
    try:
        _check_text_arguments(a)
        a.func(a)
    except (ValueError, OSError) as exc:  # bad settings or unreadable files: a message, not a traceback
        p.exit(2, f"error: {exc}\n")
    finally:
        stop_saying()


if __name__ == "__main__":
    main()

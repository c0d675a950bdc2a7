# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 10: the fleet: the engine's own scheduler on many modelled GPUs: routing, disaggregation, goodput, capacity.

Self-contained: it needs none of the earlier chapters (only ``minengine`` and, for the real traces, ``../shared/data``;
a synthetic trace stands in without it). Only the section on the real router runs the bundled model: two
``minengine serve`` replicas behind ``vllm-router``."""

from cells import code, conclusion, exercise, glossary, header, md, question, summary

SETUP_FLEET = """\
# Setup: the fleet lab (no model weights, no torch), the course helpers and the figure builders.
import math
import sys

import plotly.graph_objects as go

import minengine.viz as viz
import minengine.viz.fleet_figures as fleet_viz
from minengine.config import EngineConfig
from minengine.course import FAST, check, check_close, check_function, claim, conclude, pick
from minengine.engine.llm_engine import LLMEngine
from minengine.fleet import (LINKS, ROUTERS, FleetConfig, KVLink, KVStoreConfig, PercentileSLO, TokenFreeRunner, infinite_cache_hits,
                             simulate, token_free_engine)
from minengine.fleet.planning import max_goodput, min_replicas
from minengine.sampling_params import SamplingParams
from minengine.timing import StepCostModel, StepWork
from minengine.timing.hardware import HARDWARE
from minengine.timing.model_shape import LLAMA_3_8B, MODEL_SHAPES
from minengine.workloads import (Trace, TraceRequest, azure_conv_path, find_data_dir, load_azure_trace, load_mooncake_trace,
                                 mooncake_path, replay, speed_up, synthetic_trace)
from minengine.viz.template import use_course_template

use_course_template()   # log axes label their decades only (no stray "2", "5" between them)
print("fast mode (MINENGINE_FAST=1):", FAST, "| torch loaded:", "torch" in sys.modules)
"""

CELLS = [
    *header(10, "The fleet: one scheduler, many GPUs", [
        "Explain what a token-free simulation keeps (the real scheduler, KV cache, prefix cache, modelled step times) and drops (the tokens), and why reusing the engine's own scheduler makes a fleet simulation trustworthy.",
        "Route requests across replicas (round-robin, power of two choices, least outstanding tokens, least KV usage, cache-aware with a load-balance threshold) and measure the prefix-hit rate and the load imbalance.",
        "Check the simulator against a real fleet: the same requests through vLLM's router in front of real replicas and through the simulated twin, on a clock fitted to the replicas' measured steps.",
        "Share prefixes across the whole fleet with a KV store in the nodes' DRAM (Mooncake): decide when fetching a prefix beats recomputing it (bytes per token over the link vs FLOPs per token on the GPU), route with Mooncake's conductor, and compare the hit share with the trace's infinite-cache ideal.",
        "Size and time the KV transfer of disaggregated prefill/decode over NVLink, InfiniBand and Ethernet.",
        "Compare colocated and disaggregated fleets at equal GPU count with DistServe's goodput (the highest request rate at which the SLO attainment target holds: P90 TTFT and P90 TPOT within their bounds), find the best prefill:decode split, and plan the GPUs a trace needs.",
    ], ["Zhong et al., *DistServe: Disaggregating Prefill and Decoding for Goodput-optimized LLM Serving*, OSDI 2024",
        "Patel et al., *Splitwise: Efficient Generative LLM Inference Using Phase Splitting*, ISCA 2024 (and the Azure trace)",
        "Qin et al., *Mooncake: A KVCache-centric Disaggregated Architecture for LLM Serving*, FAST 2025 (and its trace)",
        "Agrawal et al., *Vidur: A Large-Scale Simulation Framework for LLM Inference*, MLSys 2024",
        "SGLang Model Gateway, cache-aware routing policy (`sgl-model-gateway/src/policies/cache_aware.rs`); SGLang v0.4 release notes",
        "vLLM's router (`vllm-project/router`: `src/policies/cache_aware.rs`, `src/policies/power_of_two.rs`)",
        "Agrawal et al., *Sarathi-Serve*, OSDI 2024 (chunked prefill)",
        "Mooncake Store and Transfer Engine (kvcache-ai/Mooncake); vLLM's KV connector interface"]),
    code(SETUP_FLEET),
    md("""
    ## A serving system is many engines
    One engine (chapters 1-7) serves one GPU, or a few with tensor parallelism. A service is a **fleet**: many replicas
    behind a **router**, and possibly separate pools for **prefill** and **decode** that hand each request's KV cache over a
    link (DistServe, Splitwise, Mooncake). Production systems do this with real distributed engines. Here we do it on a
    laptop by running minengine's *own* scheduler for every replica, with every step timed by the roofline cost model of
    a named GPU (chapter 1). Vidur simulates fleets the same way but re-implements the scheduler; here the simulated
    scheduler **is** the engine's, so every policy of chapters 4-7 works at fleet scale unchanged.

    ## The engine without the model
    What does a serving experiment need from the model? Not the tokens: a trace gives prompt and output lengths, and
    `ignore_eos=True` with `max_tokens` = the output length makes each request generate exactly that many tokens. What is
    left of the model is its **sizes**: the vocabulary, the context length and the KV bytes per token. `TokenFreeRunner`
    stands in for the model runner: it computes nothing and returns a token for every request that samples.
    """),
    conclusion("""
    engine = token_free_engine(EngineConfig(num_kv_blocks=4096, max_num_batched_tokens=2048, max_num_seqs=256,
                                            max_model_len=8192, trace_block_tables=False), "llama-3-8b", hardware="h100")
    print(type(engine).__name__, "with", type(engine.runner).__name__, "| clock:", engine.clock.label)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    engine.add_request("long", {"prompt_token_ids": list(range(3000))}, params, arrival_time=0.0)
    engine.add_request("short", {"prompt_token_ids": list(range(5000, 5100))}, params, arrival_time=0.0)
    while engine.has_unfinished_requests():
        engine.step()
        t = engine.traces[-1]
        print(f"step {t.step}: {[(c.request_id, c.num_tokens) for c in t.chunks]} -> {t.duration * 1000:6.2f} ms "
              f"({engine.clock.last_cost.bound}-bound)")
    first = engine.traces[0]
    conclude(f"The same `LLMEngine`, its scheduler and KV cache manager: the first step held "
             f"{sum(c.num_tokens for c in first.chunks):,} tokens, the 2,048-token budget, so the 3,000-token prompt was "
             f"chunked; the modelled clock says the whole run took **{engine.clock() * 1000:.1f} ms** on an H100 for "
             f"Llama-3-8B, and torch was never loaded.",
             [("the first step filled the 2,048-token budget", sum(c.num_tokens for c in first.chunks) == 2048),
              ("torch is not loaded on the token-free path", "torch" not in sys.modules)])
    """),
    md("""
    ## The traces
    The Azure LLM inference trace (conversation service, 2023: real arrival times and lengths, no prefix information) and
    the Mooncake trace (real lengths and prefix structure from Kimi's conversations). Without `../shared/data`
    synthetic Poisson traces stand in (the Mooncake one with 8 shared 768-token prefixes, so that a prefix cache has
    something to find) and the numbers below change.
    """),
    code("""
    data = find_data_dir()
    HAVE_TRACES = azure_conv_path(data) is not None and mooncake_path(data) is not None
    if HAVE_TRACES:
        azure = load_azure_trace(azure_conv_path(data), max_requests=pick(400, 300))
        mooncake = load_mooncake_trace(mooncake_path(data), max_requests=pick(300, 250), vocab_size=LLAMA_3_8B.vocab_size)
    else:
        import random
        azure = synthetic_trace(pick(400, 300), rate=5.0, prompt_len=1024, output_len=200, range_ratio=0.9)
        rng = random.Random(0)
        prefixes = [[rng.randrange(3, LLAMA_3_8B.vocab_size) for _ in range(768)] for _ in range(8)]
        mooncake = Trace([TraceRequest(r.arrival_time, 768 + r.prompt_len, r.output_len,
                                       prefixes[rng.randrange(8)] + [rng.randrange(3, LLAMA_3_8B.vocab_size) for _ in range(r.prompt_len)],
                                       f"shared-prefix-{i}")
                          for i, r in enumerate(synthetic_trace(pick(300, 150), rate=5.0, prompt_len=256, output_len=200,
                                                                range_ratio=0.9, seed=1))],
                         source="synthetic: Poisson, 8 shared 768-token prefixes + 256-token questions")
    print(azure)
    print(mooncake)
    print(f"Azure window: mean rate {azure.mean_rate:.2f} req/s, mean prompt {sum(r.prompt_len for r in azure) / len(azure):.0f} tokens, "
          f"mean output {sum(r.output_len for r in azure) / len(azure):.0f} tokens")
    """),
    md("""
    ## One replica is the engine
    `simulate(trace, FleetConfig.colocated(1))` runs the trace on one replica with the fleet's event loop. It must give
    exactly what `replay` gives for the same engine on the same clock (chapter 7), request by request.
    """),
    conclusion("""
    small = azure[:pick(100, 60)]
    one = simulate(small, FleetConfig.colocated(1, max_model_len=16384))
    cfg = EngineConfig(num_kv_blocks=one.replicas[0].num_kv_blocks, max_num_batched_tokens=2048, max_num_seqs=256,
                       max_model_len=16384, trace_block_tables=False, num_cpu_threads=None)
    ref = replay(token_free_engine(cfg, "llama-3-8b", max_position_embeddings=16384), small, too_long="error")
    same = sum(one.request_metrics[rid] == ref.request_metrics[rid] for rid in ref.request_metrics)
    conclude(f"All {same} of {len(small)} requests have identical metrics (every timestamp and every inter-token gap) in "
             f"the fleet and in the engine's own replay.",
             [("every request's metrics are identical in the fleet and in replay", same == len(small) == len(ref.request_metrics))])
    """),
    md("""
    ## A fleet and its router
    Four H100s, one Llama-3-8B replica each, the Azure window at 4x its recorded rate. Each replica's lane shows its KV use
    and its queue over simulated time.
    """),
    code("""
    busy = speed_up(azure, 4.0)
    fleet = simulate(busy, FleetConfig.colocated(4, router="least-outstanding-tokens"))
    print(fleet.describe())
    fleet_viz.fleet_lanes_figure(fleet, "kv").show()
    fleet_viz.fleet_load_figure(fleet).show()
    """),
    md("""
    A **router** chooses a replica for each arriving request among those that can hold it:
    - **round-robin** and **random** ignore the load; **power-of-two** draws two replicas at random and takes the one with
      fewer outstanding requests (vLLM's router, `power_of_two`); **least outstanding tokens** sends to the replica with
      the least work assigned and unfinished (`prompt + max_tokens`); **least KV usage** to the one whose KV pool is
      least loaded.
    - **cache-aware** is the cache-aware rule of SGLang's router and vLLM's (`vllm-router`, `cache_aware`): if the load
      (outstanding requests) is *imbalanced* (max - min > 64 and max > 1.5 x min) send to the least loaded replica;
      otherwise to the replica that holds the longest part of the prompt, if that part is more than 30 % of it; else to
      the least loaded (source: the defaults of `py_src/vllm_router/router_args.py` in vllm-project/router). What a
      replica "holds" is the router's own record of the prompts it sent there. **prefix-aware** is the same rule reading each replica's real prefix cache instead, as Mooncake's
      scheduler does with its global KV metadata.

    On the Mooncake trace, where conversations re-send their history, the choice decides how much prefill is skipped.
    """),
    conclusion("""
    routers = {}
    for name in ROUTERS:
        routers[name] = simulate(mooncake, FleetConfig.colocated(4, router=name))
    for name, r in routers.items():
        print(f"{name:26s} prefix hit rate {r.prefix_hit_rate:6.1%} | TTFT P50 {r.latency('ttft', 50) * 1000:7.0f} ms, "
              f"P99 {r.latency('ttft', 99) * 1000:7.0f} ms | load imbalance {r.load_imbalance():.2f}")
    best_router = max(routers, key=lambda k: routers[k].prefix_hit_rate)
    viz.latency_cdf_figure(routers[best_router].request_metrics).update_layout(title=f"{best_router}: TTFT and TPOT").show()
    hits, rr = routers[best_router], routers["round-robin"]
    ttft_word = "lower" if hits.latency("ttft", 50) < rr.latency("ttft", 50) else "not lower"
    conclude(f"**{best_router}** serves {hits.prefix_hit_rate:.1%} of prompt tokens from cache, round-robin "
             f"{rr.prefix_hit_rate:.1%}; its P50 TTFT is {hits.latency('ttft', 50) * 1000:.0f} ms against "
             f"{rr.latency('ttft', 50) * 1000:.0f} ms ({ttft_word}).",
             [("the best router has more prefix hits than round-robin", hits.prefix_hit_rate > rr.prefix_hit_rate),
              ("the TTFT comparison word matches the numbers",
               (ttft_word == "lower") == (hits.latency("ttft", 50) < rr.latency("ttft", 50)))])
    """),
    md("""
    **Load imbalance** is the busiest replica's busy time over the mean (1.0 = perfectly even). Cache affinity can trade
    balance for hits; the load-balance threshold is what keeps a popular prefix from overloading one replica (SGLang's
    reason for it).

    ## The real router
    The routers above are rules in a simulator. A real fleet runs them in a router process in front of real engines:
    `python -m minengine fleet-serve` starts `minengine serve` replicas behind **vLLM's router** (`vllm-router`, a Rust
    service). Does the simulator place requests as that router does, and hit the caches as those replicas do?

    Below, 2 replicas of the bundled model run behind the router's `cache_aware` policy (the **cache-aware** rule above,
    with its thresholds and its record of what it sent where). The same requests then run on the simulated **twin**: 2
    replicas with the real ones' engine settings (read from their step feed), the bundled model's shape, and a clock
    fitted to a few measured steps of one replica (`measure_step_costs`: each step's FLOPs and bytes against its
    measured seconds). The requests are the Mooncake trace's requests that start with its 4 most re-sent blocks
    (conversations that re-send their history, so placement decides the hits), as text, their arrivals stretched for
    CPU replicas. The `openai` client measures each request's time to first token; each replica's own steps say which
    requests it ran and how many prompt tokens its prefix cache held (`minengine.fleet.replay`). Every process of the
    fleet is stopped at the end of the cell.
    """),
    conclusion("""
    import contextlib
    import io
    import random
    import statistics

    import psutil
    from transformers import AutoTokenizer

    from minengine.config import BUNDLED_MODEL
    from minengine.entrypoints.fleet_serve import Fleet, FleetArgs, free_ports
    from minengine.fleet.replay import (measure_step_costs, replay_through_router, replica_steps, shared_prefix_requests,
                                        simulate_window, text_window, twin_config)
    from minengine.timing.model_shape import ModelShape

    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    if HAVE_TRACES:   # token ids in the bundled model's 2,048-token vocabulary, 16 tokens per 512-token block
        pool = load_mooncake_trace(mooncake_path(data), length_scale=1 / 32)
        picked = shared_prefix_requests(pool, 4, pool.tokens_per_hash_block, pick(32, 24))
    else:   # 4 shared 256-token heads, one request every 1.5 s
        rng = random.Random(2)
        heads = [[rng.randrange(3, 2048) for _ in range(256)] for _ in range(4)]
        picked = [TraceRequest(1.5 * i, 288, 4, heads[i % 4] + [rng.randrange(3, 2048) for _ in range(32)], f"shared-{i}")
                  for i in range(pick(32, 24))]
    span = picked[-1].arrival_time - picked[0].arrival_time
    requests = text_window(picked, tokenizer, time_scale=pick(40, 30) / span, max_tokens=16)
    shape = ModelShape.from_hf_config(BUNDLED_MODEL, dtype_bytes=4)   # serve runs float32
    args = FleetArgs([BUNDLED_MODEL, "--uvicorn-log-level", "warning"], num_replicas=2, port=free_ports(3),
                     policy="cache_aware", router_log_level="warning")
    with contextlib.redirect_stdout(io.StringIO()), Fleet(args) as real_fleet:   # the router's start-up lines go nowhere
        pids = real_fleet.pids()
        costs = measure_step_costs(real_fleet.worker_urls[0], shape)
        engine_info = replica_steps(real_fleet.worker_urls[0])[0]
        real = replay_through_router(real_fleet.url, real_fleet.worker_urls, requests)
    alive = []
    for pid in pids:   # the router, the replicas and their children: all gone once the `with` block has closed
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
    twin = simulate_window(requests, twin_config(engine_info, costs.hardware, shape, 2, "cache-aware"))
    print(f"{len(requests)} requests, {sum(len(r.prompt_token_ids) for r in requests):,} prompt tokens over {requests[-1].arrival_s:.0f} s; "
          f"the twin's clock fits {len(costs.points)} measured steps with R^2 {costs.r2:.2f} (median error {costs.median_relative_error:.0%})")
    for name, r in (("real (vllm-router cache_aware)", real), ("simulated (cache-aware)", twin)):
        print(f"{name:31s} requests per replica {r.requests_per_replica()} | prefix hit rate {r.prefix_hit_rate:6.1%} | "
              f"TTFT P50 {r.ttft_percentile(50) * 1000:5.0f} ms, P90 {r.ttft_percentile(90) * 1000:5.0f} ms")
    real_split, twin_split = sorted(real.requests_per_replica(), reverse=True), sorted(twin.requests_per_replica(), reverse=True)
    split_word = "the same split" if real_split == twin_split else "different splits"
    same_hits = sum(x.cached_tokens == y.cached_tokens for x, y in zip(real.records, twin.records))
    gap = statistics.median(x.ttft_s - y.ttft_s for x, y in zip(real.records, twin.records))
    gap_text = (f"{gap * 1000:.0f} ms above the twin's: HTTP, the router, tokenizing and the server's event loop, which the simulator does not model"
                if gap > 0 else f"{-gap * 1000:.0f} ms below the twin's: the fitted clock is slower than the replicas were")
    conclude(f"Real and simulated, the {len(requests)} requests went to the two replicas as **{' / '.join(map(str, real_split))}** and "
             f"**{' / '.join(map(str, twin_split))}** (busiest first: {split_word}); the real replicas' caches served "
             f"**{real.prefix_hit_rate:.1%}** of prompt tokens, the twin's **{twin.prefix_hit_rate:.1%}**, the same hit for {same_hits} of "
             f"{len(requests)} requests. For the median request the client's time to first token is {gap_text}.",
             [("every request ran on exactly one replica, real and simulated",
               sum(real_split) == sum(twin_split) == len(requests) == len(real.records)),
              ("the split word matches the counts", (split_word == "the same split") == (real_split == twin_split)),
              ("the same-hit count matches the records", same_hits == sum(x.cached_tokens == y.cached_tokens for x, y in zip(real.records, twin.records))),
              ("the gap's direction matches the numbers", (gap > 0) == gap_text.split(" ms ")[1].startswith("above")),
              ("every process of the fleet has exited", not alive)])
    """),
    md("""
    The router does not ask the replicas what they cache: its record is of what it *sent*, kept as a radix tree of the
    prompts' characters; the twin keeps it as the prompts' 16-token block hashes, so a match there counts whole KV
    blocks. Where both place a request alike, the replica's cache gives the same hit: the engine is the same. The clock is
    fitted to steps measured on a shared CPU, and the client's time includes what happens outside the engine's steps,
    so times agree less closely than placements. `python benchmarks/fleet_vs_router.py` compares round-robin,
    power-of-two and cache-aware this way (the project's manual, docs/fleet.md, *The simulator against the real router*,
    shows its table and explains the differences).

    ## One KV cache for the whole fleet: the Mooncake store
    However well a router places requests, each replica's prefix cache holds only what *that* replica computed, in
    its own HBM (a few hundred thousand tokens), and a conversation's next turn often lands elsewhere. How much could be
    served at most? The **infinite-cache ideal** of a trace: walk its requests in arrival order and count the leading
    blocks of each prompt that some earlier prompt already had (`infinite_cache_hits`, with the engine's 16-token blocks
    and chained hashes).

    Mooncake (Qin et al., FAST 2025) pools the GPU nodes' idle **CPU DRAM (and SSD)** into one KV store: every
    replica writes its prompts' full blocks there (over PCIe, into its own node), and a replica that misses a prefix
    locally can **load** it from the store (from its own node over PCIe, from another node over RDMA) instead of
    recomputing it, *when the load is cheaper*. The fleet's `KVStoreConfig` models exactly that: capacity per node
    (LRU per node: DRAM, then an optional SSD tier), the same block hashes as the engine, and link time for every
    load and write. Loaded blocks enter the replica's prefix cache through its `BlockPool`, so the engine's scheduler
    admits the request with them as an ordinary local prefix hit.

    Mooncake's **conductor** router then scores each replica by the TTFT it would give: its queueing time plus the
    prefill of what its cache lacks, or the load of what the store holds (overlapping the queue) plus the prefill
    of the rest: local hit + store hit - queue, in modelled seconds.
    """),
    conclusion("""
    ideal = infinite_cache_hits(mooncake, 16, FleetConfig().max_model_len)
    store = KVStoreConfig()  # 1 TB of DRAM per 8-GPU node: the 4 replicas share one node
    shared = {name: simulate(mooncake, FleetConfig.colocated(4, router=name, kv_store=store)) for name in ("round-robin", "conductor")}
    runs = {"prefix-aware, per-replica": routers["prefix-aware"], "conductor, per-replica": routers["conductor"],
            "round-robin + store": shared["round-robin"], "conductor + store": shared["conductor"]}
    for name, r in runs.items():
        mean = sum(m.ttft for m in r.request_metrics.values()) / len(r.request_metrics)
        print(f"{name:27s} hits {r.prefix_hit_rate:6.1%} (from the store {r.store_hit_rate:5.1%}) | mean TTFT {mean * 1000:6.0f} ms, "
              f"P99 {r.latency('ttft', 99) * 1000:6.0f} ms | loaded {r.store.loaded_bytes / 1e9 if r.store else 0:6.1f} GB")
    fleet_viz.prompt_sources_figure(runs, ideal.hit_rate).show()
    fleet_viz.fleet_lanes_figure(shared["conductor"], "kv").show()
    best = shared["conductor"]
    def mean_ttft(r):
        return sum(m.ttft for m in r.request_metrics.values()) / len(r.request_metrics)
    word = "lower" if mean_ttft(best) < mean_ttft(routers["conductor"]) else "not lower"
    conclude(f"The window's infinite-cache ideal is **{ideal.hit_rate:.1%}** of prompt tokens. Per-replica caches serve "
             f"{routers['prefix-aware'].prefix_hit_rate:.1%} (prefix-aware) and {routers['conductor'].prefix_hit_rate:.1%} (conductor); "
             f"with the store the conductor serves **{best.prefix_hit_rate:.1%}** ({best.prefix_hit_rate / max(ideal.hit_rate, 1e-9):.0%} of the ideal, "
             f"{best.store_hit_rate:.1%} loaded from the store), and its mean TTFT is {word}: {mean_ttft(best) * 1000:.0f} ms against "
             f"{mean_ttft(routers['conductor']) * 1000:.0f} ms.",
             [("no run serves more than the infinite-cache ideal", all(r.prefix_hit_rate <= ideal.hit_rate + 1e-9 for r in runs.values())),
              ("the store serves at least what the replicas' own caches do", best.prefix_hit_rate >= routers["conductor"].prefix_hit_rate),
              ("the TTFT word matches the numbers", (word == "lower") == (mean_ttft(best) < mean_ttft(routers["conductor"])))])
    """),
    md("""
    The last rows of the lanes are the store: its DRAM filling up over the run. On this short window there is little
    to reuse: a conversation's earlier turns mostly lie outside it. How much does the whole trace reuse? Its ideal
    needs no simulation, only the walk over its prompts; at one 16-token KV block per hash block of the trace
    (`length_scale=1/32`) its prompts are short enough to walk here in seconds.
    """),
    conclusion("""
    if HAVE_TRACES:
        whole = load_mooncake_trace(mooncake_path(data), length_scale=1 / 32, vocab_size=LLAMA_3_8B.vocab_size)
    else:
        whole = mooncake
    whole_ideal = infinite_cache_hits(whole, 16)
    more = "more than" if whole_ideal.hit_rate > ideal.hit_rate else "no more than"
    conclude(f"The whole trace ({len(whole):,} requests) has an infinite-cache ideal of **{whole_ideal.hit_rate:.1%}** of prompt "
             f"tokens ({whole_ideal.num_requests_hit:,} requests hit): {more} the {ideal.hit_rate:.1%} of this chapter's window of "
             f"{len(mooncake):,} requests.",
             [("the comparison word matches the numbers", (more == "more than") == (whole_ideal.hit_rate > ideal.hit_rate)),
              ("the ideal counts only prompt tokens", 0 <= whole_ideal.hit_tokens <= whole_ideal.prompt_tokens)])
    """),
    md("""
    `python benchmarks/fleet.py --only store` runs the whole Mooncake trace at full length (the ideal
    it reports is at the engine's 16-token blocks, so it can differ a little from the one above), where the store's
    share of the ideal is the question, and the Azure trace, which shares no prefix, so the store serves nothing there
    and only costs its writes.

    **When does fetching beat recomputing?** Recomputing a token of the prefix costs its FLOPs: about 2 FLOPs per
    weight of the layers, plus attention over the context before it (4 x layers x query heads x head size per key),
    which the cost model runs at its own, lower efficiency (`attention_efficiency`, FlashAttention-2's share of the
    peak). Fetching it costs its KV bytes over the link. Both are per token, so the answer is a ratio that depends on the
    model, the GPU, the link and the context, not on the prefix length (the link's latency is paid once per load).
    """),
    conclusion("""
    model = StepCostModel("h100", "llama-3-8b")
    contexts = [0, 2000, 8000, 32000, 128000]
    fig = go.Figure()
    for key in ("nvlink", "ib-400g", "ethernet-100g"):
        link = LINKS[key]
        fetch_s = LLAMA_3_8B.kv_bytes_per_token / (link.bandwidth * link.efficiency)
        fig.add_trace(go.Scatter(x=contexts, y=[model.cost(StepWork.of([(1, c, 0)])).compute_time_s / fetch_s for c in contexts],
                                 mode="lines+markers", name=link.name))
    fig.add_hline(y=1, line_dash="dash", annotation_text="break-even")
    fig.update_layout(title="Recompute time / fetch time of one token's KV (modelled H100, Llama-3-8B)", xaxis_title="context before the token (tokens)",
                      yaxis_title="x faster to fetch", yaxis_type="log")
    fig.show()
    per_token_s = model.cost(StepWork.of([(1, 0, 0)])).compute_time_s
    breakeven = LLAMA_3_8B.kv_bytes_per_token / per_token_s
    conclude(f"On an H100 (at its modelled {HARDWARE['h100'].mfu:.0%} MFU) a Llama-3-8B token costs {per_token_s * 1e6:.1f} us of compute at context 0, its "
             f"{LLAMA_3_8B.kv_bytes_per_token // 1024} KiB of KV {LLAMA_3_8B.kv_bytes_per_token / LINKS['ib-400g'].bandwidth * 1e6:.1f} us over 400 Gb/s "
             f"InfiniBand: fetching pays on any link faster than **{breakeven / 1e9:.1f} GB/s**, and more so with a longer context (attention grows with it).",
             [("InfiniBand is faster than the break-even bandwidth", LINKS["ib-400g"].bandwidth > breakeven),
              ("a longer context makes recomputing dearer", model.cost(StepWork.of([(1, 32000, 0)])).compute_time_s > per_token_s)])
    """),
    md("""
    ## Disaggregation: prefill here, decode there
    A long prefill in the same step as other requests' decodes stalls them (chapter 4): prefill-decode **interference**.
    DistServe and Splitwise put prefill and decode on different GPUs, so decodes never wait for a prefill; the price is
    moving each prompt's KV cache from the prefill GPU to the decode GPU. Its size is the prompt length times the KV
    bytes per token: 2 (K and V) x layers x KV heads x head size x bytes per value.
    """),
    conclusion("""
    kv = LLAMA_3_8B.kv_bytes_per_token
    print(f"Llama-3-8B: 2 x {LLAMA_3_8B.num_layers} layers x {LLAMA_3_8B.num_kv_heads} KV heads x {LLAMA_3_8B.head_dim} x "
          f"{LLAMA_3_8B.dtype_bytes} bytes = {kv:,} bytes per token")
    for name, link in LINKS.items():
        if math.isfinite(link.bandwidth):
            print(f"{link.name:24s} a 1,000-token prompt ({1000 * kv / 1e6:.0f} MB) in {link.transfer_time(1000 * kv) * 1000:6.2f} ms")
    prefill_ms = StepCostModel("h100", "llama-3-8b").cost(StepWork.of([(1000, 0, 1)])).time_s * 1000
    ib_share = LINKS["ib-400g"].transfer_time(1000 * kv) / (prefill_ms / 1000)
    eth_share = LINKS["ethernet-100g"].transfer_time(1000 * kv) / (prefill_ms / 1000)
    conclude(f"Prefilling those 1,000 tokens takes {prefill_ms:.1f} ms on an H100: over 400 Gb/s InfiniBand the transfer "
             f"adds {ib_share:.0%} of it, over 100 Gb/s Ethernet {eth_share:.0%}.",
             [("Ethernet (4x less bandwidth) adds about 4x what InfiniBand adds", abs(eth_share / ib_share - 4) < 0.1),
              ("a 1,000-token prompt is 128 KiB per token", kv == 128 * 1024)])
    """),
    md("""
    In the fleet, a finished prefill sends its KV to the decode replica the decode router picks; each replica sends and
    receives one transfer at a time. The decode replica admits the request only when its KV has arrived **and** its
    blocks are free: the engine's scheduler takes it as a request whose first `prompt_len` tokens are already computed
    (`num_external_computed_tokens`, vLLM's KV-connector idea). Same four GPUs, same load:
    """),
    code("""
    colocated = simulate(busy, FleetConfig.colocated(4))
    disaggregated = simulate(busy, FleetConfig.disaggregated(2, 2, link="ib-400g"))
    for name, r in (("colocated 4", colocated), ("disaggregated 2:2", disaggregated)):
        print(f"{name:18s} P90 TTFT {r.latency('ttft', 90) * 1000:6.0f} ms | P90 TPOT {r.latency('tpot', 90) * 1000:5.1f} ms | "
              f"P99 ITL {r.latency('itl', 99) * 1000:6.1f} ms")
    fleet_viz.fleet_lanes_figure(disaggregated, "queue").show()
    """),
    md("""
    ## Goodput: who wins depends on the SLO
    DistServe's **goodput** is the highest request rate at which the SLO attainment target holds. DistServe's target is
    90 % of requests within the bounds; `max_goodput` checks it per metric, as DistServe's figures state their SLOs: the
    run's P90 TTFT and P90 TPOT within their bounds (`PercentileSLO`). It is the one goodput of this chapter (code,
    text and figures). `max_goodput` compresses the trace's arrivals by a factor k and searches the highest k that
    passes. Two SLOs: a *chatbot* one (DistServe's: TTFT 250 ms, TPOT 100 ms) and a *tight TPOT* one (1.5x one
    unloaded decode step).
    """),
    conclusion("""
    step_s = StepCostModel("h100", "llama-3-8b").cost(StepWork.of([(1, 1000, 1)])).time_s
    SLOS = {"chatbot": PercentileSLO(ttft_s=0.25, tpot_s=0.1), "tight TPOT": PercentileSLO(ttft_s=0.25, tpot_s=round(1.5 * step_s, 3))}
    window = azure[:120]
    splits = pick((1, 2, 3), (2,))
    layouts = {"colocated 4": FleetConfig.colocated(4)} | {f"disaggregated {p}:{4 - p}": FleetConfig.disaggregated(p, 4 - p) for p in splits}
    goodputs = {}
    for slo_name, slo in SLOS.items():
        for name, config in layouts.items():
            goodputs[slo_name, name] = max_goodput(window, config, slo, start_multiplier=8.0, rel_tol=0.2, max_probes=5)
            g = goodputs[slo_name, name]
            print(f"{slo_name:10s} ({slo}) {name:18s} goodput {g.goodput:6.2f} req/s = {g.per_gpu:5.2f} per GPU")
    best = {s: max((n for n in layouts), key=lambda n: goodputs[s, n].goodput) for s in SLOS}
    fig = go.Figure([go.Bar(name=s, x=list(layouts), y=[goodputs[s, n].goodput for n in layouts]) for s in SLOS])
    fig.update_layout(title="DistServe goodput of 4 modelled H100s (Llama-3-8B) on the Azure window",
                      yaxis_title="goodput (req/s): highest rate at which P90 TTFT and P90 TPOT hold", barmode="group")
    fig.show()
    gain = {s: goodputs[s, best_dis].goodput / goodputs[s, "colocated 4"].goodput
            for s in SLOS for best_dis in [max((n for n in layouts if n != "colocated 4"), key=lambda n: goodputs[s, n].goodput)]}
    pays = {s: gain[s] > 1 for s in SLOS}   # the best disaggregated layout beats colocated 4 under this SLO
    VERDICTS = {(True, True): "disaggregation pays under both SLOs, " + ("more under the tight TPOT bound: DistServe's direction"
                                                                         if gain["tight TPOT"] > gain["chatbot"] else
                                                                         "but not more under the tight TPOT bound, unlike DistServe's direction"),
                (True, False): "disaggregation pays only under the tight TPOT bound: DistServe's direction",
                (False, True): "disaggregation pays only under the chatbot SLO, unlike DistServe's direction",
                (False, False): "colocated wins under both SLOs: on this window, disaggregation does not pay"}
    verdict = VERDICTS[pays["tight TPOT"], pays["chatbot"]]
    conclude(" ".join(f"Under the **{s}** SLO the best layout is **{best[s]}** ({goodputs[s, best[s]].goodput:.2f} req/s; colocated "
                  f"{goodputs[s, 'colocated 4'].goodput:.2f})." for s in SLOS)
         + f" The best disaggregated fleet serves {gain['tight TPOT']:.2f}x the colocated goodput under the tight TPOT bound and "
           f"{gain['chatbot']:.2f}x under the chatbot SLO: {verdict}.",
         [("each SLO's best layout has the highest goodput", all(goodputs[s, best[s]].goodput >= goodputs[s, n].goodput
                                                                 for s in SLOS for n in layouts)),
          ("disaggregation is said to pay exactly where its best layout's goodput beats colocated's",
           all(pays[s] == (max(goodputs[s, n].goodput for n in layouts if n != "colocated 4") > goodputs[s, "colocated 4"].goodput)
               for s in SLOS)),
          ("the best layout is colocated exactly where disaggregation does not pay",
           all((best[s] == "colocated 4") == (not pays[s]) or gain[s] == 1 for s in SLOS))])
    """),
    md("""
    DistServe reports its largest gains when the TPOT bound is tight, where prefill-decode interference rather than compute
    limits a colocated engine; Sarathi-Serve argues that chunked prefill (minengine's default) removes much of that
    interference without splitting the GPUs. DistServe searches the split per SLO; Splitwise sizes its pools per workload.
    This window is short (a burst, not a steady state): `python benchmarks/fleet.py` runs the comparison at 2, 4 and 8 GPUs
    on longer windows.

    ## Capacity planning
    How many GPUs does this traffic need at k times its rate? `min_replicas` searches the fewest replicas whose run meets
    the SLO (doubling, then bisection).
    """),
    conclusion("""
    plan = {}
    for k in pick((1.0, 8.0, 32.0), (1.0, 16.0)):
        plan[k] = min_replicas(speed_up(window, k), lambda n: FleetConfig.colocated(n), SLOS["chatbot"], start=1)
        print(f"{k:g}x ({window.mean_rate * k:.1f} req/s): {plan[k].num_replicas} H100s (probes: "
              f"{[(int(p.value), p.passed) for p in plan[k].probes]})")
    ks = sorted(plan)
    conclude(f"At {ks[0]:g}x the trace needs **{plan[ks[0]].num_replicas}** H100s, at {ks[-1]:g}x **{plan[ks[-1]].num_replicas}**: "
             "more traffic never needs fewer GPUs, and each answer is the smallest count whose simulated run met the SLO.",
             [("the replica count never falls as the rate grows",
               all(plan[a].num_replicas <= plan[b].num_replicas for a, b in zip(ks, ks[1:]))),
              ("each answer passed and one fewer failed (or it is 1)",
               all(any(p.passed and int(p.value) == plan[k].num_replicas for p in plan[k].probes)
                   and (plan[k].num_replicas == 1 or any(not p.passed and int(p.value) == plan[k].num_replicas - 1
                                                          for p in plan[k].probes)) for k in ks))])
    """),
    md("## Try it: a fleet of your own"),
    code("""
    import ipywidgets as widgets


    def fleet_experiment(gpus=4, layout="colocated", prefill_share=0.5, router="least-outstanding-tokens", link="ib-400g", rate=4.0):
        if layout == "colocated":
            config = FleetConfig.colocated(gpus, router=router)
        else:
            p = min(gpus - 1, max(1, round(gpus * prefill_share)))
            config = FleetConfig.disaggregated(p, gpus - p, router=router, link=link)
        result = simulate(speed_up(window, rate), config)
        print(result.describe())
        fleet_viz.fleet_lanes_figure(result, "kv").show()


    widgets.interact_manual(fleet_experiment, gpus=widgets.IntSlider(value=4, min=2, max=16),
                            layout=["colocated", "disaggregated"], prefill_share=widgets.FloatSlider(value=0.5, min=0.1, max=0.9, step=0.1),
                            router=list(ROUTERS), link=[k for k in LINKS if k != "infinite"],
                            rate=widgets.FloatSlider(value=4.0, min=0.5, max=16.0, step=0.5))
    """),
    *exercise(1, """
        How many **milliseconds** does it take to move the KV cache of a 2,000-token Llama-3-8B prompt (BF16) over
        100 Gb/s Ethernet (12.5 GB/s)? Count K and V in every layer; the link's fixed latency is negligible.
        """, "Bytes per token: 2 x num_layers x num_kv_heads x head_dim x dtype_bytes (`LLAMA_3_8B` has them). Bytes / (bytes per second) = seconds.", "answer_1",
        """
        bytes_per_token = 2 * LLAMA_3_8B.num_layers * LLAMA_3_8B.num_kv_heads * LLAMA_3_8B.head_dim * LLAMA_3_8B.dtype_bytes
        answer_1 = 2000 * bytes_per_token / 12.5e9 * 1000
        """,
        """
        check_close("Exercise 1: KV transfer time (ms)", answer_1, LINKS["ethernet-100g"].transfer_time(2000 * LLAMA_3_8B.kv_bytes_per_token) * 1000,
                    rel_tol=0.02, hint="K and V, every layer, 2 bytes each; 100 Gb/s is 12.5 GB/s, not 100 GB/s")
        """, wrong=["answer_1 = 2000 * LLAMA_3_8B.kv_bytes_per_token / 2 / 12.5e9 * 1000  # K only",
                    "answer_1 = 2000 * LLAMA_3_8B.kv_bytes_per_token / 100e9 * 1000  # bits read as bytes",
                    "answer_1 = 2000 * LLAMA_3_8B.kv_bytes_per_token / 12.5e9  # seconds",
                    "answer_1 = 2000 * LLAMA_3_8B.kv_bytes_per_token / LLAMA_3_8B.num_layers / 12.5e9 * 1000  # one layer",
                    "answer_1 = 2000 * LLAMA_3_8B.kv_bytes_per_token * 8 / 12.5e9 * 1000  # bytes read as bits"]),
    *exercise(2, """
        Compute the **load imbalance** of the 4-replica run `fleet` yourself: the busiest replica's busy time over the mean
        busy time (`fleet.replicas[i].busy_time_s`, seconds).
        """, "max(busy) / (sum(busy) / len(busy)).", "answer_2",
        """
        busy_times = [r.busy_time_s for r in fleet.replicas]
        answer_2 = max(busy_times) / (sum(busy_times) / len(busy_times))
        """,
        """
        check_close("Exercise 2: load imbalance", answer_2, fleet.load_imbalance(), rel_tol=1e-6, hint="max over MEAN, not over min")
        """, wrong=["answer_2 = max(r.busy_time_s for r in fleet.replicas) / min(r.busy_time_s for r in fleet.replicas)  # over min",
                    "answer_2 = sum(r.busy_time_s for r in fleet.replicas) / len(fleet.replicas) / max(r.busy_time_s for r in fleet.replicas)  # inverted",
                    "answer_2 = max(r.busy_time_s for r in fleet.replicas) - min(r.busy_time_s for r in fleet.replicas)  # a difference"]),
    *exercise(3, """
        Write `fetch_speedup(shape, hardware, link, context)`: how many times faster **fetching** one prompt token's KV
        over `link` is than **recomputing** it on `hardware`, for the model `shape`, when `context` tokens come before it.
        Recompute: the layers' FLOPs (2 per weight of the transformer layers, `shape.num_layer_params`) at
        `hardware.peak_flops x hardware.mfu`, plus attention's (4 x `num_layers` x `num_heads` x `head_dim` per key,
        and it attends to `context + 1` keys) at `hardware.peak_flops x hardware.attention_efficiency` (a preset
        without one, the CPU's, runs attention at `mfu` too). Fetch: its KV bytes at `link.bandwidth x link.efficiency` (bytes/s; the
        latency is paid once per load, leave it out). The check tries several models, GPUs, links and contexts.
        """, "A prefix token only runs the layers: no embedding FLOPs and no LM head (it samples nothing). KV bytes per token: K and V, every layer, the KV heads (not the query heads).", "answer_3",
        """
        def fetch_speedup(shape, hardware, link, context):
            layer_s = 2 * shape.num_layer_params / (hardware.peak_flops * hardware.mfu)
            attention_flops = 4 * shape.num_layers * shape.num_heads * shape.head_dim * (context + 1)
            attention_s = attention_flops / (hardware.peak_flops * (hardware.attention_efficiency or hardware.mfu))
            recompute_s = layer_s + attention_s
            kv_bytes = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * shape.dtype_bytes
            fetch_s = kv_bytes / (link.bandwidth * link.efficiency)
            return recompute_s / fetch_s


        answer_3 = fetch_speedup
        """,
        """
        TE = KVLink("Mooncake Transfer Engine, 87 % of 4 x 200 Gb/s", 100e9, efficiency=0.87)
        CPU_LINK = KVLink("CPU memory", HARDWARE["cpu"].host_link_bandwidth)
        FETCH_CASES = []
        for shape, hw, link, context in [("llama-3-8b", "h100", LINKS["ib-400g"], 0), ("llama-3-8b", "h100", LINKS["ib-400g"], 32000),
                                         ("qwen2.5-7b", "a100", LINKS["ethernet-100g"], 4000), ("llama-3-70b", "h100", TE, 16000),
                                         ("llama-3-8b", "cpu", CPU_LINK, 1000), ("llama-3-70b", "l4", LINKS["nvlink"], 0)]:
            recompute_s = StepCostModel(hw, shape).cost(StepWork.of([(1, context, 0)])).compute_time_s  # the engine's cost model
            fetch_s = MODEL_SHAPES[shape].kv_bytes_per_token / (link.bandwidth * link.efficiency)
            FETCH_CASES.append(((MODEL_SHAPES[shape], HARDWARE[hw], link, context), recompute_s / fetch_s))
        check_function("Exercise 3: fetch vs recompute", answer_3, FETCH_CASES, rel_tol=0.02,
                       hint="layer weights only (no embedding, no LM head) at mfu, attention over context + 1 keys at attention_efficiency, KV heads, K and V")
        """, wrong=[
            "answer_3 = lambda s, hw, l, c: 2 * s.num_params / (hw.peak_flops * hw.mfu) / (s.kv_bytes_per_token / (l.bandwidth * l.efficiency))  # no attention, embedding + LM head counted",
            "answer_3 = lambda s, hw, l, c: (2 * s.num_layer_params + 4 * s.num_layers * s.num_heads * s.head_dim * (c + 1)) / (hw.peak_flops * hw.mfu) / (s.kv_bytes_per_token / (l.bandwidth * l.efficiency))  # attention at the GEMMs' mfu",
            "answer_3 = lambda s, hw, l, c: (2 * s.num_layer_params / (hw.peak_flops * hw.mfu) + 4 * s.num_layers * s.num_heads * s.head_dim * (c + 1) / (hw.peak_flops * (hw.attention_efficiency or hw.mfu))) / (2 * s.num_layers * s.num_heads * s.head_dim * s.dtype_bytes / (l.bandwidth * l.efficiency))  # query heads, not KV heads",
            "answer_3 = lambda s, hw, l, c: (2 * s.num_layer_params + 4 * s.num_layers * s.num_heads * s.head_dim * (c + 1)) / hw.peak_flops / (s.kv_bytes_per_token / 2 / (l.bandwidth * l.efficiency))  # no efficiencies and K only: they would cancel at 50 % on every kernel",
            "answer_3 = lambda s, hw, l, c: (2 * s.num_layer_params / (hw.peak_flops * hw.mfu) + 4 * s.num_layers * s.num_heads * s.head_dim * (c + 1) / (hw.peak_flops * (hw.attention_efficiency or hw.mfu))) / (s.kv_bytes_per_token / l.bandwidth)  # link efficiency ignored",
            "answer_3 = lambda s, hw, l, c: (s.kv_bytes_per_token / (l.bandwidth * l.efficiency)) / (2 * s.num_layer_params / (hw.peak_flops * hw.mfu) + 4 * s.num_layers * s.num_heads * s.head_dim * (c + 1) / (hw.peak_flops * (hw.attention_efficiency or hw.mfu)))  # inverted",
            "answer_3 = lambda s, hw, l, c: (2 * s.num_layer_params / (hw.peak_flops * hw.mfu) + 4 * s.num_layers * s.num_heads * s.head_dim * (c + 1) / (hw.peak_flops * (hw.attention_efficiency or hw.mfu))) / (s.kv_bytes_per_token * 8 / (l.bandwidth * l.efficiency))  # bandwidth read as bits/s",
        ]),
    *exercise(4, """
        DistServe compares systems by goodput **per GPU**. What is the per-GPU goodput (requests/s per GPU) of the
        *disaggregated 2:2* fleet under the tight TPOT SLO? Use `goodputs["tight TPOT", "disaggregated 2:2"]`, whose
        `.multiplier` is the highest speed-up that met the SLO and `.base_rate` the window's own rate (req/s).
        """, "Goodput = multiplier x base rate; then divide by the GPUs of the whole fleet (prefill and decode).", "answer_4",
        """
        g = goodputs["tight TPOT", "disaggregated 2:2"]
        answer_4 = g.multiplier * g.base_rate / 4
        """,
        """
        g = goodputs["tight TPOT", "disaggregated 2:2"]
        check_close("Exercise 4: goodput per GPU", answer_4, g.multiplier * g.base_rate / g.num_gpus, rel_tol=0.01,
                    hint="multiply the speed-up by the trace's rate, and count all 4 GPUs")
        """, wrong=['answer_4 = goodputs["tight TPOT", "disaggregated 2:2"].goodput  # not per GPU',
                    'answer_4 = goodputs["tight TPOT", "disaggregated 2:2"].multiplier / 4  # forgot the base rate',
                    'answer_4 = goodputs["tight TPOT", "disaggregated 2:2"].goodput / 2  # per prefill GPU']),
    *question("why can a fleet simulation drop the tokens but not the scheduler?", """
        Which of a request's numbers change when its output tokens are different but its lengths are the same?
        """, """
        None of the timing ones: the fleet, which drops the tokens, gives every request the metrics the token-computing replay gives (checked: every request's metrics are identical in the fleet and in replay). A step's cost depends on how many tokens it computes and over which contexts (the
        cost model's FLOPs and bytes), and which requests are in the step is decided by the scheduler from lengths,
        budgets and free KV blocks. With `ignore_eos` and `max_tokens` fixed by the trace, the token values reach neither. The scheduler is the opposite: chunking, admission, preemption and prefix hits decide every step's
        batch, so a simulator with a different scheduler simulates a different engine (Vidur re-implements vLLM's and
        must keep it in step). Reusing the engine's own scheduler removes that gap: each request's metrics equal the replay's (checked: every request's metrics are identical in the fleet and in replay).
        """),
    *question("what if the link between prefill and decode were 10x slower?", """
        At what point does disaggregation stop paying, and what would you change first?
        """, """
        The KV transfer adds prompt_len x KV bytes per token / bandwidth to every request's TTFT and occupies the
        sender and receiver while it runs. Over 100 GbE a 1,000-token Llama-3-8B prompt already adds over a third of
        its prefill time; 10x slower, the transfer takes longer than the prefill itself (the cell below computes both),
        and every request's TTFT carries it. Change first what costs most: the link (NVLink within a node, RDMA), then
        the KV bytes per token (GQA, MLA, FP8 KV); or send layer by layer while the prefill still runs (DistServe and
        Mooncake overlap it), or colocate with chunked prefill instead (Sarathi-Serve).
        """),
    code("""
    # The model answer: a 1,000-token prompt's KV over 100 Gb/s Ethernet and over a link 10x slower, against its prefill.
    ethernet = LINKS["ethernet-100g"]
    slow_link = KVLink("10 Gb/s Ethernet", ethernet.bandwidth / 10, latency_s=ethernet.latency_s)
    share = {link.name: link.transfer_time(1000 * kv) / (prefill_ms / 1000) for link in (ethernet, slow_link)}
    for name, x in share.items():
        print(f"{name}: the transfer adds {x:.0%} of the {prefill_ms:.1f} ms prefill")
    claim("over 100 GbE the transfer adds over a third of the prefill", share[ethernet.name] > 1 / 3)
    claim("10x slower, it takes longer than the prefill itself", share[slow_link.name] > 1)
    """),
    *summary([
        "A fleet simulation needs the scheduler, the KV cache and a step-time model, not the tokens: `TokenFreeRunner` + `ModelledClock` turn minengine's own engine into a replica.",
        "A router sees the replicas that can hold a request and their load; SGLang's and Mooncake's cache-aware routing sends a request where its prefix is cached unless the load is imbalanced. Compare routers by prefix-hit rate, TTFT and load imbalance.",
        "A fleet KV store (Mooncake) keeps every replica's prompt blocks in the nodes' DRAM/SSD under the engine's block hashes; a replica loads a stored prefix when the load ends before recomputing it would, and the loaded blocks become an ordinary local prefix hit. Compare the hit share with the trace's infinite-cache ideal.",
        "Fetching beats recomputing when KV bytes per token / link bandwidth < FLOPs per token / achieved FLOP/s: the break-even bandwidth is KV bytes per token over compute seconds per token, and a longer context (more attention FLOPs per token) lowers it (checked: a longer context makes recomputing dearer; InfiniBand is faster than the break-even bandwidth).",
        "Disaggregation moves prompt_len x KV bytes per token (128 KiB per token for Llama-3-8B) per request, milliseconds over InfiniBand; it removes prefill-decode interference (Zhong et al., OSDI 2024).",
        "Goodput (DistServe: the highest request rate at which the SLO attainment target holds; here P90 TTFT and P90 TPOT within their bounds) is the figure of merit for colocated vs disaggregated fleets: compare at equal GPUs, for each SLO, and search the P:D split.",
        "Capacity planning is a search over simulated fleets: the fewest GPUs whose run meets the SLO at the planned rate.",
    ]),
    *glossary([
        ("replica", "副本", "one engine instance (on tp GPUs) of a fleet"),
        ("router", "路由器", "chooses the replica for each request"),
        ("prefix-aware routing", "前缀感知路由", "send a request where its prefix is cached, unless the load is imbalanced"),
        ("load imbalance", "负载不均衡", "busiest replica's busy time over the mean"),
        ("KV store", "KV 存储", "a cluster-wide pool of KV blocks in the nodes' DRAM/SSD (Mooncake)"),
        ("infinite-cache ideal", "无限缓存上限", "the share of prompt tokens an unbounded shared prefix cache would serve"),
        ("conductor", "Conductor 路由（Mooncake）", "routes to the replica with the smallest estimated TTFT: local hit + store hit - queue"),
        ("disaggregated prefill/decode", "预填充/解码分离", "prefill and decode on different GPUs, KV moved between them"),
        ("KV transfer", "KV 传输", "prompt tokens x KV bytes per token over a link"),
        ("goodput", "有效吞吐", "the highest request rate at which the SLO attainment target holds (DistServe; here P90 TTFT and P90 TPOT within their bounds)"),
        ("capacity planning", "容量规划", "fewest GPUs that serve a traffic level within the SLO"),
        ("prefill", "预填充", "computing a prompt's KV cache"),
        ("decode", "解码", "generating one token per step"),
    ]),
]

# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 7: scheduler design and SLOs: TTFT/TPOT/ITL percentiles, goodput, capacity, priority, cancellation."""

from cells import SETUP, code, exercise, glossary, header, md, summary

CELLS = [
    *header(7, "Scheduler design and SLOs", [
        "Define TTFT, TPOT and ITL and compute their P50/P95/P99 from the engine's per-request records.",
        "Replay a real trace (Azure LLM conversation trace) online at several arrival rates; define goodput and find the capacity under a P99 TBT SLO.",
        "Explain why a busy engine (high utilization) can still serve users badly, and what to check when throughput rises but P99 TPOT gets worse.",
        "Use priority, cancellation (abort) and timeouts (deadlines).",
    ], ["Zhong et al., *DistServe: Disaggregating Prefill and Decoding for Goodput-optimized LLM Serving*, OSDI 2024 (goodput)",
        "Agrawal et al., *Sarathi-Serve*, OSDI 2024 (capacity under a P99 TBT SLO)",
        "Patel et al., *Splitwise*, ISCA 2024 (the Azure trace)", "vLLM docs, *Benchmarks* (`benchmark_serving.py` metrics)"]),
    code(SETUP + """\
import math
import statistics

from minengine.metrics.stats import percentile
from minengine.workloads import (SLO, ServingBenchmark, azure_conv_path, find_capacity, find_data_dir, goodput, load_azure_trace,
                                 poisson_arrivals, replay_trace, synthetic_trace, with_arrivals)
"""),
    md("""
    ## The metrics a user feels
    - **TTFT** (time to first token): arrival -> first token; includes queueing and the whole prefill.
    - **TPOT** (time per output token): `(E2E - TTFT) / (n - 1)`, a request's average decode pace.
    - **ITL / TBT** (inter-token latency, time between tokens): every gap between two tokens of one request; its tail
      (P99) is the stutter a user sees while text streams.
    Percentiles are taken over requests (TTFT, TPOT) or over all gaps (ITL). Averages hide the tail, so SLOs are on P99.

    ## A real workload, replayed online
    The Azure LLM inference trace (conversation service, Splitwise ISCA'24) gives real prompt and output lengths; we
    scale them to CPU size and draw Poisson arrivals at the rate we want to test. The replay runs on a **virtual clock**
    (`minengine.workloads.VirtualClock`): time advances by each step's measured duration and skips idle gaps, so queueing
    is real without waiting for it.
    """),
    code("""
    N = pick(48, 16)
    path = azure_conv_path(find_data_dir())
    if path is not None:
        lengths = load_azure_trace(path, max_requests=N, length_scale=1 / 16)
    else:
        lengths = synthetic_trace(N, rate=1.0, prompt_len=64, output_len=16, range_ratio=0.5)
    print(lengths.source, "| prompt tokens", [r.prompt_len for r in lengths][:10], "... | output tokens", [r.output_len for r in lengths][:10], "...")
    CONFIG = dict(model=COURSE_MODEL, max_num_batched_tokens=256, max_num_seqs=16, trace_block_tables=False)

    # Capacity scale of this machine: all requests at once (an offline batch) -> requests per second.
    offline = replay_trace(with_arrivals(lengths, [0.0] * N), **CONFIG)
    r0 = N / offline.summary().duration_s
    print(f"offline batch: {r0:.1f} requests/s")
    """),
    code("""
    def at_rate(rate, seed=0, **overrides):
        return replay_trace(with_arrivals(lengths, poisson_arrivals(rate, N, seed)), **{**CONFIG, **overrides})


    light = at_rate(0.25 * r0)
    s = light.summary()
    print(s.as_table())
    """),
    md("""
    ## SLOs, goodput and capacity
    A **SLO** bounds each request's latency; a request *meets* it when all bounds hold. **Goodput** (DistServe) is the
    rate of requests that met the SLO: throughput that counts only satisfied users. **Capacity** (Sarathi-Serve) is the
    highest arrival rate at which the system still meets a P99 TBT SLO. Our SLO is set from this machine's unloaded
    latencies (a real deployment takes it from the product: e.g. TTFT <= 1 s, P99 TBT <= 100 ms).
    """),
    code("""
    slo = SLO(ttft_s=round(5 * s.ttft_p50, 3), tbt_p99_s=round(3 * s.itl_p50, 3))   # whole milliseconds
    rates = [f * r0 for f in pick([0.25, 0.5, 1.0, 1.5, 2.0, 3.0], [0.25, 1.0, 2.0, 3.0])]
    sweep = {rate: at_rate(rate) for rate in rates}
    rows = []
    for rate, run in sweep.items():
        m = run.request_metrics
        busy = sum(t.duration for t in run.steps) / max(run.summary().duration_s, 1e-9)
        rows.append(dict(rate=rate, goodput=goodput(m, slo), throughput=len(m) / run.summary().duration_s,
                         ttft_p99=run.summary().ttft_p99, itl_p99=run.summary().itl_p99, busy=min(busy, 1.0),
                         tokens_per_step=statistics.fmean(t.num_scheduled_tokens for t in run.steps)))
    print(f"SLO: {slo}")
    for r in rows:
        print(f"rate {r['rate']:6.1f}/s | throughput {r['throughput']:6.1f}/s | goodput {r['goodput']:6.1f}/s | TTFT P99 {r['ttft_p99'] * 1000:8.0f} ms | "
              f"ITL P99 {r['itl_p99'] * 1000:6.1f} ms | busy {r['busy']:.0%}")
    """),
    code("""
    fig = go.Figure([go.Scatter(x=[r["rate"] for r in rows], y=[r["throughput"] for r in rows], name="throughput (req/s)", mode="lines+markers"),
                     go.Scatter(x=[r["rate"] for r in rows], y=[r["goodput"] for r in rows], name="goodput (req/s)", mode="lines+markers"),
                     go.Scatter(x=[r["rate"] for r in rows], y=[r["ttft_p99"] * 1000 for r in rows], name="P99 TTFT (ms)", yaxis="y2", mode="lines+markers")])
    fig.update_layout(title="Throughput, goodput and tail TTFT vs arrival rate", xaxis_title="arrival rate (requests/s)",
                      yaxis_title="requests/s", yaxis2=dict(title="P99 TTFT (ms)", overlaying="y", side="right"))
    fig.show()
    heavy = sweep[rates[-1]]
    viz.queue_figure(heavy.steps).update_layout(title=f"At {rates[-1]:.1f} requests/s: the queue").show()
    """),
    code("""
    top = rows[-1]
    show(f"At {top['rate']:.1f} requests/s the engine is busy **{top['busy']:.0%}** of the time and computes {top['tokens_per_step']:.0f} "
         f"tokens per step on average (budget 256), yet P99 TTFT is **{top['ttft_p99'] * 1000:.0f} ms** and goodput {top['goodput']:.1f}/s "
         f"of {top['throughput']:.1f}/s served: high utilization means a queue, and queueing is latency. "
         f"At {rows[0]['rate']:.1f}/s it was busy {rows[0]['busy']:.0%} with P99 TTFT {rows[0]['ttft_p99'] * 1000:.0f} ms.")
    """),
    md("""
    `find_capacity` searches the highest Poisson rate at which at least 90 % of requests meet the SLO and the median
    queueing delay stays bounded (Sarathi-Serve's method).
    """),
    code("""
    capacity = find_capacity(slo, lengths=lengths, num_requests=N, start_rate=r0 / 2, max_probes=pick(8, 4), **CONFIG)
    for p in capacity.probes:
        print(f"probe {p.rate:6.1f}/s: SLO attainment {p.attainment:.0%}, median queue delay {p.median_queue_delay_s * 1000:.0f} ms -> {'pass' if p.passed else 'fail'}")
    show(f"Capacity under *{slo}*: **{capacity.capacity:.1f} requests/s** on this CPU with budget 256.")
    """),
    md("""
    ## "Total tok/s went up but P99 TPOT got worse: what do you check?"
    A classic. Raise the token budget from 256 to 2,048: steps get bigger, more prefill rides in each step.
    """),
    code("""
    rate = rates[-2]
    small_budget, big_budget = at_rate(rate), at_rate(rate, max_num_batched_tokens=2048)
    bench = {}
    for name, run in (("budget 256", small_budget), ("budget 2048", big_budget)):
        bench[name] = ServingBenchmark.from_metrics(run.request_metrics, slo)
        print(bench[name].as_table(title=name))
    """),
    md("""
    What to check, in order:
    1. **Step composition** (`viz.batch_composition_figure`): are prefill chunks larger now? Bigger steps = longer gaps for every decode in them.
    2. **ITL tail and its causes** (`viz.find_stalls`): which steps produced the slow tokens?
    3. **Queue and admission** (`viz.queue_figure`): more requests running at once means more tokens per step.
    4. **Preemptions and KV usage** (`viz.kv_usage_figure`): recompute preemption re-prefills and stalls.
    5. **Workload shift**: longer prompts or a different mix raise both numbers at once.
    Fixes: a smaller budget or `long_prefill_token_threshold`, decode-first policy, a TBT-driven chunk size (chapter 4).
    """),
    code("""
    viz.batch_composition_figure(big_budget.steps[:60]).update_layout(title="budget 2048: first 60 steps").show()
    """),
    md("""
    ## Priority, cancellation and timeouts
    - **Priority** (`scheduling_policy="priority"`, `add_request(..., priority=...)`; smaller = more urgent, as in vLLM):
      urgent requests are admitted and served first; aging lets a low-priority request win eventually (no starvation).
    - **Cancellation**: `abort_request(id)` finishes a request in any state and frees its blocks at once (a client hung up).
    - **Timeouts**: `add_request(..., deadline=t)` finishes it with reason `"timeout"` when the engine clock passes `t`.
    """),
    code("""
    def urgent_ttft(policy):
        eng = LLMEngine.from_config(model=COURSE_MODEL, max_num_batched_tokens=128, max_num_seqs=4, scheduling_policy=policy)
        for i in range(8):
            eng.add_request(f"bg-{i}", {"prompt_token_ids": [(i * 7 + k) % 2000 + 3 for k in range(200)]},
                            SamplingParams(temperature=0.0, max_tokens=pick(24, 12), ignore_eos=True), priority=1)
        for _ in range(3):
            eng.step()
        eng.add_request("urgent", {"prompt_token_ids": [5] * 32}, SamplingParams(temperature=0.0, max_tokens=4), priority=0)
        run_to_completion(eng)
        return eng.request_metrics["urgent"].ttft


    ttft_fcfs, ttft_priority = urgent_ttft("decode-first"), urgent_ttft("priority")
    show(f"An urgent request behind 8 background requests: TTFT **{ttft_fcfs * 1000:.0f} ms** first-come-first-served, "
         f"**{ttft_priority * 1000:.0f} ms** with the priority policy.")
    """),
    code("""
    eng = LLMEngine.from_config(model=COURSE_MODEL, num_kv_blocks=64)
    eng.add_request("chatty", {"prompt_token_ids": [7] * 100}, SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
    eng.add_request("slow", {"prompt_token_ids": [8] * 40}, SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True),
                    deadline=eng.clock() + 0.05)
    outs = {}
    for _ in range(5):
        outs.update({o.request_id: o for o in eng.step() if o.finished})
    free_before = eng.kv_cache_manager.num_free_blocks
    eng.abort_request("chatty")
    free_after = eng.kv_cache_manager.num_free_blocks
    outs.update(run_to_completion(eng))
    show(f"Aborting `chatty` freed {free_after - free_before} KV blocks at once ({free_before} -> {free_after} free). "
         f"`slow` had a 50 ms deadline and finished with reason **{outs['slow'].outputs[0].finish_reason}** after "
         f"{len(outs['slow'].outputs[0].token_ids)} tokens.")
    """),
    md("## Try it: arrival rate vs latency distribution"),
    code("""
    import ipywidgets as widgets


    def load_test(rate_multiple=1.0):
        run = at_rate(rate_multiple * r0)
        print(f"{rate_multiple * r0:.1f} requests/s: goodput {goodput(run.request_metrics, slo):.1f}/s, SLO attainment "
              f"{sum(1 for m in run.request_metrics.values() if m.ttft <= slo.ttft_s) / N:.0%} on TTFT")
        viz.latency_cdf_figure(run.request_metrics).show()


    widgets.interact_manual(load_test, rate_multiple=widgets.FloatSlider(value=1.0, min=0.25, max=4.0, step=0.25))
    """),
    *exercise(1, """
        Compute the P99 TTFT of the light run (`light.request_metrics`) yourself, with linear interpolation between the two
        nearest ranks (numpy's default). Answer in seconds.
        """, "Sort the TTFTs; k = (n - 1) x 0.99; interpolate between xs[floor(k)] and xs[ceil(k)].", "answer_1",
        """
        xs = sorted(m.ttft for m in light.request_metrics.values())
        k = (len(xs) - 1) * 0.99
        answer_1 = xs[math.floor(k)] + (xs[math.ceil(k)] - xs[math.floor(k)]) * (k - math.floor(k))
        """,
        """
        check_close("Exercise 1: P99 TTFT", answer_1, light.summary().ttft_p99, rel_tol=1e-6)
        """),
    *exercise(2, """
        Goodput of the heaviest run (`heavy`) under `slo`: requests that met every bound, per second of the run (first arrival ->
        last finish). Use `m.ttft` and `percentile(m.itls, 99)`; a request with no ITLs has no TBT to check.
        """, "Count the requests with ttft <= slo.ttft_s and (no itls or P99 of its itls <= slo.tbt_p99_s); divide by the duration.", "answer_2",
        """
        ms = list(heavy.request_metrics.values())
        good = sum(1 for m in ms if m.ttft <= slo.ttft_s and (not m.itls or percentile(m.itls, 99) <= slo.tbt_p99_s))
        answer_2 = good / (max(m.finished_time for m in ms) - min(m.arrival_time for m in ms))
        """,
        """
        check_close("Exercise 2: goodput", answer_2, goodput(heavy.request_metrics, slo), rel_tol=1e-6)
        """),
    *exercise(3, """
        Of the two budgets compared above, which one had the higher **total token throughput**, and which the higher **P99 ITL**?
        Answer a tuple of the two names, e.g. `("budget 256", "budget 2048")`.
        """, "Read `bench[name].total_token_throughput` and `bench[name].latencies['ITL'][2]`.", "answer_3",
        """
        answer_3 = (max(bench, key=lambda k: bench[k].total_token_throughput), max(bench, key=lambda k: bench[k].latencies["ITL"][2]))
        """,
        """
        check("Exercise 3: throughput vs tail", answer_3,
              (max(bench, key=lambda k: bench[k].total_token_throughput), max(bench, key=lambda k: bench[k].latencies["ITL"][2])))
        """),
    *summary([
        "TTFT (queueing + prefill), TPOT (decode pace) and ITL/TBT (every gap) are judged at P99, not on average.",
        "Goodput counts only requests that met the SLO; capacity is the highest arrival rate that still meets it.",
        "Near saturation the engine is busy nearly all the time and tokens per step are high, yet TTFT explodes: the queue grows.",
        "When throughput rises and P99 TPOT worsens, look at step composition, stalls, queue, preemptions and the workload mix.",
        "Priority orders admission and service; abort frees blocks at once; deadlines turn into 'timeout' finishes.",
    ]),
    *glossary([
        ("TTFT", "首令牌时间", "arrival -> first output token"),
        ("TPOT", "每输出令牌时间", "(E2E - TTFT) / (n - 1)"),
        ("ITL / TBT", "令牌间延迟 / 令牌间隔", "gap between two consecutive output tokens"),
        ("SLO", "服务等级目标", "bounds on a request's latencies"),
        ("goodput", "有效吞吐", "requests per second that met the SLO"),
        ("capacity", "容量", "highest arrival rate meeting the SLO"),
        ("P99", "第 99 百分位", "the value 99 % of samples are below"),
        ("priority / aging", "优先级 / 老化", "serve urgent first; waiting improves priority over time"),
        ("cancellation / timeout", "取消 / 超时", "abort a request / finish it past its deadline"),
    ]),
]

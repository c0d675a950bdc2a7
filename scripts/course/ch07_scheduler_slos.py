# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 7: scheduler design and SLOs: TTFT/TPOT/ITL percentiles, goodput, capacity, "throughput up but P99 TPOT
worse", round-robin anti-starvation, which business wants which policy, priority, cancellation, timeouts."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(7, "Scheduler design and SLOs", [
        "Define TTFT, TPOT and ITL and compute their P50/P95/P99 from the engine's per-request records.",
        "Replay a real trace (Azure LLM conversation trace) online at several arrival rates; tell goodput (DistServe: the highest request rate that keeps the SLO attainment target) from one run's good-request rate, and find the capacity under the SLOs.",
        "Explain why utilization cannot tell an engine that keeps up from one that falls behind, and work through \"total tok/s went up but P99 TPOT got worse\": step composition, stalls, slots (`max_num_seqs`), preemptions, fairness, output backlog.",
        "Choose a policy for a business (real-time chat, RAG / batch, multi-tenant), each choice backed by a run; see round-robin stop one long prompt from starving another.",
        "Use priority, cancellation (abort) and timeouts (deadlines).",
        "Schedule shortest-predicted-first with the engine's output-length predictors (oracle, noisy oracle, learned) and measure how good a prediction must be.",
    ], ["Zhong et al., *DistServe: Disaggregating Prefill and Decoding for Goodput-optimized LLM Serving*, OSDI 2024 (goodput)",
        "Agrawal et al., *Sarathi-Serve*, OSDI 2024 (capacity under a P99 TBT SLO)",
        "Patel et al., *Splitwise*, ISCA 2024 (the Azure trace)", "vLLM docs, *Benchmarks* (`benchmark_serving.py` metrics)",
        "Jain, Chiu and Hawe, *A Quantitative Measure of Fairness*, DEC-TR-301, 1984 (Jain's fairness index)",
        "Fu et al., *Efficient LLM Scheduling by Learning to Rank*, NeurIPS 2024", "Jin et al., *S3*, NeurIPS 2023 (predicting output lengths)"]),
    code(SETUP + """\
import dataclasses
import math
import statistics
from collections import Counter

from minengine.course import TEACHING_CLOCK
from minengine.metrics.stats import percentile
from minengine.viz.timeline_figures import token_times
from minengine.workloads import (SLO, ServingBenchmark, azure_conv_path, completed_fraction, find_capacity, find_data_dir, goodput, load_azure_trace, slo_attainment,
                                 poisson_arrivals, replay_trace, synthetic_trace, with_arrivals)
from minengine.workloads.traces import Trace
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
    scale them by 1/4 (the tokens are computed for real on this CPU) and draw Poisson arrivals at the rate we want to
    test. The replay runs on the **modelled clock** (an H100 running Llama-3-8B shapes): time advances by each step's
    modelled duration and skips idle gaps, so queueing is real, deterministic, and at GPU magnitudes.
    """),
    code("""
    N = pick(64, 32)
    path = azure_conv_path(find_data_dir())
    if path is not None:
        lengths = load_azure_trace(path, max_requests=N, length_scale=1 / 4)
    else:
        lengths = synthetic_trace(N, rate=1.0, prompt_len=180, output_len=28, range_ratio=0.5)
    print(lengths.source, "| prompt tokens", [r.prompt_len for r in lengths][:10], "... | output tokens", [r.output_len for r in lengths][:10], "...")
    CONFIG = dict(model=COURSE_MODEL, max_num_batched_tokens=256, max_num_seqs=16, trace_block_tables=False)

    # The capacity scale: all requests at once (an offline batch) -> requests per second.
    offline = replay_trace(with_arrivals(lengths, [0.0] * N), clock=TEACHING_CLOCK, **CONFIG)
    r0 = N / offline.summary().duration_s
    print(f"offline batch: {r0:.1f} requests/s ({offline.clock_label})")
    """),
    code("""
    def at_rate(rate, trace=None, seed=0, **overrides):
        trace = lengths if trace is None else trace
        return replay_trace(with_arrivals(trace, poisson_arrivals(rate, len(trace), seed)), clock=TEACHING_CLOCK, **{**CONFIG, **overrides})


    light = at_rate(0.25 * r0)
    s = light.summary()
    print(s.as_table())
    """),
    md("""
    ## SLOs, goodput and capacity
    A **SLO** bounds each request's latency; a request *meets* it when all bounds hold, and the **SLO attainment** of a
    run is the fraction of its requests that met it. **Goodput** (DistServe, Zhong et al. 2024) is the **highest request
    rate at which the SLO attainment stays at or above a target** (90 % here): one number per deployment, workload and
    SLO, found by searching over arrival rates (below). **Capacity** (Sarathi-Serve) is the same search with one more
    condition: the median scheduling delay stays bounded.

    One run at one rate gives a different number, its **good-request rate**: the requests per second of that run that
    met the SLO. minengine's `goodput(metrics, slo)` and the line "Request goodput (req/s)" of vLLM's
    `benchmark_serving.py` report this per-run rate under the name goodput. In this chapter *goodput* is always
    DistServe's rate limit, and the per-run number is always the *good-request rate*.

    Our SLO is set from the unloaded latencies of this scaled workload (a real deployment takes it from the product:
    e.g. TTFT <= 1 s, P99 TBT <= 100 ms).
    """),
    code("""
    slo = SLO(ttft_s=round(5 * s.ttft_p50, 3), tbt_p99_s=round(3 * s.itl_p50, 3))   # whole milliseconds
    rates = [f * r0 for f in pick([0.25, 0.5, 1.0, 2.0, 3.0], [0.25, 1.0, 3.0])]
    sweep = {rate: light if rate == 0.25 * r0 else at_rate(rate) for rate in rates}   # 0.25 x r0: the light run above, not run again
    rows = []
    for rate, run in sweep.items():
        m = run.request_metrics
        busy = sum(t.duration for t in run.steps) / max(run.summary().duration_s, 1e-9)
        rows.append(dict(rate=rate, good_rate=goodput(m, slo), attainment=slo_attainment(m, slo), throughput=len(m) / run.summary().duration_s,
                         ttft_p99=run.summary().ttft_p99, itl_p99=run.summary().itl_p99, busy=min(busy, 1.0),
                         queue_p50=statistics.median(x.time_in_queue for x in m.values()), most_waiting=max(t.num_waiting for t in run.steps),
                         kept_up=completed_fraction(m, warmup=len(m) // 4), tokens_per_step=statistics.fmean(t.num_scheduled_tokens for t in run.steps)))
    print(f"SLO: {slo}")
    for r in rows:
        print(f"rate {r['rate']:6.1f}/s | throughput {r['throughput']:6.1f}/s | good-request rate {r['good_rate']:6.1f}/s | SLO attainment {r['attainment']:4.0%} | "
              f"TTFT P99 {r['ttft_p99'] * 1000:7.1f} ms | ITL P99 {r['itl_p99'] * 1000:6.1f} ms | busy {r['busy']:.0%} | median queueing {r['queue_p50'] * 1000:5.1f} ms | "
              f"most waiting {r['most_waiting']} | completed/arrived {r['kept_up']:.3f}")
    """),
    code("""
    fig = go.Figure([go.Scatter(x=[r["rate"] for r in rows], y=[r["throughput"] for r in rows], name="throughput (req/s)", mode="lines+markers"),
                     go.Scatter(x=[r["rate"] for r in rows], y=[r["good_rate"] for r in rows], name="good-request rate (req/s)", mode="lines+markers"),
                     go.Scatter(x=[r["rate"] for r in rows], y=[r["ttft_p99"] * 1000 for r in rows], name="P99 TTFT (ms)", yaxis="y2", mode="lines+markers")])
    titled(fig, "Throughput, good-request rate and tail TTFT vs arrival rate")
    fig.update_layout(xaxis_title="arrival rate (requests/s)", yaxis_title="requests/s", yaxis2=dict(title="P99 TTFT (ms)", overlaying="y", side="right", tickmode="auto", showgrid=False),
                      legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0))   # below the plot, clear of the right axis
    fig.show()
    heavy = sweep[rates[-1]]
    titled(viz.queue_figure(heavy.steps), f"At {rates[-1]:.1f} requests/s: the queue").show()
    """),
    conclusion("""
    top, low = rows[-1], rows[0]
    # the highest rate below the top at which every request met the SLO, and the lowest at which the engine was never idle
    all_met = max((r for r in rows[:-1] if r["attainment"] == 1.0), key=lambda r: r["rate"], default=None)
    ceiling = min((r for r in rows[:-1] if r["busy"] >= 0.99), key=lambda r: r["rate"], default=None)
    claim("a rate below the top met the SLO for every request, and one kept the engine busy 99 % of the time", all_met is not None and ceiling is not None)
    ceiling_pace = ("keeping up: at least 95 %" if ceiling["kept_up"] >= 0.95 else "already short of the 95 % that keeping up takes")
    conclude(f"Utilization cannot tell an engine that meets its SLO from one that falls behind. The highest rate of the sweep at which every "
             f"request met the SLO was {all_met['rate']:.1f} requests/s, with the engine busy **{all_met['busy']:.0%}** of the time. "
             f"From {ceiling['rate']:.1f} requests/s on it was busy **{ceiling['busy']:.0%}** (at or above 99 %), and there **{ceiling['attainment']:.0%}** "
             f"of the requests met the SLO: median queueing {ceiling['queue_p50'] * 1000:.1f} ms, at most {ceiling['most_waiting']} waiting, and it completed "
             f"{ceiling['kept_up']:.1%} as many requests as arrived ({ceiling_pace}; counted from the arrival of the first request after the first "
             f"quarter to the last arrival). At {top['rate']:.1f} requests/s it was just as busy (**{top['busy']:.0%}**, {top['tokens_per_step']:.0f} "
             f"tokens per step on average, budget 256), but requests arrived far faster than it completed them (**{top['kept_up']:.0%}** as many "
             f"completed as arrived; {top['throughput']:.1f} requests/s completed): up to {top['most_waiting']} requests waited at once, median queueing "
             f"rose to {top['queue_p50'] * 1000:.1f} ms, P99 TTFT from {ceiling['ttft_p99'] * 1000:.0f} to **{top['ttft_p99'] * 1000:.0f} ms**, and only "
             f"**{top['attainment']:.0%}** met the SLO (a good-request rate of {top['good_rate']:.1f} of the {top['throughput']:.1f} requests/s). Busy "
             f"time was already at its ceiling while the SLO held, so it cannot rise to warn of the overload: watch the queue, completions against "
             f"arrivals and the SLO attainment, not utilization. "
             f"At {low['rate']:.1f}/s the engine was busy {low['busy']:.0%} with P99 TTFT {low['ttft_p99'] * 1000:.0f} ms.",
             [("every request met the SLO at a rate below the top", all_met["attainment"] == 1.0 and all_met["rate"] < top["rate"]),
              ("the ceiling rate is below the top and at least 90 % met the SLO there", ceiling["rate"] < top["rate"] and ceiling["attainment"] >= 0.9),
              ("the pace phrase says what the completions say", ceiling_pace.startswith("keeping up") == (ceiling["kept_up"] >= 0.95)),
              ("the top rate is just as busy", top["busy"] >= 0.99),
              ("at the top rate arrivals outrun completions, more than at the ceiling",
               top["kept_up"] < 0.95 and top["kept_up"] < ceiling["kept_up"] and top["rate"] > top["throughput"]),
              ("the queue grew: more waiting, longer queueing", top["most_waiting"] > ceiling["most_waiting"] and top["queue_p50"] > ceiling["queue_p50"]),
              ("the tail TTFT has grown", top["ttft_p99"] > 1.5 * ceiling["ttft_p99"] and top["ttft_p99"] > 2 * low["ttft_p99"]),
              ("fewer than 90 % met the SLO at the top rate", top["attainment"] < 0.9 <= ceiling["attainment"])])
    """),
    md("""
    `find_capacity` first measures the engine's **maximum throughput** on this workload: a probe's requests all at once,
    completed requests per second. No arrival rate above it can be sustained (the queue grows without end, however well
    the first requests fare), so the search never goes above it. Then it looks for the highest Poisson rate at which at
    least 90 % of the measured requests (the first quarter of each probe, a warm-up, is not counted) meet the SLO,
    their median queueing delay stays bounded (Sarathi-Serve's method), and the engine **sustains** the rate: from the
    first measured arrival to the last arrival it completes at least 95 % as many requests as arrive
    (`completed_fraction`), so its backlog does not grow. A short probe can meet a latency SLO while falling behind:
    its last requests are still queued when it ends, and a 2 s median delay is far above these GPU-scale latencies. It doubles the rate until a probe fails (halves
    it while they fail), then bisects, within `max_probes` probes (5 here, 4 in fast mode). A probe measures a steady
    state only with many requests per running slot (8 per slot by default: 128 requests, full mode); fast mode's probes
    of 32 requests for 16 slots measure a transient, and the result says so.
    """),
    code("""
    capacity = find_capacity(slo, lengths=lengths, num_requests=pick(None, N), max_probes=pick(5, 4), clock=TEACHING_CLOCK, **CONFIG)
    print(f"maximum throughput: {capacity.max_throughput:.1f} requests/s ({capacity.num_requests} requests at once, at most "
          f"{capacity.peak_running} running); {capacity.warmup_requests} warm-up requests per probe not measured")
    for p in capacity.probes:
        print(f"probe {p.rate:6.1f}/s: SLO attainment {p.attainment:.0%}, median queue delay {p.median_queue_delay_s * 1000:.1f} ms, "
              f"arrivals {p.window_arrival_rate:5.1f}/s and completions {p.completed_fraction * p.window_arrival_rate:5.1f}/s over the measured window "
              f"(completed/arrived {p.completed_fraction:.3f}) -> {'pass' if p.passed else 'fail'}")
    """),
    conclusion("""
    mu = capacity.max_throughput
    at_capacity = next(p for p in capacity.probes if p.rate == capacity.capacity)
    failing = next((p for p in capacity.probes if p.rate == capacity.failing_rate), None)
    if capacity.bound == "slo":
        search = (f"a probe at {capacity.failing_rate:.1f} req/s kept up with its arrivals but failed the SLO, {capacity.failing_rate / capacity.capacity:.2f}x "
                  f"the capacity: the SLO, not the throughput, sets it")
    elif failing is not None:
        search = (f"a probe at {capacity.failing_rate:.1f} req/s completed only {failing.completed_fraction:.1%} as many requests as arrived (under 95 %): "
                  f"the engine's throughput under Poisson arrivals, not the SLO, sets it")
    else:
        search = ("every probed rate up to the maximum throughput was sustained and met the SLO, so the engine's throughput sets the number, not "
                  "the SLO: no faster arrival rate can be sustained")
    by_attainment = [p for p in capacity.probes if p.passed != (p.attainment >= 0.9)]   # attainment alone would decide these otherwise
    if by_attainment:
        goodput_text = (f"{len(by_attainment)} probe(s) met the 90 % attainment but failed to keep up, so DistServe's **goodput** (attainment alone, "
                        f"over a short run) would count rates the engine does not sustain; capacity does not")
    else:
        goodput_text = (f"attainment alone decided every probe, so the same search gives DistServe's **goodput**, the highest rate keeping the "
                        f"attainment at 90 %: {capacity.capacity:.1f} req/s here too")
    conclude(f"Capacity under *{slo}*: **{capacity.describe()}** ({capacity.clock_label}, budget 256, 16 slots). The engine sustains it: "
             f"from the first measured arrival to the last, the probe at {capacity.capacity:.1f} req/s had arrivals at "
             f"{at_capacity.window_arrival_rate:.1f} req/s (its Poisson draw) and completed {at_capacity.completed_fraction * at_capacity.window_arrival_rate:.1f} "
             f"req/s, **{at_capacity.completed_fraction:.1%}** of them (counted from first arrival to last finish, the ramp and the drain "
             f"included, it completed {at_capacity.throughput:.1f} req/s). It completes at most {mu:.1f} "
             f"requests/s when all arrive at once, and the capacity is below or at it: {search}. The median queueing delay stayed far under "
             f"the 2 s bound (at most {max(p.median_queue_delay_s for p in capacity.probes) * 1000:.1f} ms): {goodput_text}.",
             [("the capacity never exceeds the measured maximum throughput", 0 < capacity.capacity <= mu * (1 + 1e-9)),
              ("the probe at the capacity kept up: 95 % of its arrivals completed", at_capacity.passed and at_capacity.completed_fraction >= 0.95),
              ("the capacity is above the light load", capacity.capacity > 0.25 * r0),
              ("the SLO or the throughput bounds it", capacity.bound in ("slo", "throughput")),
              ("the failing probe failed as the bound says", failing is None or (failing.sustained == (capacity.bound == "slo"))),
              ("a steady state exactly when a probe has 8 requests per running slot",
               capacity.steady == (capacity.num_requests >= 8 * capacity.peak_running)),
              ("the queueing bound decided no probe", max(p.median_queue_delay_s for p in capacity.probes) < 2.0)])
    """),
    md("""
    ## "Total tok/s went up but P99 TPOT got worse: what do you check?"
    A classic. A chat service also answers questions about documents: every sixth request carries a 1,000-token document
    (the others are the Azure requests above). Someone raises `max_num_batched_tokens` from 128 to 1,024 (chapter 4: a
    128-token chunk is below the H100's ridge point, a waste of steps), with 64 sequence slots. The same requests,
    arriving at the same times, on both settings:
    """),
    code("""
    DOC_LEN = 1000
    documents = Trace([dataclasses.replace(r, prompt_len=DOC_LEN, prompt_token_ids=None, request_id=f"doc-{i}") if i % 6 == 3 else r
                       for i, r in enumerate(lengths[: pick(48, 32)])], source="Azure conv + 1,000-token documents")
    doc_trace = with_arrivals(documents, poisson_arrivals(200.0, len(documents), 0))


    def serve_documents(budget, max_num_seqs=64):
        return replay_trace(doc_trace, clock=TEACHING_CLOCK, model=COURSE_MODEL, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                            max_model_len=4096, trace_block_tables=False)


    budget_runs = {128: serve_documents(128), 1024: serve_documents(1024)}
    bench = {f"budget {b}": ServingBenchmark.from_metrics(run.request_metrics, slo) for b, run in budget_runs.items()}
    for b, run in budget_runs.items():
        s_b = run.summary()
        print(f"budget {b:5d}: total {s_b.total_tok_s:7.0f} tok/s | P50 TPOT {s_b.tpot_p50 * 1000:5.1f} ms | P99 TPOT {s_b.tpot_p99 * 1000:5.1f} ms | "
              f"P99 ITL {s_b.itl_p99 * 1000:5.1f} ms | P99 TTFT {s_b.ttft_p99 * 1000:6.1f} ms")
    """),
    conclusion("""
    small_b, big_b = budget_runs[128].summary(), budget_runs[1024].summary()
    gain = big_b.total_tok_s / small_b.total_tok_s
    conclude(f"Raising the budget from 128 to 1,024 raised total throughput by **{gain - 1:.0%}** ({small_b.total_tok_s:,.0f} -> "
             f"{big_b.total_tok_s:,.0f} tok/s) and made P99 TPOT **{big_b.tpot_p99 / small_b.tpot_p99:.1f}x** worse "
             f"({small_b.tpot_p99 * 1000:.1f} -> {big_b.tpot_p99 * 1000:.1f} ms). The checks below find out why.",
             [("total tok/s went up", gain > 1.05), ("P99 TPOT got worse", big_b.tpot_p99 > 1.5 * small_b.tpot_p99)])
    """),
    md("""
    What to check, in order:
    1. **Step composition** (`viz.batch_composition_figure`): are prefill chunks larger now? Bigger steps = longer gaps for every decode in them.
    2. **ITL tail and its causes** (`viz.find_stalls`): which steps produced the slow tokens?
    3. **Queue and slots**: is `num_running` pinned at `max_num_seqs`? Then slots, not the budget, limit the batch.
    4. **Preemptions and KV usage** (`viz.kv_usage_figure`): recompute preemption re-prefills and stalls.
    5. **Fairness**: who pays? Compare the spread of TPOT across users, and which requests gained.
    6. **Output backlog**: the output tokens owed to requests in the system, over time: is decode work piling up?
    7. **Workload shift**: longer prompts or a different mix raise both numbers at once.
    """),
    code("""
    big = budget_runs[1024]
    titled(viz.batch_composition_figure(big.steps[:60]), "budget 1,024: the first 60 steps").show()
    stall_threshold = 2 * big.summary().itl_p50  # on this clock no gap reaches 3x the median: each step pays the engine's host time
    stalls = viz.find_stalls(big.request_metrics, big.steps, threshold_s=stall_threshold)
    titled(viz.itl_figure(big.request_metrics, big.steps, threshold_s=stall_threshold), "budget 1,024: ITL and the steps behind the stalls").show()
    causes = Counter("a document's prefill" if (st["cause_request_id"] or "").startswith("doc") else st["kind"] for st in stalls)
    print(f"{len(stalls)} gaps above {stall_threshold * 1000:.0f} ms, caused by: {dict(causes)}")
    """),
    code("""
    def shares(run):
        \"\"\"Step composition, slots, preemptions, fairness and output backlog of one run.\"\"\"
        steps, ms = run.steps, run.request_metrics
        chat_tpot = [m.tpot for rid, m in ms.items() if not rid.startswith("doc") and m.tpot is not None]
        ends = [t.end_time for t in steps]
        emitted = {rid: token_times(m) for rid, m in ms.items()}
        backlog = [sum(m.num_output_tokens - sum(1 for x in emitted[rid] if x <= t) for rid, m in ms.items() if m.arrival_time <= t < m.finished_time)
                   for t in ends]
        return dict(max_prefill=max(t.num_prefill_tokens for t in steps),
                    doc_steps=sum(any(c.request_id.startswith("doc") and c.num_tokens > 1 for c in t.chunks) for t in steps) / len(steps),
                    full_slots=sum(t.num_running >= run_slots[id(run)] for t in steps) / len(steps),
                    preemptions=run.summary().num_preemptions,
                    tpot_spread=percentile(chat_tpot, 99) / percentile(chat_tpot, 50),
                    jain=sum(chat_tpot) ** 2 / (len(chat_tpot) * sum(x * x for x in chat_tpot)),
                    doc_ttft=statistics.fmean(m.ttft for rid, m in ms.items() if rid.startswith("doc")),
                    chat_ttft=statistics.fmean(m.ttft for rid, m in ms.items() if not rid.startswith("doc")),
                    peak_backlog=max(backlog), mean_backlog=statistics.fmean(backlog), backlog=(ends, backlog))


    run_slots = {id(run): 64 for run in budget_runs.values()}
    checks = {b: shares(run) for b, run in budget_runs.items()}
    for b, c in checks.items():
        print(f"budget {b:5d}: largest prefill in a step {c['max_prefill']:5d} | steps with a document chunk {c['doc_steps']:.0%} | "
              f"slots full {c['full_slots']:.0%} | preemptions {c['preemptions']} | chat TPOT P99/P50 {c['tpot_spread']:.2f} | "
              f"Jain index {c['jain']:.2f} | mean TTFT docs {c['doc_ttft'] * 1000:.0f} ms, chat {c['chat_ttft'] * 1000:.0f} ms | "
              f"output backlog mean {c['mean_backlog']:.0f}, peak {c['peak_backlog']} tokens")
    fig = go.Figure([go.Scatter(x=[t - c["backlog"][0][0] for t in c["backlog"][0]], y=c["backlog"][1], name=f"budget {b}", mode="lines", line_shape="hv")
                     for b, c in checks.items()])
    titled(fig, "Output backlog: output tokens still owed to the requests in the system")
    fig.update_layout(xaxis_title="time since the first step (s)", yaxis_title="output tokens owed")
    fig.show()
    """),
    md("""
    Check 3 needs a second look: with 64 slots the batch never filled them. Had the service run with 16 slots (this
    chapter's trace replays above use 16), would the bigger budget still have paid?
    """),
    code("""
    slot_runs = {b: serve_documents(b, max_num_seqs=16) for b in (128, 1024)}
    run_slots.update({id(run): 16 for run in slot_runs.values()})
    slot_checks = {b: shares(run) for b, run in slot_runs.items()}
    for b, run in slot_runs.items():
        print(f"16 slots, budget {b:5d}: total {run.summary().total_tok_s:7.0f} tok/s | slots full {slot_checks[b]['full_slots']:.0%} of steps | "
              f"most waiting {max(t.num_waiting for t in run.steps)}")
    """),
    conclusion("""
    c_small, c_big = checks[128], checks[1024]
    gain_64 = budget_runs[1024].summary().total_tok_s / budget_runs[128].summary().total_tok_s
    gain_16 = slot_runs[1024].summary().total_tok_s / slot_runs[128].summary().total_tok_s
    backlog = ("decode work piled up behind the document prefills"
               if c_big["mean_backlog"] > c_small["mean_backlog"] else
               "the bigger budget cleared prompts sooner, so less output was owed on average: the backlog is not where the worse "
               "TPOT comes from; the size of the steps is")
    doc_stalls = causes["a document's prefill"]
    conclude(f"1. **Step composition**: with budget 1,024 a document chunk takes up to {c_big['max_prefill']:,} tokens of a step "
             f"(128 before): the long prefills eat the budget, and every decode in those steps waits for them. "
             f"\\n2. **Stalls**: {len(stalls)} gaps above {stall_threshold * 1000:.0f} ms, every one caused by a prefill chunk sharing the step "
             f"({doc_stalls} by a document's, the rest by long chat prompts, which the bigger budget also lets through in one piece). "
             f"\\n3. **Slots**: with 64 slots running requests filled them in {c_big['full_slots']:.0%} of steps, so the budget was the limit and raising it "
             f"paid ({gain_64 - 1:+.0%}); with 16 slots they were full in {slot_checks[1024]['full_slots']:.0%} of steps and the same change gave "
             f"{gain_16 - 1:+.0%}: when `num_running` sits at `max_num_seqs`, add slots (KV permitting) before touching the budget. "
             f"\\n4. **Preemptions**: {c_small['preemptions']} and {c_big['preemptions']}, not the cause here. "
             f"\\n5. **Fairness**: the bigger budget let every prompt start sooner (mean TTFT of documents {c_small['doc_ttft'] * 1000:.0f} -> "
             f"{c_big['doc_ttft'] * 1000:.0f} ms, of chat requests {c_small['chat_ttft'] * 1000:.0f} -> {c_big['chat_ttft'] * 1000:.0f} ms) and the chat users "
             f"paid for it while they decoded: their TPOT spread (P99 / P50) went from {c_small['tpot_spread']:.2f} to {c_big['tpot_spread']:.2f}, Jain's index "
             f"from {c_small['jain']:.2f} to {c_big['jain']:.2f} (1 = everyone alike). "
             f"\\n6. **Output backlog**: on average {c_big['mean_backlog']:.0f} output tokens were owed with budget 1,024 and "
             f"{c_small['mean_backlog']:.0f} with 128 (peaks {c_big['peak_backlog']} and {c_small['peak_backlog']}); {backlog}.\\n\\nFixes: a smaller budget or `long_prefill_token_threshold` for the "
             f"chunks, decode-first (already on), Dynamic SplitFuse with a target, or a separate pool for documents (disaggregation).",
             [("document chunks fill the bigger budget", c_big["max_prefill"] > 4 * c_small["max_prefill"]),
              ("every stall above the threshold is caused by a prefill chunk", bool(stalls) and all(st["kind"] == "prefill" for st in stalls)),
              ("documents cause a good share of them", doc_stalls >= len(stalls) / 4),
              ("64 slots were never the limit", c_big["full_slots"] == 0.0),
              ("with 16 slots they were, and the budget paid less", slot_checks[1024]["full_slots"] > 0 and gain_16 < gain_64),
              ("chat TPOT got less even", c_big["tpot_spread"] > c_small["tpot_spread"] and c_big["jain"] < c_small["jain"]),
              ("prompts got their first token sooner", c_big["doc_ttft"] < c_small["doc_ttft"] and c_big["chat_ttft"] < c_small["chat_ttft"])])
    """),
    md("""
    ## Round-robin: one long prompt cannot starve another
    With decode-first, prompts in prefill are served in admission order, so a long prompt that arrived first holds the
    whole budget until it is done, and a short one behind it waits (head-of-line blocking). The `round-robin` policy
    shares the prefill budget equally between the prompts that want it. A long prompt (`LONG` tokens, the size is in the
    figure's title), then a 300-token one a step later, budget 256:
    """),
    code("""
    LONG = pick(4000, 2000)


    def two_prompts(policy):
        eng = modelled_engine(max_num_batched_tokens=256, scheduling_policy=policy, trace_block_tables=False)
        run_with_arrivals(eng, [(0, "long-A", {"prompt_token_ids": [(13 * k + 7) % 2000 + 3 for k in range(LONG)]}, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)),
                                (1, "long-B", {"prompt_token_ids": [(13 * k + 14) % 2000 + 3 for k in range(300)]}, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))])
        return eng


    rr_runs = {policy: two_prompts(policy) for policy in ("decode-first", "round-robin")}
    fig = go.Figure()
    for policy, eng in rr_runs.items():
        for rid in ("long-A", "long-B"):
            done, xs, ys = 0, [], []
            for t in eng.traces:
                done += sum(c.num_tokens for c in t.chunks if c.request_id == rid and c.is_prefill)
                xs.append(t.step); ys.append(done)
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv", name=f"{policy}: {rid}", line={"dash": "dot" if rid == "long-B" else "solid"}))
    fig.update_layout(title=f"Prefill progress of a {LONG:,}-token prompt (A) and a 300-token one (B), step by step", xaxis_title="step", yaxis_title="prompt tokens computed")
    fig.show()
    for policy, eng in rr_runs.items():
        print(f"{policy:12s} TTFT A {eng.request_metrics['long-A'].ttft * 1000:6.1f} ms | B {eng.request_metrics['long-B'].ttft * 1000:6.1f} ms")
    """),
    conclusion("""
    df_b, rr_b = (rr_runs[p].request_metrics["long-B"].ttft for p in ("decode-first", "round-robin"))
    df_a, rr_a = (rr_runs[p].request_metrics["long-A"].ttft for p in ("decode-first", "round-robin"))
    b_start = {p: next(t.step for t in eng.traces if any(c.request_id == "long-B" for c in t.chunks)) for p, eng in rr_runs.items()}
    conclude(f"With decode-first the short prompt's first chunk ran only at step {b_start['decode-first']}, after the long one finished its "
             f"prefill: TTFT **{df_b * 1000:.0f} ms**. Round-robin started it at step {b_start['round-robin']} and gave it **{rr_b * 1000:.0f} ms**, "
             f"{df_b / rr_b:.1f}x sooner, for {(rr_a / df_a - 1):.0%} more on the long prompt's TTFT: fairness between prompts costs the one that "
             f"came first a little.",
             [("round-robin starts the second prompt at once", b_start["round-robin"] <= 2 < b_start["decode-first"]),
              ("and gives it a much lower TTFT", rr_b < df_b / 2), ("at a small price for the first", df_a < rr_a < 1.5 * df_a)])
    """),
    md("""
    ## Which business wants which policy?
    A policy is a choice of whom to favour; the business decides. Three workloads, each judged by the metric its users
    feel, each run under the candidate policies:
    - **real-time chat** (users watch tokens stream): P99 ITL of the decoding users. Candidates: decode-first, prefill-first.
    - **RAG / batch** (many document questions submitted at once; the job is done when all are): mean TTFT and total tok/s. Candidates: decode-first, prefill-first.
    - **multi-tenant** (a paid tenant's short requests among a free tenant's flood): the paid tenant's worst TTFT. Candidates:
      decode-first (first come, first served), priority (paid = 0, free = 1), round-robin.
    """),
    code("""
    def ids(n, seed):
        return [(7 * seed + 13 * k) % 2000 + 3 for k in range(n)]


    def run_business(arrivals, policy, priorities=None, **fields):
        eng = modelled_engine(scheduling_policy=policy, trace_block_tables=False, enable_prefix_caching=False, **fields)
        pending, step = sorted(arrivals, key=lambda a: a[0]), 0
        while pending or eng.has_unfinished_requests():
            while pending and pending[0][0] <= step:
                _, rid, prompt, params = pending.pop(0)
                eng.add_request(rid, prompt, params, priority=(priorities or {}).get(rid, 0))
            eng.step()
            step += 1
        return eng


    greedy = dict(temperature=0.0, ignore_eos=True)
    chat = [(0, f"user-{i}", {"prompt_token_ids": ids(32, i)}, SamplingParams(max_tokens=pick(48, 32), **greedy)) for i in range(pick(48, 32))]
    chat += [(2 + 3 * j, f"new-{j}", {"prompt_token_ids": ids(pick(800, 400), 50 + j)}, SamplingParams(max_tokens=4, **greedy)) for j in range(4)]
    rag = [(0, f"rag-{i}", {"prompt_token_ids": ids(pick(300, 160), i)}, SamplingParams(max_tokens=pick(48, 24), **greedy)) for i in range(pick(64, 24))]
    tenants = [(0, f"free-{i}", {"prompt_token_ids": ids(300, i)}, SamplingParams(max_tokens=24, **greedy)) for i in range(16)]
    tenants += [(3 + 4 * j, f"paid-{j}", {"prompt_token_ids": ids(64, 100 + j)}, SamplingParams(max_tokens=8, **greedy)) for j in range(4)]
    free_tier = {f"free-{i}": 1 for i in range(16)}

    business = {}
    for policy in ("decode-first", "prefill-first"):
        eng = run_business(chat, policy, max_num_batched_tokens=128, max_num_seqs=128)
        business[("real-time chat", policy)] = percentile([x for rid, m in eng.request_metrics.items() if rid.startswith("user") for x in m.itls], 99)
    for policy in ("decode-first", "prefill-first"):
        eng = run_business(rag, policy, max_num_batched_tokens=pick(256, 96), max_num_seqs=64)
        business[("RAG / batch", policy)] = (statistics.fmean(m.ttft for m in eng.request_metrics.values()), eng.summary().total_tok_s)
    for policy in ("decode-first", "priority", "round-robin"):
        eng = run_business(tenants, policy, priorities=free_tier, max_num_batched_tokens=256, max_num_seqs=8)
        business[("multi-tenant", policy)] = max(m.ttft for rid, m in eng.request_metrics.items() if rid.startswith("paid"))
    for (kind, policy), value in business.items():
        shown = (f"mean TTFT {value[0] * 1000:.1f} ms, {value[1]:,.0f} tok/s" if kind == "RAG / batch"
                 else f"{'P99 ITL of chat users' if kind == 'real-time chat' else 'worst paid TTFT'} {value * 1000:.1f} ms")
        print(f"{kind:15s} {policy:14s} {shown}")
    """),
    conclusion("""
    chat_win = min(("decode-first", "prefill-first"), key=lambda p: business[("real-time chat", p)])
    rag_win = min(("decode-first", "prefill-first"), key=lambda p: business[("RAG / batch", p)][0])
    tenant_win = min(("decode-first", "priority", "round-robin"), key=lambda p: business[("multi-tenant", p)])
    b = business
    conclude(f"| business | metric | winner | numbers |\\n|---|---|---|---|\\n"
             f"| real-time chat | P99 ITL | **{chat_win}** | {b[('real-time chat', 'decode-first')] * 1000:.1f} ms vs {b[('real-time chat', 'prefill-first')] * 1000:.1f} ms (prefill-first) |\\n"
             f"| RAG / batch | mean TTFT, tok/s | **{rag_win}** | {b[('RAG / batch', 'prefill-first')][0] * 1000:.1f} ms and {b[('RAG / batch', 'prefill-first')][1]:,.0f} tok/s vs "
             f"{b[('RAG / batch', 'decode-first')][0] * 1000:.1f} ms and {b[('RAG / batch', 'decode-first')][1]:,.0f} tok/s (decode-first) |\\n"
             f"| multi-tenant | paid tenant's worst TTFT | **{tenant_win}** | {b[('multi-tenant', 'priority')] * 1000:.1f} ms vs {b[('multi-tenant', 'decode-first')] * 1000:.1f} ms "
             f"(first come, first served), {b[('multi-tenant', 'round-robin')] * 1000:.1f} ms (round-robin) |\\n\\n"
             f"Chat users feel every stall, so decode-first; a batch job wants its prompts through, so prefill-first; a paying tenant "
             f"wants to jump the queue, so priority (with aging, so the free tier still finishes); round-robin is fairness between "
             f"equals, not a service level.",
             [("real-time chat: decode-first", chat_win == "decode-first"), ("RAG / batch: prefill-first", rag_win == "prefill-first"),
              ("prefill-first also has the batch's throughput", b[("RAG / batch", "prefill-first")][1] >= b[("RAG / batch", "decode-first")][1]),
              ("multi-tenant: priority", tenant_win == "priority")])
    """),
    md("""
    ## Predictive scheduling: shortest predicted first
    With every request known, **shortest job first** minimises the mean latency: a long request served first makes every
    short one behind it wait (head-of-line blocking). A scheduler does not know output lengths; it can **predict** them.
    The engine's `output_length_predictor` (`minengine.core.predictors`) sets each request's `predicted_output_len` when
    it is added, and the policy `shortest-predicted-first` runs and admits the smallest predicted *remaining* output first
    (with aging, so a long request cannot starve; Fu et al. 2024). Three predictors behind one interface:
    - `OraclePredictor`: the true length (here `max_tokens`, exact with `ignore_eos`): the best prediction can do;
    - `NoisyOraclePredictor(sigma)`: the truth times `exp(sigma * z)`: the knob "how good must a predictor be?";
    - `LearnedPredictor`: the median output of training requests with similar prompt lengths, fitted on *other* requests
      of the Azure trace (it has no text, so prompt length is all it can read).

    The workload: the first requests of the trace all arrive at once, with only 4 sequence slots, so most of them queue.
    First come, first served (decode-first) against shortest-predicted-first under each predictor (modelled clock):
    """),
    code("""
    from types import SimpleNamespace

    from minengine.core.predictors import LearnedPredictor, NoisyOraclePredictor, OraclePredictor, prediction_error

    BURST = lengths[:pick(48, 24)]
    train = (load_azure_trace(path, max_requests=len(BURST) + 4000, length_scale=1 / 4)[len(BURST):] if path is not None
             else synthetic_trace(2000, rate=1.0, prompt_len=180, output_len=28, range_ratio=0.5, seed=1))
    learned = LearnedPredictor().fit([r.prompt_len for r in train], [r.output_len for r in train])
    predictors = {"first come, first served": None, "oracle": OraclePredictor(), "noisy, sigma 0.5": NoisyOraclePredictor(0.5),
                  "noisy, sigma 1": NoisyOraclePredictor(1.0), "noisy, sigma 2": NoisyOraclePredictor(2.0), "learned (prompt length)": learned}


    def predicted(predictor, rid, m):
        request = SimpleNamespace(request_id=rid, prompt_token_ids=[0] * m.num_prompt_tokens,
                                  sampling_params=SimpleNamespace(max_tokens=m.num_output_tokens))
        return predictor.predict(request)


    sjf = {}
    for name, predictor in predictors.items():
        run = replay_trace(with_arrivals(BURST, [0.0] * len(BURST)), clock=TEACHING_CLOCK, model=COURSE_MODEL, max_num_batched_tokens=256,
                           max_num_seqs=4, trace_block_tables=False,
                           scheduling_policy="decode-first" if predictor is None else "shortest-predicted-first", output_length_predictor=predictor)
        ms = run.request_metrics
        true = [m.num_output_tokens for m in ms.values()]
        err = prediction_error([predicted(predictor, rid, m) for rid, m in ms.items()], true) if predictor else None
        sjf[name] = dict(e2e=statistics.fmean(m.e2e_latency for m in ms.values()), ttft=statistics.fmean(m.ttft for m in ms.values()),
                         worst=max(m.e2e_latency for m in ms.values()), rank=err.spearman if err else math.nan)
        print(f"{name:25s} mean E2E {sjf[name]['e2e'] * 1000:6.1f} ms | mean TTFT {sjf[name]['ttft'] * 1000:6.1f} ms | "
              f"slowest {sjf[name]['worst'] * 1000:6.1f} ms | rank correlation of predicted and true lengths {sjf[name]['rank']:5.2f}")
    fig = go.Figure(go.Bar(x=list(sjf), y=[v["e2e"] * 1000 for v in sjf.values()]))
    fig.update_layout(yaxis_title="mean end-to-end latency (ms)", xaxis_title="order of service")
    titled(fig, f"Shortest predicted first, {len(BURST)} requests at once, 4 slots").show()
    """),
    conclusion("""
    fcfs, oracle = sjf["first come, first served"]["e2e"], sjf["oracle"]["e2e"]
    noisy = [sjf[f"noisy, sigma {s}"]["e2e"] for s in ("0.5", "1", "2")]


    def versus(name):
        v = sjf[name]["e2e"]
        return f"{v * 1000:.0f} ms, {'better' if v < fcfs else 'worse'} than first come, first served by {abs(v / fcfs - 1):.0%}"


    conclude(f"Knowing the lengths, shortest-first cut the mean latency from **{fcfs * 1000:.0f} ms to {oracle * 1000:.0f} ms** "
             f"({1 - oracle / fcfs:.0%}) for the same work: short requests stop waiting behind long ones. The gain shrinks as the "
             f"prediction gets worse: sigma 0.5 gave {versus('noisy, sigma 0.5')}; sigma 1 {versus('noisy, sigma 1')}; sigma 2 "
             f"{versus('noisy, sigma 2')}. The predictor learned from prompt lengths ranks these requests with a correlation of "
             f"only {sjf['learned (prompt length)']['rank']:.2f} and gave {versus('learned (prompt length)')}: what matters is the *ranking*, "
             f"which is why the papers learn to rank from the prompt's text (Fu et al. 2024), not from its length.",
             [("the oracle beats first come, first served", oracle < fcfs),
              ("so does a predictor off by x1.65 a third of the time", noisy[0] < fcfs),
              ("the gain shrinks as the noise grows", oracle < noisy[0] < noisy[1] < noisy[2]),
              ("the oracle ranks perfectly", sjf["oracle"]["rank"] > 0.999),
              ("the length-only predictor ranks these requests poorly", sjf["learned (prompt length)"]["rank"] < 0.7)])
    """),
    md("""
    ## Priority, cancellation and timeouts
    - **Priority** (`scheduling_policy="priority"`, `add_request(..., priority=...)`; smaller = more urgent, as in vLLM):
      urgent requests are admitted and served first (the paid tenant above); aging lets a low-priority request win eventually.
    - **Cancellation**: `abort_request(id)` finishes a request in any state and frees its blocks at once (a client hung up).
    - **Timeouts**: `add_request(..., deadline=t)` finishes it with reason `"timeout"` when the engine clock passes `t`.
    """),
    conclusion("""
    eng = modelled_engine(num_kv_blocks=64)
    eng.add_request("chatty", {"prompt_token_ids": [7] * 100}, SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
    eng.add_request("slow", {"prompt_token_ids": [8] * 40}, SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True),
                    deadline=eng.clock() + 0.05)   # 50 ms on the modelled clock
    outs = {}
    for _ in range(5):
        outs.update({o.request_id: o for o in eng.step() if o.finished})
    free_before = eng.kv_cache_manager.num_free_blocks
    eng.abort_request("chatty")
    free_after = eng.kv_cache_manager.num_free_blocks
    outs.update(run_to_completion(eng))
    conclude(f"Aborting `chatty` freed {free_after - free_before} KV blocks at once ({free_before} -> {free_after} free). "
             f"`slow` had a 50 ms deadline and finished with reason **{outs['slow'].outputs[0].finish_reason}** after "
             f"{len(outs['slow'].outputs[0].token_ids)} tokens.",
             [("the abort freed chatty's blocks at once", free_after - free_before == math.ceil(105 / 16)),
              ("the deadline became a timeout", outs["slow"].outputs[0].finish_reason == "timeout"),
              ("every block is free afterwards", eng.kv_cache_manager.num_free_blocks == eng.num_kv_blocks)])
    """),
    md("## Try it: arrival rate vs latency distribution"),
    code("""
    import ipywidgets as widgets


    def load_test(rate_multiple=1.0):
        run = at_rate(rate_multiple * r0)
        print(f"{rate_multiple * r0:.1f} requests/s: good-request rate {goodput(run.request_metrics, slo):.1f}/s, SLO attainment "
              f"{sum(1 for m in run.request_metrics.values() if m.ttft <= slo.ttft_s) / N:.0%} on TTFT")
        titled(viz.latency_cdf_figure(run.request_metrics), f"Latency distribution at {rate_multiple * r0:.1f} requests/s").show()


    widgets.interact_manual(load_test, rate_multiple=widgets.FloatSlider(value=1.0, min=0.25, max=4.0, step=0.25))
    """),
    *exercise(1, """
        Write `answer_1(xs)`: the P99 of a list of latencies `xs` (in any order), with linear interpolation between the two
        nearest ranks (numpy's default, what the engine's summaries report). The check calls it on the TTFTs of the light run
        (`light.request_metrics`) and of the heaviest run, and on short lists, where the P99 and the largest value differ most.
        """, "Sort; k = (n - 1) x 0.99; interpolate between xs[floor(k)] and xs[ceil(k)].", "answer_1",
        """
        def answer_1(xs):
            xs = sorted(xs)
            k = (len(xs) - 1) * 0.99
            return xs[math.floor(k)] + (xs[math.ceil(k)] - xs[math.floor(k)]) * (k - math.floor(k))
        """,
        """
        samples = [[0.3, 0.1, 0.2], [0.05, 0.01], [0.4], [0.2, 0.9, 0.1, 0.5, 0.3],
                   [m.ttft for m in light.request_metrics.values()], [m.ttft for m in heavy.request_metrics.values()]]
        check_function("Exercise 1: P99", answer_1, [(xs, percentile(xs, 99)) for xs in samples], rel_tol=1e-9)
        """, wrong=["answer_1 = lambda xs: max(xs)  # the largest value is the P100, not the P99",
                    "answer_1 = lambda xs: sorted(xs)[int(0.99 * len(xs))]  # nearest rank, no interpolation",
                    "answer_1 = lambda xs: sorted(xs)[math.ceil((len(xs) - 1) * 0.99)]  # rounds the rank up: the largest value again",
                    "answer_1 = lambda xs: xs[math.floor((len(xs) - 1) * 0.99)] + (xs[math.ceil((len(xs) - 1) * 0.99)] - xs[math.floor((len(xs) - 1) * 0.99)]) * ((len(xs) - 1) * 0.99 % 1)  # not sorted",
                    "answer_1 = lambda xs: statistics.fmean(xs)  # the mean hides the tail",
                    "answer_1 = lambda xs: statistics.median(xs)"]),
    md("""
    For exercise 2, an SLO for the document service set from the budget-1,024 run so that both bounds matter: the TBT
    bound halfway between the smoothest and the roughest request's P99 gap, the TTFT bound at the median TTFT of the
    requests that meet the TBT bound.
    """),
    code("""
    p99_gap = {rid: percentile(m.itls, 99) for rid, m in big.request_metrics.items() if m.itls}
    tbt_bound = (min(p99_gap.values()) + max(p99_gap.values())) / 2
    ttft_bound = statistics.median(big.request_metrics[rid].ttft for rid, g in p99_gap.items() if g <= tbt_bound)
    doc_slo = SLO(ttft_s=ttft_bound, tbt_p99_s=tbt_bound)
    fails_ttft = sum(m.ttft > doc_slo.ttft_s for m in big.request_metrics.values())
    fails_tbt_only = sum(m.ttft <= doc_slo.ttft_s and bool(m.itls) and percentile(m.itls, 99) > doc_slo.tbt_p99_s for m in big.request_metrics.values())
    print(f"{doc_slo}: {len(big.request_metrics)} requests, {fails_ttft} miss the TTFT bound, {fails_tbt_only} meet it but miss the TBT bound")
    claim("the exercise's SLO separates the right answer from the usual mistakes", fails_ttft > 0 and fails_tbt_only > 0 and fails_ttft + fails_tbt_only < len(big.request_metrics))
    """),
    *exercise(2, """
        Write `answer_2(metrics, slo)`: the good-request rate of a run whose `request_metrics` are `metrics` (a dict, request id ->
        metrics) under an SLO with a TTFT bound `slo.ttft_s` and a P99 TBT bound `slo.tbt_p99_s` (what `goodput()` computes):
        requests that met every bound, per second of the run (first arrival -> last finish). A request meets the TBT bound when
        the P99 of its own gaps (`percentile(m.itls, 99)`) is within it; a request with no ITLs (one output token) has no TBT to
        check. The check calls it on the budget-1,024 document run (`big`) with `doc_slo` and with SLOs whose TBT bound lies
        between some requests' P99 gap and their largest gap, and on a short run of the same documents in which one request asks
        for one token.
        """, "Count the requests with ttft <= slo.ttft_s and (no itls or P99 of its itls <= slo.tbt_p99_s); divide by the duration in seconds.", "answer_2",
        """
        def answer_2(metrics, slo):
            ms = list(metrics.values())
            good = sum(1 for m in ms if m.ttft <= slo.ttft_s and (not m.itls or percentile(m.itls, 99) <= slo.tbt_p99_s))
            return good / (max(m.finished_time for m in ms) - min(m.arrival_time for m in ms))
        """,
        """
        # TBT bounds a request's P99 gap meets and its largest gap does not: the P99 and the maximum give different answers there
        between = sorted((percentile(m.itls, 99) + max(m.itls)) / 2 for m in big.request_metrics.values() if m.itls and max(m.itls) > percentile(m.itls, 99))
        no_ttft_bound = 2 * max(m.ttft for m in big.request_metrics.values())
        slos = [doc_slo, SLO(ttft_s=doc_slo.ttft_s, tbt_p99_s=between[len(between) // 2]), SLO(ttft_s=no_ttft_bound, tbt_p99_s=between[0]),
                SLO(ttft_s=no_ttft_bound, tbt_p99_s=between[-1])]
        # the same documents, the first request asking for one token: it has a TTFT and no ITL
        short = replay_trace(doc_trace[:8].with_requests([dataclasses.replace(r, output_len=1 if i == 0 else r.output_len) for i, r in enumerate(doc_trace[:8])]),
                             clock=TEACHING_CLOCK, model=COURSE_MODEL, max_num_batched_tokens=1024, max_model_len=4096, trace_block_tables=False)
        one_token = [m for m in short.request_metrics.values() if not m.itls]
        short_slo = SLO(ttft_s=2 * max(m.ttft for m in short.request_metrics.values()),
                        tbt_p99_s=statistics.median(percentile(m.itls, 99) for m in short.request_metrics.values() if m.itls))
        claim("the short run has a request with no ITL", len(one_token) == 1)
        cases_2 = [((big.request_metrics, s_), goodput(big.request_metrics, s_)) for s_ in slos]
        check_function("Exercise 2: good-request rate", answer_2, cases_2 + [((short.request_metrics, short_slo), goodput(short.request_metrics, short_slo))], rel_tol=1e-9)
        """, wrong=["""
        def answer_2(metrics, slo):   # the largest gap where the P99 is asked
            ms = list(metrics.values())
            good = sum(1 for m in ms if m.ttft <= slo.ttft_s and (not m.itls or max(m.itls) <= slo.tbt_p99_s))
            return good / (max(m.finished_time for m in ms) - min(m.arrival_time for m in ms))
        """, """
        def answer_2(metrics, slo):   # the P99 of every request's gaps pooled, not each request's own
            ms = list(metrics.values())
            pooled = percentile([x for m in ms for x in m.itls], 99)
            good = sum(1 for m in ms if m.ttft <= slo.ttft_s and pooled <= slo.tbt_p99_s)
            return good / (max(m.finished_time for m in ms) - min(m.arrival_time for m in ms))
        """, """
        def answer_2(metrics, slo):   # throughput counts unhappy users too
            ms = list(metrics.values())
            return len(ms) / (max(m.finished_time for m in ms) - min(m.arrival_time for m in ms))
        """, """
        def answer_2(metrics, slo):   # forgot the TBT bound
            ms = list(metrics.values())
            return sum(1 for m in ms if m.ttft <= slo.ttft_s) / (max(m.finished_time for m in ms) - min(m.arrival_time for m in ms))
        """, """
        def answer_2(metrics, slo):   # a fraction (the SLO attainment), not a rate
            ms = list(metrics.values())
            return sum(1 for m in ms if m.ttft <= slo.ttft_s and (not m.itls or percentile(m.itls, 99) <= slo.tbt_p99_s)) / len(ms)
        """, """
        def answer_2(metrics, slo):   # a request with no ITLs fails (the P99 of no gaps is NaN, and NaN <= x is False)
            ms = list(metrics.values())
            good = sum(1 for m in ms if m.ttft <= slo.ttft_s and percentile(m.itls, 99) <= slo.tbt_p99_s)
            return good / (max(m.finished_time for m in ms) - min(m.arrival_time for m in ms))
        """, """
        def answer_2(metrics, slo):   # per millisecond, not per second
            ms = list(metrics.values())
            good = sum(1 for m in ms if m.ttft <= slo.ttft_s and (not m.itls or percentile(m.itls, 99) <= slo.tbt_p99_s))
            return good / ((max(m.finished_time for m in ms) - min(m.arrival_time for m in ms)) * 1000)
        """, "answer_2 = lambda metrics, slo: goodput(big.request_metrics, doc_slo)  # the first case's rate, whatever the run and SLO"]),
    *exercise(3, """
        Interpret the budget experiment: in the budget-1,024 run, find the step that made the worst stall of a chat user and give
        the id of the request whose chunk filled it. (Chat users are the ids without `doc`.)
        """, "Take the largest ITL among chat users from `viz.find_stalls(big.request_metrics, big.steps, ...)`, or walk `big.steps`: the step with the largest prefill chunk inside that gap.", "answer_3",
        """
        worst = max((s for s in stalls if not s["request_id"].startswith("doc")), key=lambda s: s["itl_s"])
        answer_3 = worst["cause_request_id"]
        """,
        """
        chat_gaps = [(gap, rid, i) for rid, m in big.request_metrics.items() if not rid.startswith("doc") for i, gap in enumerate(m.itls)]
        gap, rid, i = max(chat_gaps)
        times = token_times(big.request_metrics[rid])
        inside = [t for t in big.steps if times[i] < t.end_time <= times[i + 1] + 1e-9]
        culprit = max((c for t in inside for c in t.chunks if c.is_prefill), key=lambda c: c.num_tokens).request_id
        check("Exercise 3: who made the worst chat stall", answer_3, culprit)
        """, wrong=["answer_3 = max(stalls, key=lambda s: s['itl_s'])['request_id']  # the victim of the stall, not its cause",
                    'answer_3 = "budget 1024"  # the setting is the reason, a request is the cause']),
    *question("why can a busy engine serve users well or badly?", """
        At two arrival rates the engine was busy nearly all the time: at the lower one at least 90 % of the requests met the
        SLO, at the top one the P99 TTFT had grown by half or more and fewer than 90 % met it. Why can utilization not tell the two apart? What would you watch to see the second coming?
        """, """
        Near saturation, work arrives about as fast as it can be done, so any burst has to wait: the queue grows, and
        queueing delay (counted in TTFT) grows with it (checked: the queue grew: more waiting, longer queueing). Queueing theory says how
        fast: the mean wait of an M/G/1 queue grows like 1 / (1 - utilization), without bound as the arrival rate
        approaches the service rate (source: the Pollaczek-Khinchine formula; Kleinrock, *Queueing Systems*, volume 1,
        1975). Utilization says whether the engine is idle, and it stops at 100 % while the arrival rate goes on past what the engine completes (checked: the top rate is just as busy; at the top rate arrivals outrun completions, more than at the ceiling); it does not say who waits. Watch the waiting queue length and time in queue, TTFT P99 and SLO
        attainment (the good-request rate over the throughput); they move when utilization no longer can (it is already ~100 %).
        """),
    *question("what if you raised the budget and the slots together?", """
        With 16 slots the bigger budget paid less because the batch was slot-bound. What would raising `max_num_seqs` to 64
        cost, and when could it backfire?
        """, """
        Every running request holds its whole context in KV blocks of the pool. With enough memory, more slots let more
        decodes share each weight read (chapter 1), and the bigger budget then raises the total tok/s (checked: total tok/s went up). With too little memory, the extra requests are admitted and then preempted when they grow (checked: ch06 · the small pool forces preemptions and the roomy one none): recompute preemption re-prefills them, which costs compute, stalls the decodes
        and can eat the throughput gain. Check the
        KV usage and the preemption count after the change.
        """),
    *summary([
        "TTFT (queueing + prefill), TPOT (decode pace) and ITL/TBT (every gap) are judged at P99, not on average.",
        "Goodput (DistServe) is the highest request rate at which the SLO attainment target holds; one run's good-request rate (minengine's `goodput()`, vLLM's \"Request goodput\") is its requests per second within the SLO; capacity (Sarathi-Serve) also bounds the queueing delay.",
        "Busy time reaches 100 % while the SLO still holds: a fully busy engine may meet its SLO or fall far behind, its queue and TTFT growing (checked: the top rate is just as busy; the tail TTFT has grown; the queue grew: more waiting). Watch the queue and the SLO attainment.",
        "When total tok/s rises and P99 TPOT worsens: step composition, stalls and their causes, slots (`max_num_seqs`), preemptions, fairness (who gained, who paid), output backlog, workload mix (checked: total tok/s went up; P99 TPOT got worse).",
        "Policies serve businesses: decode-first for real-time chat, prefill-first for RAG / batch, priority for a paying tenant, round-robin against one prompt starving another.",
        "Predictive scheduling: shortest-predicted-first lowers mean latency by as much as the predictor ranks requests correctly (checked: the oracle beats first come, first served; so does a predictor off by x1.65); a perfect ranking gives shortest-job-first.",
        "Abort frees blocks at once; deadlines turn into 'timeout' finishes.",
    ]),
    *glossary([
        ("TTFT", "首词元时间", "arrival -> first output token"),
        ("TPOT", "每输出词元时间", "(E2E - TTFT) / (n - 1)"),
        ("ITL / TBT", "词元间延迟 / 词元间隔", "gap between two consecutive output tokens"),
        ("SLO", "服务等级目标", "bounds on a request's latencies"),
        ("goodput", "有效吞吐", "highest request rate at which the SLO attainment target (90 %) holds (DistServe)"),
        ("good-request rate", "达标请求率", "one run's requests per second that met the SLO (`goodput()`, vLLM's \"Request goodput\")"),
        ("SLO attainment", "SLO 达成率", "fraction of a run's requests that met the SLO"),
        ("capacity", "容量", "highest arrival rate meeting the SLO"),
        ("P99", "第 99 百分位", "the value 99 % of samples are below"),
        ("priority / aging", "优先级 / 老化", "serve urgent first; waiting improves priority over time"),
        ("fairness (Jain's index)", "公平性（Jain 指数）", "(Σx)² / (n Σx²): 1 when every user gets the same"),
        ("output backlog", "输出积压", "output tokens still owed to the requests in the system"),
        ("cancellation / timeout", "取消 / 超时", "abort a request / finish it past its deadline"),
        ("shortest predicted first", "预测最短优先", "serve the request with the least predicted remaining output first"),
        ("output length predictor", "输出长度预测器", "predicts how many tokens a request will generate"),
    ]),
]

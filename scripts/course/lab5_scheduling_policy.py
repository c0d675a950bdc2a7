# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Lab 5's page: a scheduling policy of the learner's design, graded on SLO attainment against decode-first."""

from cells import code, conclusion, md
from labpage import engine_on_your_part, grade_it, header, summary, your_file

CELLS = [
    *header(5, "scheduling_policy", "A scheduling policy of your own", [
        "See decode-first, the engine's default policy, on the lab's held trace: which requests meet the SLO and which miss it.",
        "Write a `SchedulingPolicy` of your own design, from the skeleton, and grade it on SLO attainment against decode-first.",
        "Run the whole engine on your policy and watch its steps and latencies in the dashboard's figures.",
    ], "[chapter 07, scheduler design and SLOs](07_scheduler_slos.ipynb)"),
    md("""
    ## The part: what a policy decides, and what it is graded on
    Each step, the policy fills the token budget: which running requests run, in what order, which waiting prompt
    is admitted next, and which request is the victim when KV memory runs out. This lab is not graded on equality
    with an answer: your policy must reach at least decode-first's SLO attainment (the fraction of requests that
    meet both the TTFT and the TPOT bound) on a held trace of chats and long documents, replayed on the modelled
    clock. Below, decode-first replays that trace on the real engine (its scheduler and KV cache, without model
    weights: the grader's replay).
    """),
    code("""
    from minengine.labs.scheduling_policy_lab import HELD_SLO, held_trace, replay_with
    from minengine.workloads.goodput import meets_slo, slo_attainment

    trace = held_trace()
    result = replay_with(None, trace, max_steps=100_000)   # None: decode-first, the engine's default policy
    kinds = {r.request_id: ("long document" if r.prompt_len >= 2000 else "chat") for r in trace}
    for kind in ("chat", "long document"):
        ms = [m for rid, m in result.request_metrics.items() if kinds[rid] == kind]
        late_first = sum(m.ttft > HELD_SLO.ttft_s for m in ms)
        late_tokens = sum(m.tpot is not None and m.tpot > HELD_SLO.tpot_s for m in ms)
        print(f"{kind:14}: {len(ms):3} requests, {sum(meets_slo(m, HELD_SLO) for m in ms):3} meet the SLO; "
              f"{late_first} miss the TTFT bound, {late_tokens} the TPOT bound")
    base = slo_attainment(result.request_metrics, HELD_SLO)
    titled(viz.latency_cdf_figure(result.request_metrics), f"Decode-first on the held trace (SLO: TTFT <= {HELD_SLO.ttft_s * 1000:.0f} ms, TPOT <= {HELD_SLO.tpot_s * 1000:.0f} ms)").show()
    """),
    conclusion("""
    conclude(f"Decode-first meets the SLO for **{base:.0%}** of the held trace's {len(trace)} requests: the bar your policy "
             "must reach, with room above it.",
             [("every request of the trace was replayed", len(result.request_metrics) == len(trace)),
              ("some requests miss the SLO under decode-first", 0 < base < 1)])
    """),
    *your_file("scheduling_policy", "You write `MyPolicy`, a `SchedulingPolicy`: `fill` (spend a step's budget: the skeleton's docstring lists the moves a step offers), `next_waiting` (which waiting prompt is admitted next) and `pick_victim` (which candidate gives its blocks back). Decode-first (`minengine/core/policies/`) is a working starting point."),
    *grade_it("scheduling_policy"),
    *engine_on_your_part(
        "scheduling_policy", 'WORKLOADS["chunked_prefill"]',
        "the engine's scheduler asks your policy for every step's order, admission and victim",
        """
        from minengine.labs.scheduling_policy_lab import attainment

        if report.passed:
            yours, decode_first = attainment(MY_FILE)
            print(f"SLO attainment on the held trace: yours {yours:.0%}, decode-first {decode_first:.0%}")
        titled(viz.batch_composition_figure(mine.traces), "Each step's tokens, ordered by your policy").show()
        titled(viz.latency_cdf_figure(mine.request_metrics), "TTFT and TPOT on your policy").show()
        """,
        "each step's composition, then the requests' latencies"),
    *summary([
        "A policy decides each step's order, the next admission and the victim; the engine keeps the budgets and the KV bookkeeping.",
        "It is graded on the fraction of requests meeting both the TTFT and the TPOT bound on a held trace, against decode-first on the same modelled clock, not on equality with an answer.",
        "The grader checks single steps, random traces on a small pool (within budget, not empty, victims among the candidates), the attainment, then the whole engine on your policy against transformers.",
    ]),
]

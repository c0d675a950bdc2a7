# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Lab 4's page: preemption by recompute (the policy's victim, every block freed, re-queued first)."""

from cells import code, conclusion, md
from labpage import engine_on_your_part, grade_it, header, summary, your_file

CELLS = [
    *header(4, "preemption", "Preemption by recompute", [
        "See the engine run out of KV blocks: which request it preempts, the blocks it gets back, and when the victim comes back.",
        "Write `pick_victim`, `preempt` and `allocate_or_preempt` yourself, from the skeleton, and grade them.",
        "Run the whole engine on your preemption and watch its KV memory and queues in the dashboard's figures.",
    ], "[chapter 06, admission and preemption](06_admission_preemption.ipynb)"),
    md("""
    ## The part: what the engine does when KV memory runs out
    A running request needs a new KV block for its next token and none is free. The engine asks the policy for a
    victim among the running requests **not yet scheduled in this step** (their blocks are not read by this step),
    frees every block the victim holds, resets its progress, and puts it at the head of the waiting queue; it is
    prefilled again where it was when blocks come back (recompute). Below, the grader's preemption workload runs on
    the real engine with a small pool; each row is a step where a request was preempted or came back.
    """),
    code("""
    demo = WORKLOADS["preemption"]
    print("settings:", demo.settings)
    engine, _ = serve(demo)
    preempted, back = {}, {}
    for t in engine.traces:
        out = [rid for rid in t.preempted_ids]
        returned = [rid for rid in t.admitted_ids if rid in preempted and rid not in back]
        for rid in out:
            preempted.setdefault(rid, t.step)
        for rid in returned:
            back[rid] = t.step
        if out or returned:
            used = t.num_total_blocks - t.num_free_blocks
            print(f"step {t.step:2}: {used:2}/{t.num_total_blocks} KV blocks in use, {t.num_running} running, {t.num_waiting} waiting"
                  + (f" | preempted {', '.join(out)}" if out else "") + (f" | back: {', '.join(returned)}" if returned else ""))
    titled(viz.kv_usage_figure(engine.traces), "KV blocks in use: preemption gives a victim's blocks back").show()
    """),
    conclusion("""
    finished = {rid for rid, m in engine.request_metrics.items() if m.finished_time is not None}
    conclude(f"**{len(preempted)}** requests were preempted when the {engine.num_kv_blocks} blocks ran out; each came back "
             f"(readmitted {len(back)} of {len(preempted)}) and finished, and no victim was one of the requests its step ran.",
             [("the small pool forces preemption", len(preempted) > 0),
              ("every victim came back after it was preempted", all(back.get(rid, -1) > step for rid, step in preempted.items())),
              ("every request finished", finished == set(engine.request_metrics)),
              ("no victim ran in the step that preempted it",
               all(not set(t.preempted_ids) & {c.request_id for c in t.chunks} for t in engine.traces))])
    """),
    *your_file("preemption", "You write `pick_victim` (ask the policy, among the running requests not yet scheduled this step), `preempt` (off the running list, every block freed, progress reset, first in the waiting queue, recorded) and `allocate_or_preempt` (preempt until the request's new slots fit; say so when the request is its own victim)."),
    *grade_it("preemption"),
    *engine_on_your_part(
        "preemption", 'WORKLOADS["preemption"]',
        "the step builder's allocation loop preempts through your functions",
        """
        titled(viz.kv_usage_figure(mine.traces), "KV blocks in use on your preemption").show()
        titled(viz.queue_figure(mine.traces), "Running and waiting requests: victims go back to the waiting queue").show()
        """,
        "KV memory over the run, then the queues the victims move between"),
    *summary([
        "When the KV blocks run out, a victim is taken among the running requests not yet scheduled in the step, so no block the step reads is freed.",
        "The victim gives back every block, loses its computed tokens and goes to the head of the waiting queue; when it is admitted again its prompt and output so far are prefilled again.",
        "The grader checks each function on a real scheduler case by case, random workloads against the reference, then the whole engine on your preemption against transformers.",
    ]),
]

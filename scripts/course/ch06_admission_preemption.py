# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 6: the scheduler's step: why both budgets (two broken toys beside the real scheduler), the schedule_step
toy and vLLM's Scheduler.schedule read in five steps, the request state machine on a real run, preemption (victim
choice, re-queueing at the head), recompute vs swap, the admission probe."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(6, "Admission and preemption: one scheduler step", [
        "Explain why a step must respect both budgets, tokens and KV blocks (plus sequence slots): see a scheduler that checks only one of them fail.",
        "Write the scheduler's step as a 30-line toy, check it against the real engine step by step, and map vLLM's `Scheduler.schedule` onto minengine's `StepBuilder` and `Scheduler.update_from_output` in five steps.",
        "Draw the request state machine (`RequestStatus`) and watch a real run take its arrows.",
        "Watch KV memory run out: which request becomes the victim (only one not yet scheduled this step), where it is re-queued (the head: last preempted, first back), recompute vs swap, the admission probe.",
        "Read a request's progress as one number, `num_computed_tokens`, against its pending tokens: chunked prefill, prefix hits, decodes and the engine's speculative decoding (prompt lookup) all move it.",
    ], ["Kwon et al., PagedAttention, SOSP 2023, sections 4.5 and 7.3 (swapping vs recomputation)",
        "vLLM source, `vllm/v1/core/sched/scheduler.py` (`Scheduler.schedule`, `update_from_output`)",
        "vLLM docs, *Optimization and Tuning: preemption*", "Yu et al., Orca, OSDI 2022", "Agrawal et al., Sarathi-Serve, OSDI 2024",
        "Leviathan et al., *Fast Inference from Transformers via Speculative Decoding*, ICML 2023", "Saxena, *Prompt Lookup Decoding*, 2023; vLLM docs, *Speculative Decoding* (`method=\"ngram\"`)"]),
    code(SETUP + """\
import inspect
import math
from collections import Counter

from minengine.core import scheduler as scheduler_module, step_builder as step_builder_module
from minengine.course import teaching_cost_model
from minengine.course.states import StateRecorder
from minengine.request import RequestStatus
from minengine.timing import StepWork
from minengine.viz.state_machine import REQUEST_TRANSITIONS, state_machine_figure
"""),
    md("""
    ## Two budgets
    A step can only run what fits in **both** budgets:
    - the **token budget** `max_num_batched_tokens` (compute per step), and the **sequence slots** `max_num_seqs`;
    - the **KV block budget**: the free blocks of the pool. A request's next tokens need slots; crossing a block
      boundary needs a new block.

    A waiting request is **admitted** only when its first chunk gets both tokens and blocks. A *running* request that
    needs a block when none is free forces a **preemption**: some running request (the **victim**) gives its blocks back.

    ## Why both: two toy schedulers that each check one
    Eight requests (500-token prompts, 100 output tokens each) arrive at once; the pool has 128 blocks of 16 tokens
    (2,048 token slots), the token budget is 1,024. Each toy prefills whole prompts (no chunking) and decodes one token
    per running request per step. One checks only the token budget, the other only the free blocks.
    """),
    code("""
    def blocks(tokens, bs=16):
        return -(-tokens // bs)


    def toy_run(check, requests, budget=1024, num_blocks=128):
        \"\"\"A scheduler that checks only "tokens" (the token budget) or only "kv" (the free blocks). Returns what happened.\"\"\"
        waiting, running, free, sizes = list(requests), {}, num_blocks, []   # running: id -> [tokens with K/V, outputs left]
        for step in range(1000):
            plan = {}
            for rid, (held, _) in running.items():                 # every running request decodes one token...
                new = blocks(held + 1) - blocks(held)
                if check == "kv":
                    if new > free:
                        continue                                   # ...unless the KV-only toy finds no block for it
                    free -= new
                plan[rid] = 1
            while waiting:                                         # admit whole prompts while the one check allows
                rid, prompt, out = waiting[0]
                if (check == "tokens" and sum(plan.values()) + prompt > budget) or (check == "kv" and blocks(prompt) > free):
                    break
                waiting.pop(0)
                running[rid], plan[rid] = [0, out], prompt
                free -= blocks(prompt) if check == "kv" else 0
            if check == "tokens":                                  # the token-only toy allocates after deciding
                need = sum(blocks(running[r][0] + n) - blocks(running[r][0]) for r, n in plan.items())
                if need > free:
                    return dict(outcome="out of KV memory", step=step, need=need, free=free, sizes=sizes)
                free -= need
            if not plan:
                return dict(outcome="stuck", step=step, running=len(running), waiting=len(waiting), free=free, sizes=sizes)
            sizes.append(sum(plan.values()))
            for r, n in plan.items():
                running[r][0] += n
                running[r][1] -= 1
            for r in [r for r, (_, left) in running.items() if left == 0]:
                free += blocks(running.pop(r)[0])
            if not running and not waiting:
                return dict(outcome="finished", step=step, sizes=sizes)
        return dict(outcome="ran out of steps", step=step, sizes=sizes)


    REQUESTS = [(f"r{i}", 500, 100) for i in range(8)]
    toys = {rule: toy_run(rule, REQUESTS) for rule in ("tokens", "kv")}
    for rule, r in toys.items():
        print(f"checks only {rule:6s}: {r['outcome']} at step {r['step']} (largest step {max(r['sizes'], default=0):,} tokens)", {k: v for k, v in r.items() if k not in ("outcome", "step", "sizes")})
    """),
    md("""
    The real scheduler on the same workload (modelled clock), with both budgets and preemption:
    """),
    code("""
    real = modelled_engine(block_size=16, num_kv_blocks=128, max_num_batched_tokens=1024, enable_prefix_caching=False, trace_block_tables=False)
    for rid, prompt, out in REQUESTS:
        real.add_request(rid, {"prompt_token_ids": [(7 * k + int(rid[1:])) % 2000 + 3 for k in range(prompt)]},
                         SamplingParams(temperature=0.0, max_tokens=out, ignore_eos=True))
    real_outs = run_to_completion(real)
    h100 = teaching_cost_model()
    kv_toy_big = max(toys["kv"]["sizes"])
    print(f"real scheduler: {len(real_outs)} of {len(REQUESTS)} finished in {len(real.traces)} steps, largest step "
          f"{max(t.num_scheduled_tokens for t in real.traces):,} tokens, {real.summary().num_preemptions} preemption(s), "
          f"{real.kv_cache_manager.num_free_blocks} of {real.num_kv_blocks} blocks free at the end")
    """),
    conclusion("""
    tok, kv = toys["tokens"], toys["kv"]
    big_ms = h100.cost(StepWork.of([(kv_toy_big, 0, 1)])).time_s * 1e3
    budget_ms = h100.cost(StepWork.of([(1024, 0, 1)])).time_s * 1e3
    conclude(f"The token-only toy ran **out of KV memory** at step {tok['step']}: that step needed {tok['need']} new blocks with {tok['free']} free, "
             f"because it admits by compute alone (on a GPU, an out-of-memory crash mid-step). The KV-only toy admitted as many whole prompts "
             f"as the pool held, an **oversized step** of {kv_toy_big:,} tokens ({big_ms:.0f} ms on the modelled H100 against {budget_ms:.0f} ms "
             f"for a full 1,024-token budget: every decode in it waits that long), and then got **stuck** at step {kv['step']}: every running "
             f"request needed a new block, none was free, and it has no way to take one back, so it would spin forever. The real scheduler "
             f"checks both, preempts when blocks run out ({real.summary().num_preemptions} preemption(s) here) and finished all "
             f"{len(REQUESTS)} requests without a step above the budget.",
             [("checking only tokens runs out of KV memory", tok["outcome"] == "out of KV memory"),
              ("checking only KV builds steps above the token budget", kv_toy_big > 1024),
              ("and gets stuck without preemption", kv["outcome"] == "stuck"),
              ("the real scheduler finishes everything within the budget", len(real_outs) == len(REQUESTS)
               and max(t.num_scheduled_tokens for t in real.traces) <= 1024),
              ("and leaks no block", real.kv_cache_manager.num_free_blocks == real.num_kv_blocks)])
    """),
    md("""
    ## The scheduler's step as a toy: `schedule_step`
    Here is one step of a decode-first scheduler with both budgets, chunked prefill and recompute preemption, in the
    plain words of the textbook: running requests first (in admission order), each takes the tokens it still needs up
    to what is left of the budget; if its blocks do not fit, preempt the newest running request not yet scheduled
    this step (maybe itself) and try again; then, if nobody was preempted, admit waiting requests from the front of
    the queue while budget, slots and blocks last. The check below runs it beside the real engine, step by step.
    """),
    code("""
    def schedule_step(running, waiting, free_blocks, budget, max_seqs, bs=16):
        \"\"\"One step. Requests are dicts: id, tokens (known), computed, blocks. Returns ([(id, n)], preempted ids, free_blocks).\"\"\"
        batch, preempted, scheduled = [], [], set()
        for req in list(running):
            if budget == 0 or req in preempted:
                continue
            n = min(req["tokens"] - req["computed"], budget)               # 1 for a decode, a chunk for a prefill
            while blocks(req["computed"] + n, bs) - req["blocks"] > free_blocks:   # KV budget: preempt the newest unscheduled
                victim = [r for r in running if r["id"] not in scheduled][-1]
                running.remove(victim); waiting.insert(0, victim); preempted.append(victim)
                free_blocks += victim["blocks"]; victim["blocks"] = victim["computed"] = 0
                if victim is req:
                    break
            else:
                free_blocks -= blocks(req["computed"] + n, bs) - req["blocks"]; req["blocks"] = blocks(req["computed"] + n, bs)
                batch.append((req, n)); scheduled.add(req["id"]); budget -= n
        while waiting and not preempted and budget > 0 and len(running) < max_seqs:   # admission from the front of the queue
            req = waiting[0]
            n = min(req["tokens"] - req["computed"], budget)
            if blocks(n, bs) > free_blocks:
                break
            waiting.pop(0); running.append(req); free_blocks -= blocks(n, bs); req["blocks"] = blocks(n, bs)
            batch.append((req, n)); scheduled.add(req["id"]); budget -= n
        return [(r["id"], n) for r, n in batch], [r["id"] for r in preempted], free_blocks


    def toy_serve(requests, num_blocks, budget, max_seqs):
        \"\"\"Drive schedule_step until all finish; after each step advance `computed` and sample where a step reached the end.\"\"\"
        reqs = [dict(id=rid, prompt=p, out=0, max_tokens=m, tokens=p, computed=0, blocks=0) for rid, p, m in requests]
        running, waiting, free, steps = [], list(reqs), num_blocks, []
        while running or waiting:
            batch, preempted, free = schedule_step(running, waiting, free, budget, max_seqs)
            steps.append((batch, preempted))
            for rid, n in batch:
                req = next(r for r in running if r["id"] == rid)
                req["computed"] += n
                if req["computed"] == req["tokens"]:                        # reached the end of its known tokens: sample one
                    req["out"] += 1; req["tokens"] += 1
                    if req["out"] == req["max_tokens"]:
                        running.remove(req); free += req["blocks"]
        return steps


    toy_steps = toy_serve(REQUESTS, num_blocks=128, budget=1024, max_seqs=64)
    engine_steps = [([(c.request_id, c.num_tokens) for c in t.chunks], t.preempted_ids) for t in real.traces]
    first_preemption = next(i for i, (_, p) in enumerate(engine_steps) if p)
    print(f"toy: {len(toy_steps)} steps | engine: {len(engine_steps)} steps | first preemption at step {first_preemption}")
    for i in range(first_preemption - 1, first_preemption + 2):
        print(f"step {i}: toy {toy_steps[i]} | engine {engine_steps[i]}")
    """),
    conclusion("""
    same = toy_steps == engine_steps
    conclude(f"The toy and the real engine made **the same decision at every one of the {len(engine_steps)} steps**: the same requests, "
             f"the same token counts, the same victims ({sum(len(p) for _, p in engine_steps)} preemption(s)). Everything else in "
             f"`minengine/core/` is bookkeeping around these moves: block ids, prefix-cache hits, the other policies' orders.",
             [("the toy schedule equals the engine's, step by step", same)])
    """),
    md("""
    ### vLLM's `Scheduler.schedule`, read in five steps
    vLLM v1's scheduler (`vllm/v1/core/sched/scheduler.py`) does the same in five steps; the right column is where each
    happens in minengine (the cell below reads those lines from the source, so this table cannot silently go stale).

    | # | vLLM v1 | what happens | minengine |
    |---|---|---|---|
    | 1 | `self.running`, `self.waiting` | two queues; running requests are served first (decode-first) | `Scheduler.running` / `waiting`, `DecodeFirst.fill`: `step.run_all(...)` then `step.admit_all()` |
    | 2 | `num_new_tokens = request.num_tokens_with_spec - request.num_computed_tokens`, capped by `long_prefill_token_threshold` and `token_budget` | tokens this step | `SchedulerConfig.chunk`, called by `StepBuilder.run` |
    | 3 | `self.kv_cache_manager.allocate_slots(request, num_new_tokens)`; on `None`, preempt `self.running.pop()` (or the lowest priority) and `self.waiting.prepend_request(...)` | KV allocation, preemption | `StepBuilder.run`: `self.kv.allocate_slots`, `policy.pick_victim`, `StepBuilder.preempt` (`waiting.appendleft`) |
    | 4 | `SchedulerOutput(scheduled_new_reqs=..., num_scheduled_tokens=..., ...)` | the step's plan for the model runner | `StepBuilder.build` → `SchedulerOutput` of `ScheduledRequest`s (`scheduled_request`) |
    | 5 | `update_from_output`: advance `num_computed_tokens`, append sampled tokens, check stop, free finished | write-back after the forward | `Scheduler.update_from_output` (its `commit_chunk`, `commit_sampled`) |
    """),
    code("""
    mapping = {
        "1 queues, running first": (step_builder_module.StepBuilder.unscheduled_running, "self.running"),
        "2 tokens this step": (step_builder_module.StepBuilder.run, "self.config.chunk("),
        "3 KV allocation": (step_builder_module.StepBuilder.run, "self.kv.allocate_slots(request, num_new)"),
        "3 preemption": (step_builder_module.StepBuilder.run, "self.policy.pick_victim(self.unscheduled_running()"),
        "3 re-queue at the head": (step_builder_module.StepBuilder.preempt, "self.waiting.appendleft(request)"),
        "4 SchedulerOutput": (step_builder_module.StepBuilder.scheduled_request, "ScheduledRequest("),
        "5 write-back": (scheduler_module.Scheduler.commit_chunk, "request.num_computed_tokens += s.num_new_tokens"),
    }
    found = {}
    for name, (fn, needle) in mapping.items():
        lines, first = inspect.getsourcelines(fn)
        hit = next((first + i for i, line in enumerate(lines) if needle in line), None)
        found[name] = hit
        print(f"{name:24s} {fn.__qualname__:34s} line {hit}: {needle}")
    claim("every step of the reading is at the line the table names", all(v is not None for v in found.values()))
    """),
    md("""
    ## The request state machine, on a real run
    Every request is in one `RequestStatus` (`minengine/request.py`). The diagram's nodes are the enum's members and its
    arrows the moves the engine makes (`REQUEST_TRANSITIONS`); the numbers are how often a real run took each arrow.
    PREEMPTED and SWAPPED are the statuses of requests back in the **waiting queue** (recompute and swap preemption);
    re-admission makes them RUNNING again. The run: a small pool with a small CPU swap space (so some victims are
    swapped, others recomputed), one request aborted while it waits, one with a deadline that passes.
    """),
    code("""
    machine = modelled_engine(block_size=16, num_kv_blocks=16, max_num_batched_tokens=512, preemption_mode="swap", swap_space_blocks=6,
                              enable_prefix_caching=False, trace_block_tables=False)
    recorder = StateRecorder(machine)
    arrivals = [(0, f"r{i}", {"prompt_token_ids": [(11 * i + k) % 2000 + 3 for k in range(48)]},
                 SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)) for i in range(6)]
    arrivals.append((2, "gone", {"prompt_token_ids": [5] * 20}, SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)))
    recorder.run(arrivals, aborts=[(30, "gone")])
    machine.add_request("late", {"prompt_token_ids": [7] * 20}, SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True),
                        deadline=machine.clock() + 0.05)   # 50 ms of modelled time
    while machine.has_unfinished_requests():
        recorder.step()
    state_machine_figure(recorder.pairs(), title="Request states: arrows taken in this run").show()
    for (src, dst), n in sorted(Counter(recorder.pairs()).items(), key=lambda kv: -kv[1]):
        print(f"{src.name:10s} -> {dst.name:16s} {n:3d}")
    victim = next(e.request_id for e in recorder.events if e.dst is RequestStatus.SWAPPED)
    print(f"{victim}'s life:", " -> ".join(s.name for s in recorder.history(victim)))
    """),
    conclusion("""
    taken = set(recorder.pairs())
    known = {(a, b) for a, b, _ in REQUEST_TRANSITIONS}
    must = {(RequestStatus.WAITING, RequestStatus.RUNNING), (RequestStatus.RUNNING, RequestStatus.PREEMPTED),
            (RequestStatus.PREEMPTED, RequestStatus.RUNNING), (RequestStatus.RUNNING, RequestStatus.SWAPPED),
            (RequestStatus.SWAPPED, RequestStatus.RUNNING), (RequestStatus.RUNNING, RequestStatus.FINISHED_LENGTH)}
    finished = Counter(e.dst.name for e in recorder.events if e.dst.finished)
    conclude(f"The run took **{len(taken)} of the {len(known)} arrows**, and none that the diagram lacks: {dict(finished)} finished, "
             f"victims both recomputed (PREEMPTED) and swapped (SWAPPED, while the {machine.num_swap_blocks}-block swap space had room), "
             f"each back to RUNNING when re-admitted.",
             [("every transition of the run is an arrow of the diagram", taken <= known),
              ("the run took the main path and both kinds of preemption", must <= taken),
              ("an abort and a timeout finished requests", finished["FINISHED_ABORTED"] == 1 and finished["FINISHED_TIMEOUT"] == 1),
              ("the diagram's nodes are exactly RequestStatus", {s for pair in known for s in pair} == set(RequestStatus))])
    """),
    md("""
    ## Running out of KV memory on the real engine
    A few requests with short prompts that each want many output tokens (sizes in the cell), in a pool too small to
    hold them all at full length. They are all admitted (their prompts fit), then grow until the pool is exhausted.
    """),
    code("""
    def pressure_run(num_kv_blocks, preemption_mode="recompute", n=pick(8, 6), out_len=pick(64, 40), names=None, **extra):
        eng = modelled_engine(block_size=16, num_kv_blocks=num_kv_blocks, max_num_batched_tokens=512, preemption_mode=preemption_mode,
                              enable_prefix_caching=False, trace_block_tables=True, **extra)
        names = names or [f"r{i}" for i in range(n)]   # request ids, in the order they are added
        for i in range(n):
            eng.add_request(names[i], {"prompt_token_ids": [(11 * i + k) % 2000 + 3 for k in range(48)]},
                            SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True))
        outs = run_to_completion(eng)
        return eng, {rid: o.outputs[0].token_ids for rid, o in outs.items()}


    SMALL_POOL = pick(20, 16)
    small, small_tokens = pressure_run(SMALL_POOL)
    roomy, roomy_tokens = pressure_run(256)
    titled(viz.kv_usage_figure(small.traces), f"KV blocks, {SMALL_POOL}-block pool").show()
    titled(viz.queue_figure(small.traces), f"Running and waiting, {SMALL_POOL}-block pool").show()
    """),
    conclusion("""
    s = small.summary()
    conclude(f"With {SMALL_POOL} blocks ({SMALL_POOL * 16} token slots) the run had **{s.num_preemptions} preemptions**; "
             f"with 256 blocks, {roomy.summary().num_preemptions}. Peak blocks used: {s.peak_kv_blocks_used} of {SMALL_POOL}.",
             [("the small pool forces preemptions and the roomy one none", s.num_preemptions > 0 == roomy.summary().num_preemptions)])
    """),
    md("""
    ## Who is the victim?
    The default policy preempts the **most recently admitted** running request (vLLM v1): it has the least work to
    lose, and the oldest requests keep their progress. But only among the running requests **not yet scheduled in this
    step**: a request already scheduled has its chunk, its block table and its slot mapping in the batch being built;
    freeing its blocks now would let the forward pass write K/V into blocks another request may be handed in the same
    step. So when an older request runs out of blocks after a newer one was scheduled, the older one must give way,
    even itself.

    With prefill-first, the long prompt's chunk (the newest request) is scheduled before the decode of an older
    request. When that decode crosses into a new block and none is free:
    """),
    code("""
    victim_engine = modelled_engine(block_size=16, num_kv_blocks=14, max_num_batched_tokens=64, long_prefill_token_threshold=63,
                                    scheduling_policy="prefill-first", enable_prefix_caching=False, trace_block_tables=True)
    run_with_arrivals(victim_engine, [
        (0, "old", {"prompt_token_ids": [(3 * k) % 2000 + 3 for k in range(30)]}, SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)),
        (1, "new", {"prompt_token_ids": [(5 * k) % 2000 + 3 for k in range(200)]}, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))])
    victim_step = next(t for t in victim_engine.traces if "old" in t.preempted_ids)
    print(f"step {victim_step.step}: scheduled {[(c.request_id, c.start_pos, c.num_tokens) for c in victim_step.chunks]}, "
          f"preempted {victim_step.preempted_ids}")
    """),
    conclusion("""
    admitted_at = {rid: next(t.step for t in victim_engine.traces if rid in t.admitted_ids) for rid in ("old", "new")}
    conclude(f"At step {victim_step.step} the newest running request, `new` (admitted at step {admitted_at['new']}), already had its "
             f"{victim_step.chunks[0].num_tokens}-token chunk in the batch when `old` (admitted at step {admitted_at['old']}) needed a block: "
             f"the only request not yet scheduled was `old` itself, so **`old` was preempted**, not the newest. The trace shows the rule: "
             f"a victim is never one of the step's scheduled chunks.",
             [("the newest request was already scheduled in the preemption step", any(c.request_id == "new" for c in victim_step.chunks)
               and admitted_at["new"] > admitted_at["old"]),
              ("the victim was the older, unscheduled one", victim_step.preempted_ids == ["old"]),
              ("in every run of this chapter, no victim is scheduled in its own step", all(
                  not set(t.preempted_ids) & {c.request_id for c in t.chunks}
                  for eng in (victim_engine, small, real, machine) for t in eng.traces))])
    """),
    md("""
    ## Where does the victim go? The head of the queue: last preempted, first back
    `StepBuilder.preempt` puts a victim at the **front** of the waiting queue (`appendleft`), and admission takes the
    front. Newcomers join at the back. So a victim comes back before any request that arrived after it, and among
    several victims waiting at once the **last one preempted is the first re-admitted** (a stack). Since each victim was
    the newest running request when it was chosen, the stack gives them back in their original admission order:
    first come, first served is preserved. The small-pool run, replayed as a queue:
    """),
    code("""
    def readmissions(eng):
        \"\"\"(predicted, actual): each re-admission of ``eng``'s run as a queue with victims at the front predicts it, and
        as the trace records it.\"\"\"
        queue, predicted, actual = [], [], []
        for t in eng.traces:
            for rid in t.preempted_ids:
                queue.insert(0, rid)                              # appendleft
            for rid in t.admitted_ids:
                if rid in queue:                                  # a re-admission
                    predicted.append(queue.pop(0)); actual.append(rid)
        return predicted, actual


    predicted, actual = readmissions(small)
    victims = [rid for t in small.traces for rid in t.preempted_ids]
    print("preempted, in order:  ", victims)
    print("re-admitted, in order:", actual)
    """),
    conclusion("""
    first_wave = [rid for t in small.traces for rid in t.preempted_ids][:3]
    order = [rid for rid in actual if rid in first_wave][:3]
    conclude(f"Victims left in the order {first_wave} and came back as {order}: **last preempted, first re-admitted**, which is "
             f"their original admission order. Every re-admission was the request at the head of the queue, as predicted.",
             [("each re-admission took the head of the queue", predicted == actual),
              ("the first victims came back in reverse order", order == first_wave[::-1])])
    """),
    md("""
    ## Output unchanged after preemption
    Recompute preemption forgets the K/V but keeps the generated tokens; re-admission prefills prompt + output so far,
    and decoding continues where it stopped. Greedy decoding must give the same tokens as the roomy run; so must seeded
    sampling, because the engine draws token *i* of a seeded request from a generator seeded by `(seed, i)`.
    """),
    conclusion("""
    greedy_same = small_tokens == roomy_tokens
    seeded, seeded_preemptions = {}, {}
    for pool_blocks in (SMALL_POOL, 256):
        eng = modelled_engine(num_kv_blocks=pool_blocks, enable_prefix_caching=False, trace_block_tables=False)
        for i in range(pick(8, 6)):
            eng.add_request(f"s{i}", {"prompt_token_ids": [(11 * i + k) % 2000 + 3 for k in range(48)]},
                            SamplingParams(temperature=1.0, seed=100 + i, max_tokens=pick(64, 40), ignore_eos=True))
        seeded[pool_blocks] = {rid: o.outputs[0].token_ids for rid, o in run_to_completion(eng).items()}
        seeded_preemptions[pool_blocks] = eng.summary().num_preemptions
    seeded_same = seeded[SMALL_POOL] == seeded[256]
    conclude(f"Greedy outputs identical with and without preemption: **{greedy_same}**. Seeded sampling "
             f"({seeded_preemptions[SMALL_POOL]} preemptions): **{seeded_same}**.",
             [("greedy output survives preemption", greedy_same), ("seeded sampling survives it", seeded_same),
              ("there were preemptions to survive", seeded_preemptions[SMALL_POOL] > 0)])
    """),
    md("""
    ## Recompute vs swap
    **Recompute** frees the victim's blocks and later prefills its tokens again: costs compute. **Swap** copies the
    blocks to CPU memory and back: costs transfer bandwidth, and CPU memory (`swap_space_blocks`). The PagedAttention
    paper (section 7.3, Fig. 19) measured swap losing for small blocks (many small PCIe transfers), winning for large
    ones, and the two comparable at 16-64 tokens per block; vLLM v1 only recomputes. The modelled clock charges a swap
    its bytes over the H100's PCIe link and a recompute its extra prefill tokens.
    """),
    code("""
    def preemption_cost(eng):
        prompt = sum(m.num_prompt_tokens for m in eng.request_metrics.values())
        computed = sum(t.num_prefill_tokens for t in eng.traces)
        return computed - prompt          # prefill tokens computed beyond each prompt once = recomputed tokens


    modes = {}
    for mode in ("recompute", "swap"):
        eng, tokens = pressure_run(SMALL_POOL, preemption_mode=mode)
        s = eng.summary()
        modes[mode] = (eng, tokens)
        print(f"{mode:9s}: preemptions {s.num_preemptions:3d} | recomputed tokens {preemption_cost(eng):5d} | "
              f"swapped out/in blocks {s.num_swapped_out_blocks}/{s.num_swapped_in_blocks} | "
              f"modelled duration {s.duration_s * 1000:.1f} ms | same output {tokens == roomy_tokens}")
    claim("both modes give the unpreempted output", all(tokens == roomy_tokens for _, tokens in modes.values()))
    """),
    md("""
    With 48-token prompts the two modes end within a few milliseconds of each other. Which wins depends on what a victim
    holds: recomputing its context is a prefill, nearly free while it rides in a memory-bound step and paid in FLOPs once
    it is long; swapping it moves its KV bytes over PCIe twice (out and back). The same contest with longer victims: four
    requests with prompts of `L` tokens in a pool holding their prompts and one spare block each, so they preempt each
    other as they decode (lengths in the table):
    """),
    code("""
    from minengine.timing import StepCostModel


    def contest(prompt_len, preemption_mode, n=4, out_len=48):
        pool = n * -(-prompt_len // 16) + n
        eng = modelled_engine(block_size=16, num_kv_blocks=pool, max_num_batched_tokens=2048, preemption_mode=preemption_mode,
                              swap_space_blocks=pool, enable_prefix_caching=False, trace_block_tables=False, max_model_len=4096)
        for i in range(n):
            eng.add_request(f"r{i}", {"prompt_token_ids": [(11 * i + k) % 2000 + 3 for k in range(prompt_len)]},
                            SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True))
        outs = run_to_completion(eng)
        return eng, {rid: o.outputs[0].token_ids for rid, o in outs.items()}


    LENGTHS = pick([64, 512, 2048], [64, 1024])
    versus = {}
    for L in LENGTHS:
        (rec, rec_out), (swp, swp_out) = contest(L, "recompute"), contest(L, "swap")
        versus[L] = dict(recompute=rec.summary().duration_s, swap=swp.summary().duration_s, same=rec_out == swp_out,
                         preemptions=(rec.summary().num_preemptions, swp.summary().num_preemptions),
                         recomputed=preemption_cost(rec), swapped=swp.summary().num_swapped_out_blocks + swp.summary().num_swapped_in_blocks)
        v = versus[L]
        print(f"L = {L:5,}: recompute {v['recompute'] * 1000:6.1f} ms ({v['preemptions'][0]} preemptions, {v['recomputed']:5,} tokens recomputed) | "
              f"swap {v['swap'] * 1000:6.1f} ms ({v['preemptions'][1]} preemptions, {v['swapped']} blocks moved) | same output {v['same']}")
    cm = teaching_cost_model()
    per_token = {"recompute": cm.cost(StepWork.of([(2048, 0, 1)])).time_s / 2048,
                 "swap": cm.cost(StepWork.of([(1, 2048, 1)], num_swap_out_blocks=128, num_swap_in_blocks=128)).swap_time_s / 2048}
    print(f"cost model, per token of a 2,048-token victim: recompute {per_token['recompute'] * 1e6:.1f} us (a prefill), "
          f"swap out and back {per_token['swap'] * 1e6:.1f} us ({cm.label})")
    """),
    conclusion("""
    short, long_ = versus[LENGTHS[0]], versus[LENGTHS[-1]]
    gap = {L: v["recompute"] - v["swap"] for L, v in versus.items()}
    small_blocks = StepCostModel(cm.hardware, cm.shape, block_size=8, engine=cm.engine)
    bytes_only = (small_blocks.cost(StepWork.of([(1, 100, 1)], 8, 8)).swap_time_s == cm.cost(StepWork.of([(1, 100, 1)], 4, 4)).swap_time_s)
    conclude(f"On the modelled clock **swap won or tied every contest, and its lead grows with the victim's context**: with {LENGTHS[0]}-token prompts the "
             f"two modes ended {abs(gap[LENGTHS[0]]) * 1000:.1f} ms apart ({short['recompute'] * 1000:.1f} vs {short['swap'] * 1000:.1f} ms, "
             f"{abs(gap[LENGTHS[0]]) / short['swap']:.1%}); with {LENGTHS[-1]:,}-token prompts recompute took **{gap[LENGTHS[-1]] * 1000:.1f} ms "
             f"longer** ({long_['recompute'] * 1000:.1f} vs {long_['swap'] * 1000:.1f} ms, {gap[LENGTHS[-1]] / long_['swap']:.1%}), after "
             f"recomputing {long_['recomputed']:,} tokens. Per token of a 2,048-token victim the cost model charges {per_token['recompute'] * 1e6:.1f} us of "
             f"compute-bound prefill to recompute it and {per_token['swap'] * 1e6:.1f} us of PCIe to swap it out and back. Both gave the same text. The model charges a swap "
             f"by its bytes alone (16 blocks of 8 tokens cost what 8 blocks of 16 do), without the per-transfer cost that made small-block "
             f"swaps lose in PagedAttention's Fig. 19, so it cannot show that half of the paper's result.",
             [("every contest preempted", all(min(v["preemptions"]) > 0 for v in versus.values())),
              ("swap is never slower", all(g >= 0 for g in gap.values())),
              ("short victims: within 1 %", abs(gap[LENGTHS[0]]) < 0.01 * short["swap"]),
              ("the lead grows with the context", all(a < b for a, b in zip([gap[L] for L in LENGTHS], [gap[L] for L in LENGTHS][1:]))),
              ("long victims: swap more than 1 % faster", gap[LENGTHS[-1]] > 0.01 * long_["swap"]),
              ("per token, a long recompute costs more than a swap", per_token["recompute"] > per_token["swap"]),
              ("same output either way", all(v["same"] for v in versus.values())),
              ("the model charges swaps by bytes only", bytes_only)])
    """),
    md("""
    ## The admission probe
    With `shrink_prefill_chunks=True`, a new prompt whose chunk needs more blocks than are free is admitted with a
    smaller chunk (down to one block) instead of waiting for a whole chunk's worth of memory. Does starting early pay?
    Four requests decode in a 40-block pool, and a 400-token prompt arrives at step 2, when fewer blocks are free than
    its chunk needs:
    """),
    code("""
    def probe_run(shrink):
        eng = modelled_engine(block_size=16, num_kv_blocks=40, max_num_batched_tokens=512, shrink_prefill_chunks=shrink,
                              enable_prefix_caching=False, trace_block_tables=False)
        arrivals = [(0, f"d{i}", {"prompt_token_ids": [(3 * i + k) % 2000 + 3 for k in range(100)]},
                     SamplingParams(temperature=0.0, max_tokens=pick(40, 24), ignore_eos=True)) for i in range(4)]
        arrivals.append((2, "big", {"prompt_token_ids": [(5 * k) % 2000 + 3 for k in range(400)]}, SamplingParams(temperature=0.0, max_tokens=2)))
        run_with_arrivals(eng, arrivals)
        first = next(t for t in eng.traces if "big" in t.admitted_ids)
        return dict(step=first.step, chunk=next(c.num_tokens for c in first.chunks if c.request_id == "big"),
                    ttft=eng.request_metrics["big"].ttft, preempted=sum(t.preempted_ids.count("big") for t in eng.traces),
                    prefilled=sum(c.num_tokens for t in eng.traces for c in t.chunks if c.request_id == "big" and c.is_prefill))


    probe_results = {shrink: probe_run(shrink) for shrink in (False, True)}
    for shrink, r in probe_results.items():
        print(f"shrink_prefill_chunks={shrink!s:5s}: 'big' admitted at step {r['step']} with a {r['chunk']}-token first chunk, "
              f"preempted {r['preempted']} times, {r['prefilled']} prompt tokens computed for its 400, TTFT {r['ttft'] * 1000:.1f} ms")
    """),
    conclusion("""
    off, on = probe_results[False], probe_results[True]
    ttft_change = on["ttft"] / off["ttft"] - 1
    verdict = (f"its TTFT was no better ({off['ttft'] * 1000:.1f} -> {on['ttft'] * 1000:.1f} ms, {ttft_change:+.1%})" if ttft_change > -0.05 else
               f"its TTFT still fell from {off['ttft'] * 1000:.1f} to {on['ttft'] * 1000:.1f} ms")
    conclude(f"The probe let the big prompt start **{off['step'] - on['step']} steps earlier** with a {on['chunk']}-token chunk instead of "
             f"{off['chunk']}, but {verdict}. The four decodes needed the free blocks to grow (a new block every 16 tokens), so the prompt, "
             f"the request admitted last, was preempted **{on['preempted']} times** (none without the probe) and recomputed: "
             f"{on['prefilled']:,} prompt tokens computed for its 400. Starting early pays only when the blocks it takes stay free "
             f"(headroom in the pool, decodes near their end); otherwise it trades waiting for thrashing. vLLM's scheduler, too, leaves a "
             f"new request waiting when its chunk's blocks are not free.",
             [("the probe admits the prompt earlier", on["step"] < off["step"]), ("with a smaller first chunk", on["chunk"] < off["chunk"]),
              ("the early start is preempted and recomputed", on["preempted"] > 0 == off["preempted"] and on["prefilled"] > 400 == off["prefilled"])])
    """),
    md("""
    ## One number for progress: computed vs pending tokens
    A request is a list of tokens (its prompt, then its outputs) and **one number**, `num_computed_tokens`: how many of
    those tokens already have their K/V in the cache. The rest are **pending**. Every step the scheduler gives a request
    some of its pending tokens (vLLM's `num_tokens_with_spec - num_computed_tokens`, step 2 of the reading above), and the
    write-back (step 5) moves the number forward by what the step computed. Every mechanism of the course moves it:
    - **chunked prefill**: a long prompt's pending tokens are taken a budget's worth at a time (chapter 4);
    - **a prefix cache hit**: admission sets the number to the cached tokens, computing none of them (chapter 5);
    - **a decode**: once a token is sampled, exactly one token is pending, that token itself (its K/V is not written yet);
    - **recompute preemption**: the number falls back to 0, and every token, outputs included, is pending again;
    - **speculative decoding** (`speculative_config`, prompt lookup): a proposer appends up to k *guessed* tokens to a
      decode's one pending token, copied from where the request's last n-gram occurred earlier in its own text; the step
      computes all 1 + k, the sampler compares each guess with the model's own choice at that position, and the number
      advances by 1 + the accepted guesses. Rejected guesses are dropped (their slots are overwritten later).

    The run: `first` (its prompt takes two chunks under a 32-token budget), then `second`, whose prompt shares the first
    48 tokens (three full blocks), with n-gram speculation on (k = 4). Each row is one request's part of one step, read
    from the trace: `start_pos` is `num_computed_tokens` before the step.
    """),
    code("""
    from minengine.core.spec_decode import SpecDecodeStats
    from minengine.workloads import SHAKESPEARE_OPENINGS

    SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    progress = modelled_engine(max_num_batched_tokens=32, block_size=16, num_kv_blocks=64, speculative_config=SPEC, trace_block_tables=False)
    shared = " ".join(SHAKESPEARE_OPENINGS[:3])
    greedy = SamplingParams(temperature=0.0, max_tokens=pick(64, 48), ignore_eos=True)
    run_with_arrivals(progress, [(0, "first", shared + "\\nROMEO:", greedy), (4, "second", shared + "\\nJULIET:", greedy)])


    def progress_rows(engine):
        \"\"\"One row per (step, request): num_computed_tokens before and after, pending, scheduled, guesses accepted/rejected.\"\"\"
        rows, outputs = [], Counter()
        prompt_len = {rid: m.num_prompt_tokens for rid, m in engine.request_metrics.items()}
        for t in engine.traces:
            for c in t.chunks:
                kind = "prefill chunk" if c.is_prefill else f"decode + {c.num_spec_tokens} guesses" if c.num_spec_tokens else "decode"
                rows.append(dict(step=t.step, request=c.request_id, kind=kind, before=c.start_pos,
                                 pending=prompt_len[c.request_id] + outputs[c.request_id] - c.start_pos, scheduled=c.num_tokens,
                                 guesses=c.num_spec_tokens, accepted=c.num_accepted_tokens, rejected=c.num_rejected_tokens,
                                 after=c.start_pos + c.num_tokens - c.num_rejected_tokens, hit=t.prefix_hit_tokens))
                if c.sampled:
                    outputs[c.request_id] += 1 + c.num_accepted_tokens
        return rows


    rows = progress_rows(progress)
    print("step  request  kind                 computed before  pending  scheduled  accepted  rejected  computed after")
    shown = rows[:8] + [r for r in rows[8:] if r["accepted"]][:3]   # the first steps, then the first accepted guesses
    for r in shown:
        print(f"{r['step']:4d}  {r['request']:7s}  {r['kind']:19s}  {r['before']:15d}  {r['pending']:7d}  {r['scheduled']:9d}  "
              f"{r['accepted']:8d}  {r['rejected']:8d}  {r['after']:14d}")
    print(SpecDecodeStats.of_steps(progress.traces))
    """),
    conclusion("""
    by_request = {rid: [r for r in rows if r["request"] == rid] for rid in ("first", "second")}
    continuous = all(a["after"] == b["before"] for rs in by_request.values() for a, b in zip(rs, rs[1:]))
    first_chunks = [r for r in by_request["first"] if r["kind"] == "prefill chunk"]
    second_start = by_request["second"][0]
    decodes = [r for r in rows if r["kind"] != "prefill chunk"]
    drafted = [r for r in decodes if r["guesses"]]
    took = next(r for r in drafted if r["accepted"])
    missed = next(r for r in drafted if r["rejected"])
    conclude(f"One number tells the whole story. `first` prefilled in **{len(first_chunks)} chunks** ({', '.join(str(r['scheduled']) for r in first_chunks)} "
             f"tokens); `second` started at **`num_computed_tokens` = {second_start['before']}**, the {second_start['hit']} tokens the prefix "
             f"cache held, and computed only its other {second_start['scheduled']}. Every decode had exactly **1** pending token; "
             f"{len(drafted)} of the {len(decodes)} decodes also carried guesses. At step {took['step']}, `{took['request']}` computed "
             f"{took['scheduled']} tokens, {took['accepted']} guesses were accepted, and the number moved {took['before']} -> {took['after']} "
             f"(1 + {took['accepted']}); at step {missed['step']}, {missed['rejected']} of {missed['guesses']} guesses were rejected and it moved "
             f"{missed['before']} -> {missed['after']}. Across all {len(rows)} rows each step began exactly where the last one ended.",
             [("each step of a request starts where its previous one ended", continuous),
              ("the long prompt was chunked, from 0", len(first_chunks) >= 2 and first_chunks[0]["before"] == 0),
              ("the second prompt started at its prefix hit", second_start["before"] == second_start["hit"] > 0),
              ("a decode has exactly one pending token", all(r["pending"] == 1 for r in decodes)),
              ("speculation advanced by 1 + accepted guesses", all(r["after"] - r["before"] == 1 + r["accepted"] for r in drafted))])
    """),
    md("""
    ### Speculative decoding on the modelled clock
    Why guess? A decode step is memory-bound (chapter 1): verifying 4 guesses costs about what computing 1 token costs, so
    every accepted guess is a token for free. Prompt lookup (Saxena 2023; vLLM's `method="ngram"`) needs no draft model:
    it works when text repeats, as code edits, quotes and this tiny model's loops do. Greedy output cannot change: a guess
    is kept only where it equals the model's own argmax (Leviathan et al. 2023). Four requests, with and without it:
    """),
    code("""
    def spec_run(spec, max_tokens=pick(96, 48)):
        eng = modelled_engine(max_num_batched_tokens=256, speculative_config=spec, trace_block_tables=False)
        for i, prompt in enumerate(SHAKESPEARE_OPENINGS[:4]):
            eng.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        outs = run_to_completion(eng)
        return eng, {rid: list(o.outputs[0].token_ids) for rid, o in outs.items()}


    spec_runs = {"off": spec_run(None), "ngram, k = 4": spec_run(SPEC)}
    for name, (eng, _) in spec_runs.items():
        s = eng.summary()
        print(f"{name:13s} steps {s.num_steps:4d} | tokens computed {sum(t.num_scheduled_tokens for t in eng.traces):5d} | "
              f"accepted/proposed {s.spec_accepted_tokens}/{s.spec_draft_tokens} | TPOT P50 {s.tpot_p50 * 1000:5.2f} ms | "
              f"duration {s.duration_s * 1000:6.1f} ms (modelled)")
    h100 = teaching_cost_model()
    verify_ratio = h100.cost(StepWork.of([(5, 100, 5)] * 4)).time_s / h100.cost(StepWork.of([(1, 100, 1)] * 4)).time_s
    print(f"4 decodes verifying 4 guesses each cost {verify_ratio:.3f}x 4 plain decodes ({h100.label})")
    """),
    conclusion("""
    (off, off_tokens), (on, on_tokens) = spec_runs["off"], spec_runs["ngram, k = 4"]
    so, sn = off.summary(), on.summary()
    computed = {name: sum(t.num_scheduled_tokens for t in eng.traces) for name, (eng, _) in spec_runs.items()}
    conclude(f"With prompt lookup the model accepted **{sn.spec_accepted_tokens} of {sn.spec_draft_tokens}** guesses "
             f"({sn.spec_acceptance_rate:.0%}); a drafted decode yielded {sn.spec_mean_acceptance_length:.2f} tokens on average. The same "
             f"greedy text took **{sn.num_steps} steps instead of {so.num_steps}**, and the modelled run {sn.duration_s * 1000:.0f} ms instead of "
             f"{so.duration_s * 1000:.0f} ms (TPOT P50 {sn.tpot_p50 * 1000:.2f} vs {so.tpot_p50 * 1000:.2f} ms), although the engine computed "
             f"{computed['ngram, k = 4'] - computed['off']} more tokens (the rejected guesses): on the modelled H100 a decode step verifying "
             f"4 guesses costs **{verify_ratio:.3f}x** a plain one. Guesses are paid in budget tokens and KV slots, so they help only while "
             f"decode steps are memory-bound and enough of them are accepted.",
             [("greedy output is unchanged", on_tokens == off_tokens),
              ("speculation took fewer steps and less modelled time", sn.num_steps < so.num_steps and sn.duration_s < so.duration_s),
              ("the extra tokens computed are exactly the rejected guesses", computed["ngram, k = 4"] - computed["off"] == sn.spec_draft_tokens - sn.spec_accepted_tokens > 0),
              ("a verifying step costs within 5 % of a plain decode", verify_ratio < 1.05)])
    """),
    md("""
    ## Try it: how many guesses?
    Change k and the n-gram lengths, press *Run*: more guesses per step accept more tokens per step when the text repeats,
    and waste more budget when it does not.
    """),
    code("""
    import ipywidgets as widgets


    def speculate(k=4, prompt_lookup_min=1, prompt_lookup_max=3):
        eng, tokens = spec_run({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": prompt_lookup_min,
                                "prompt_lookup_max": max(prompt_lookup_min, prompt_lookup_max)})
        s = eng.summary()
        print(f"k={k}: accepted {s.spec_accepted_tokens} of {s.spec_draft_tokens} ({s.spec_acceptance_rate:.0%}), "
              f"{s.num_steps} steps (off: {spec_runs['off'][0].summary().num_steps}), modelled {s.duration_s * 1000:.0f} ms, "
              f"greedy output unchanged: {tokens == spec_runs['off'][1]}")


    widgets.interact_manual(speculate, k=widgets.IntSlider(value=4, min=1, max=8), prompt_lookup_min=widgets.IntSlider(value=1, min=1, max=5),
                            prompt_lookup_max=widgets.IntSlider(value=3, min=1, max=5))
    """),
    md("## Try it: pool size vs preemptions"),
    code("""
    import ipywidgets as widgets


    def pool(num_kv_blocks=SMALL_POOL, preemption_mode="recompute"):
        eng, tokens = pressure_run(num_kv_blocks, preemption_mode=preemption_mode)
        s = eng.summary()
        print(f"{num_kv_blocks} blocks, {preemption_mode}: {s.num_preemptions} preemptions, TPOT P99 {s.tpot_p99 * 1000:.1f} ms (modelled), "
              f"output identical to the roomy run: {tokens == roomy_tokens}")
        titled(viz.kv_usage_figure(eng.traces), f"KV blocks, {num_kv_blocks}-block pool, {preemption_mode}").show()


    widgets.interact_manual(pool, num_kv_blocks=widgets.IntSlider(value=SMALL_POOL, min=8, max=64),
                            preemption_mode=widgets.Dropdown(options=["recompute", "swap"]))
    """),
    *exercise(1, """
        A waiting request has a `prompt_len`-token prompt and the token budget lets it run in one chunk. Write
        `answer_1(prompt_len, block_size)`: how many free KV blocks does its admission need? The check admits prompts of several
        lengths (some a multiple of the block size, some not) on the engine, with block sizes 16 and 32, and reads their block tables.
        """, "ceil(prompt / block_size): a partly filled last block is a whole block.", "answer_1",
        "answer_1 = lambda prompt_len, block_size: math.ceil(prompt_len / block_size)",
        """
        def admitted_blocks(block_size, lengths):
            eng = modelled_engine(block_size=block_size, enable_prefix_caching=False, trace_block_tables=True)
            out = []
            for n in lengths:
                eng.add_request(f"x{n}", {"prompt_token_ids": [9] * n}, SamplingParams(temperature=0.0, max_tokens=1))
                run_to_completion(eng)
                first = next(t for t in eng.traces if any(c.request_id == f"x{n}" for c in t.chunks))
                out.append(((n, block_size), len(first.block_tables[f"x{n}"])))
            return out


        cases_1 = admitted_blocks(16, (100, 96, 97, 16, 1)) + admitted_blocks(32, (100, 96, 64, 33))
        check_function("Exercise 1: blocks to admit", answer_1, cases_1)
        """, wrong=["answer_1 = lambda prompt_len, block_size: prompt_len // block_size  # the partly filled last block is a block too",
                    "answer_1 = lambda prompt_len, block_size: prompt_len // block_size + 1  # one too many when the block size divides the prompt",
                    "answer_1 = lambda prompt_len, block_size: math.ceil((prompt_len + 1) / block_size)  # no slot is reserved for the first output token yet",
                    "answer_1 = lambda prompt_len, block_size: math.ceil(prompt_len / block_size) + 1  # no block is reserved for output tokens not yet generated",
                    "answer_1 = lambda prompt_len, block_size: prompt_len / block_size"]),
    *exercise(2, """
        Predict the first victim of the small-pool run **without** reading `preempted_ids`: replay the trace up to the step of
        the first preemption and take the most recently admitted request that is still running. Store its id.
        """, "Walk `small.traces`: append `admitted_ids`, remove `finished_ids`, stop at the first step with `preempted_ids`.", "answer_2",
        """
        running = []
        for t in small.traces:
            if t.preempted_ids:
                break
            running += t.admitted_ids
            running = [r for r in running if r not in t.finished_ids]
        answer_2 = running[-1]
        """,
        """
        first_preemption = next(t for t in small.traces if t.preempted_ids)
        check("Exercise 2: the first victim", answer_2, first_preemption.preempted_ids[0])
        """, wrong=["answer_2 = small.traces[0].admitted_ids[0]  # the oldest is the one that keeps its progress",
                    "answer_2 = max(small.request_metrics, key=lambda r: small.request_metrics[r].num_prompt_tokens)  # not the longest"]),
    *exercise(3, """
        In the small-pool run the first three victims, in the order they were preempted, are `first_wave`. In which order are
        they re-admitted? Write `answer_3(wave)`: given the first three victims of a run in the order they were preempted, the
        list of their ids in the order they come back, predicted from how `StepBuilder.preempt` re-queues (not read from the
        trace). The check calls it on the small-pool run and on the same run with its requests named so that the id order is
        not the admission order, and compares with the trace.
        """, "Each victim goes to the front of the waiting queue, and admission takes the front.", "answer_3",
        "answer_3 = lambda wave: list(reversed(wave))",
        """
        def first_wave_and_order(eng):
            wave = [rid for t in eng.traces for rid in t.preempted_ids][:3]
            return wave, [rid for rid in readmissions(eng)[1] if rid in wave][:3]


        scrambled = pressure_run(SMALL_POOL, names=[f"q{(5 * i + 3) % 8}" for i in range(pick(8, 6))])[0]  # added as q3, q0, q5, ...
        cases_3 = [((wave,), order) for wave, order in map(first_wave_and_order, (small, scrambled))]
        claim("on one run the id order is not the re-admission order", any(sorted(order) != order for _, order in cases_3))
        check_function("Exercise 3: re-admission order", answer_3, cases_3)
        """, wrong=["answer_3 = lambda wave: list(wave)  # a victim re-queued at the tail would come back first-in-first-out",
                    "answer_3 = lambda wave: [wave[0], wave[2], wave[1]]",
                    "answer_3 = lambda wave: sorted(wave)  # id order: the admission order only when ids were given in that order",
                    "answer_3 = lambda wave: list(reversed(first_wave))  # the small run's answer, whatever the run",
                    "answer_3 = lambda wave: wave[-1:] + wave[:-1]  # only the last victim jumps the queue"]),
    *exercise(4, """
        A decode carries `k` guesses and the model accepts the first `accepted` of them. By how much does the request's
        `num_computed_tokens` advance in that step? Write `advance(k, accepted)`; the check compares it with what the engine
        did in the progress run above (each drafted decode's next `start_pos` minus its own), for every (k, accepted) seen there.
        """, """
        Which positions got K/V written that the request will keep? The decode's own pending token, and each accepted guess.
        """, "answer_4",
        "answer_4 = lambda k, accepted: 1 + accepted",
        """
        observed = {}
        for rs in by_request.values():
            for a, b in zip(rs, rs[1:]):
                if a["guesses"]:
                    observed[(a["guesses"], a["accepted"])] = b["before"] - a["before"]
        check_function("Exercise 4: num_computed_tokens after verifying guesses", answer_4, sorted(observed.items()))
        """, wrong=["answer_4 = lambda k, accepted: accepted  # the decode's own token is computed too",
                    "answer_4 = lambda k, accepted: 1 + k  # rejected guesses are not kept",
                    "answer_4 = lambda k, accepted: 1  # accepted guesses were computed by the same forward"]),
    *question("why can speculative decoding never change a greedy output?", """
        The run with guesses produced exactly the tokens of the run without. Why is that guaranteed, and what changes with
        temperature > 0?
        """, """
        A guess is kept only if it equals the token the model itself picks at that position, computed in the same forward
        with exactly the K/V it would have had (the guesses before it were accepted, so the context is the true one); the first
        mismatch is replaced by the model's own token and everything after it is dropped (checked: speculation advanced by 1 + accepted guesses). So the accepted tokens are the greedy
        tokens. With sampling, a guess is kept with the probability the model gives it (rejection sampling, Leviathan et al.
        2023; for a guess from an n-gram, which has no probabilities of its own, that is: keep it if the sampled token equals
        it), so the output *distribution* is unchanged, though one seeded run need not give the same text.
        """),
    *question("what if the text never repeats?", """
        Prompt lookup copies what followed the last n-gram earlier in the request. What does speculation cost on text with no
        repeated n-grams, and when would it make a busy server slower?
        """, """
        With no earlier occurrence there is no proposal, so the decode carries no guesses and the extra cost is the n-gram lookup. With matches that are usually wrong, each guess takes a token of the step budget and a KV slot and
        is then thrown away; when the batch is large enough that decode steps approach the compute roof (chapter 1's ridge),
        those extra tokens cost real time, and the token budget they take delays other requests' prefill chunks. That is why
        engines turn speculation down at high load.
        """),
    *question("why can the victim not be a request already scheduled this step?", """
        In the victim experiment the older request was preempted although a newer one was running. What would go wrong if
        the scheduler preempted `new`, whose chunk was already in the step being built?
        """, """
        `new`'s chunk is already in the batch: its slot mapping points into its blocks, and its block table is part of the
        step's `SchedulerOutput`. Preempting it would free those blocks while the step still refers to them; they could be
        handed to another request in the same step (or the next), and the forward would write `new`'s K/V into blocks that
        belong to someone else, or read garbage. Taking the step's chunk back out is possible but costs bookkeeping; vLLM and
        minengine simply choose among requests not yet scheduled.
        """),
    *question("what if victims were re-queued at the tail?", """
        `StepBuilder.preempt` puts a victim at the head of the waiting queue. What would happen under steady traffic if it went
        to the tail instead?
        """, """
        Every request that arrived after the victim would be admitted before it, and each new admission takes the blocks the
        victim needs; under steady load the victim could wait indefinitely (starvation), while its generated tokens and, for
        swap, its swap blocks stay allocated. At the head it comes back as soon as memory allows, and several victims come
        back newest-first, which restores their original arrival order.
        """),
    *summary([
        "A step runs only what fits the token budget, the sequence slots and the free KV blocks: a scheduler that checks only tokens runs out of KV mid-step, one that checks only blocks builds oversized steps and gets stuck without preemption (checked: checking only tokens runs out of KV memory; checking only KV builds steps above the token budget; and gets stuck without preemption).",
        "The step is a short loop (running first, chunk to the budget, allocate or preempt, admit from the head); vLLM's `Scheduler.schedule` is the same five moves, minengine's `StepBuilder` + `Scheduler.update_from_output`.",
        "Requests move WAITING -> RUNNING -> FINISHED_*, and RUNNING -> PREEMPTED or SWAPPED (waiting again) -> RUNNING; abort and timeout end any unfinished state.",
        "The victim is the newest running request not yet scheduled this step; it is re-queued at the head, so victims come back last-preempted-first, in their original order.",
        "Recompute frees blocks and prefills again (compute); swap copies blocks out and back (bandwidth, CPU memory); neither changes the output, and on the modelled H100 swap's lead grows with the victim's context (checked: the lead grows with the context). The admission probe shrinks a new chunk to the free blocks (checked: with a smaller first chunk).",
        "A request's progress is one number, `num_computed_tokens`, against its tokens: chunked prefill takes pending tokens a budget at a time, a prefix hit sets the number without computing, a decode has one pending token, recompute resets it, and speculative decoding adds guessed tokens that advance it by 1 + the accepted ones.",
    ]),
    *glossary([
        ("admission", "准入", "moving a waiting request into the running batch"),
        ("preemption", "抢占", "taking a running request's KV blocks back"),
        ("victim", "牺牲者", "the request chosen to be preempted"),
        ("recompute", "重算", "preemption by freeing K/V and prefilling again"),
        ("swap", "换出 / 换入", "preemption by copying K/V to CPU memory and back"),
        ("KV block budget", "KV 块预算", "the free blocks of the pool"),
        ("admission probe", "准入探测", "shrinking a new chunk until its blocks fit"),
        ("sequence slot", "序列槽位", "one place among `max_num_seqs` running requests"),
        ("state machine (`RequestStatus`)", "状态机", "the states a request moves through and the moves between them"),
        ("computed / pending tokens (`num_computed_tokens`)", "已计算 / 待计算词元", "tokens with K/V in the cache / the rest of the request's tokens"),
        ("speculative decoding", "投机解码", "guess several tokens, verify them in one forward, keep the accepted ones"),
        ("prompt lookup (n-gram proposer)", "提示词查找（n 元组提议器）", "guesses copied from what followed the last n-gram earlier in the request"),
    ]),
]

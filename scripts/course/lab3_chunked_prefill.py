# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Lab 3's page: chunked prefill (a step's token budget: chunk sizes, KV blocks per chunk, admission, the order)."""

from textwrap import dedent

from cells import code, conclusion, md
from labpage import engine_on_your_part, grade_it, header, summary, your_file

STEP_ROWS = """\
def step_row(trace):
    \"\"\"One step as a row, in the order the budget is handed out: its decodes (one token each), then running
    prompts' chunks (p:reqN xK = K tokens of request N), then new prompts' first chunks (w:...).\"\"\"
    decodes = sum(not c.is_prefill for c in trace.chunks)
    chunks = {"p": [], "w": []}
    for c in (c for c in trace.chunks if c.is_prefill):
        chunks["w" if c.request_id in trace.admitted_ids else "p"].append(f"{c.request_id.split('-')[-1]}x{c.num_tokens}")
    return (f"step {trace.step:2}: {trace.num_scheduled_tokens:2}/{trace.token_budget} tokens  d x{decodes:<2} | "
            + " ".join("p:" + c for c in chunks["p"]) + " | " + " ".join("w:" + c for c in chunks["w"]))
"""

CELLS = [
    *header(3, "chunked_prefill", "Chunked prefill: the step's token budget", [
        "See how the engine fills each step under its token budget: decodes first, then prompt chunks under the threshold, then new prompts whose blocks fit.",
        "Write `prefill_chunk`, `blocks_needed`, `admission_chunk` and `fill_step` yourself, from the skeleton, and grade them.",
        "Run the whole engine on your step builder and watch the steps in the dashboard's figures.",
    ], "[chapter 04, chunked prefill](04_chunked_prefill.ipynb)"),
    md("""
    ## The part: how a step is filled
    One step computes at most `max_num_batched_tokens` tokens. Decodes go first, so no stream waits behind a long
    prompt; then the running prompts' chunks, each at most `long_prefill_token_threshold` tokens; then new prompts,
    each admitted only if the KV blocks of its first chunk are free. Below, the grader's own chunked-prefill workload
    runs on the real engine, and each step is drawn as a row in the order its budget is handed out: the decodes (`d xN`),
    the running prompts' chunks (`p:reqN xK`, K tokens of request N), the new prompts' first chunks (`w:reqN xK`).
    """),
    code(STEP_ROWS + "\n\n" + dedent("""
    demo = WORKLOADS["chunked_prefill"]
    print("settings:", demo.settings)
    engine, _ = serve(demo)
    for trace in engine.traces[:12]:
        print(step_row(trace))
    titled(viz.batch_composition_figure(engine.traces), "Each step's tokens: decodes and prompt chunks").show()
    """)),
    conclusion("""
    budget, threshold = demo.settings["max_num_batched_tokens"], demo.settings["long_prefill_token_threshold"]
    longest = max(c.num_tokens for t in engine.traces for c in t.chunks if c.is_prefill)
    conclude(f"In **{len(engine.traces)} steps**, none over the budget of {budget} tokens, the longest prompt chunk was "
             f"**{longest} tokens** (the threshold is {threshold}).",
             [("every step within the budget", all(t.num_scheduled_tokens <= budget for t in engine.traces)),
              ("every chunk within the threshold", longest <= threshold)])
    """),
    *your_file("chunked_prefill", "You write `prefill_chunk` (the tokens a prompt may run this step), `blocks_needed` (the KV blocks a chunk adds), `admission_chunk` (a new prompt's first chunk, when its blocks fit) and `fill_step` (decodes, then running prompts' chunks, then admissions, under the budget)."),
    *grade_it("chunked_prefill"),
    *engine_on_your_part(
        "chunked_prefill", 'WORKLOADS["chunked_prefill"]',
        "the engine's scheduler builds every step with your functions",
        STEP_ROWS + "\n\n" + dedent("""
        for trace in mine.traces[:8]:
            print(step_row(trace))
        titled(viz.batch_composition_figure(mine.traces), "Each step's tokens, built by your step builder").show()
        titled(viz.queue_figure(mine.traces), "Running and waiting requests on your step builder").show()
        """),
        "each step's composition, then the queues"),
    *summary([
        "A step serves the decodes first, then running prompts' chunks capped by the threshold, then new prompts whose first chunk's blocks fit, all under the token budget.",
        "A new prompt is admitted when the KV blocks of its first chunk are free: admission is where the token budget and the KV budget meet.",
        "The grader checks each function case by case, a model-free scheduler against the reference step by step, then the whole engine on your step builder against transformers.",
    ]),
]

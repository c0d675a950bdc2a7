# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Lab 6's page: paged attention's reference read (gather by block table, causal mask, grouped-query heads)."""

from cells import code, conclusion, md
from labpage import engine_on_your_part, grade_it, header, summary, your_file

CELLS = [
    *header(6, "paged_attention", "Paged attention's read", [
        "See the block tables of a real step: which physical blocks hold each request's positions, shared prefix blocks included.",
        "Write `gather_kv`, `attend` and `paged_attention` yourself, from the skeleton, and grade them.",
        "Run the whole engine on your attention read and watch its block tables in the dashboard's figures.",
    ], "[chapter 02, PagedAttention](02_paged_attention.ipynb) and [chapter 11, attention kernels](11_attention_kernels.ipynb)"),
    md("""
    ## The part: reading K/V through a block table
    A request's K/V is not contiguous: position `p` lives in block `block_table[p // block_size]` at offset
    `p % block_size`, and the last block is cut at the sequence's length. Attention gathers the request's K/V in
    position order, masks each query row causally (a chunk after cached context sees all of the context), repeats the
    K/V heads for grouped-query attention, and multiplies the scores by the `scale` it is given (the model's softmax
    scale: one over the square root of the head size for most models, not all). Below, three requests with a shared
    prefix run on the real engine one after another, and the block tables of the first step that holds all three
    are read back into position ranges.
    """),
    code("""
    engine = modelled_engine(block_size=4, num_kv_blocks=32, max_num_batched_tokens=64, max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    shared = prompt_ids((0, 8))                       # two full blocks every prompt starts with
    for i, start in enumerate((40, 70, 100)):
        engine.add_request(f"req{i}", {"prompt_token_ids": shared + prompt_ids((start, 5 + 2 * i))}, params)
        if i < 2:
            engine.step()                             # the next prompt arrives a step later and finds the shared blocks cached
    run_to_completion(engine)
    step = next(t for t in engine.traces if len(t.block_tables) == 3)
    BS = engine.config.block_size
    lens = {c.request_id: c.start_pos + c.num_tokens for c in step.chunks}
    for rid, table in step.block_tables.items():
        ranges = [f"{p}-{min(p + BS, lens[rid]) - 1} in b{b}" for p, b in zip(range(0, lens[rid], BS), table)]
        print(f"{rid} (sequence of {lens[rid]} positions): " + ", ".join(ranges))
    titled(viz.block_tables_figure(step), f"Block tables at step {step.step}: the shared prefix is the same blocks").show()
    """),
    conclusion("""
    shared_blocks = set.intersection(*(set(t[:len(shared) // BS]) for t in step.block_tables.values()))
    conclude(f"At step {step.step} every request's block table has exactly ceil(sequence length / {BS}) blocks, and the "
             f"**{len(shared_blocks)} blocks** of the shared prefix are the same physical blocks in all three tables.",
             [("one block per block_size positions, the last one cut", all(len(step.block_tables[r]) == -(-n // BS) for r, n in lens.items())),
              ("the shared prefix is shared", len(shared_blocks) == len(shared) // BS)])
    """),
    *your_file("paged_attention", "You write `gather_kv` (a cache of blocks and a block table to the K or V of positions 0 to seq_len - 1), `attend` (scaled scores, the causal mask of a chunk after its context, grouped-query heads, softmax, the weighted values) and `paged_attention` (every request of a step: its query rows, its block table, its sequence length)."),
    *grade_it("paged_attention"),
    *engine_on_your_part(
        "paged_attention", 'WORKLOADS["chunked_prefill"]',
        "every attention layer of the model reads the paged KV cache through your functions",
        """
        table_step = max(mine.traces, key=lambda t: len(t.block_tables or {}))
        titled(viz.block_tables_figure(table_step), f"The block tables your attention read at step {table_step.step}").show()
        titled(viz.batch_composition_figure(mine.traces), "Each step's tokens: chunks after cached context, decodes").show()
        """,
        "the block tables your functions gathered through, then each step's chunks"),
    *summary([
        "Position p of a request lives in block block_table[p // block_size] at offset p % block_size; the gather puts the request's K/V back in position order and cuts the last block at the sequence length.",
        "A chunk after cached context sees every context position and, among its own rows, those up to itself: the causal mask is offset by the context's length.",
        "The grader checks each function against float64 reference attention case by case, random steps with shuffled blocks, then the whole engine on your read against transformers.",
    ]),
]

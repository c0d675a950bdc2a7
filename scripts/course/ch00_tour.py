# ruff: noqa: E501  (markdown tables and prose in cell sources are long by nature)
"""Chapter 0: tour of the engine, its vLLM names, and how to load a real Hugging Face model."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(0, "Tour: the engine in ten lines", [
        "Run the course: `bash scripts/setup.sh` (a CPU torch, the requirements, minengine) then `jupyter lab notebooks/`; `MINENGINE_FAST=1` shrinks workloads.",
        "Generate text with the offline API `LLM.generate` and the online API `LLMEngine.add_request` + `step()`.",
        "Read what one engine step did from its `StepTrace` (chunks, tokens, blocks, queues).",
        "Know the two clocks of the course: modelled time (an H100 running Llama-3-8B shapes) for every teaching figure, measured CPU time only where a chapter measures this machine on purpose.",
        "Map minengine's names onto vLLM's, so what you learn here transfers to the real thing.",
        "Load a real Hugging Face checkpoint (Llama or Qwen2) instead of the bundled tiny model.",
    ], ["vLLM docs, *Offline Inference* and *Engine Arguments* (docs.vllm.ai)",
        "Kwon et al., *Efficient Memory Management for LLM Serving with PagedAttention*, SOSP 2023"]),
    md("""
    ## How to use this course
    Each chapter teaches one mechanism: first a toy of about ten lines that shows the idea, then the **real**
    minengine (imported, not copied) to measure it. Every number in a sentence comes from a cell, so when you
    change a knob and re-run, the text changes with it. Exercises end with a cell that prints **PASS** or
    **FAIL**; hints and solutions are folded under *Hint* and *Solution*.

    Everything runs on a laptop CPU, offline, with the bundled model: a tiny Llama trained on Tiny Shakespeare
    (its size is printed below). It writes bad Shakespeare, fast, which is all a serving course needs: the
    scheduler does not care what the words mean.

    **Time in this course.** A laptop CPU running a 3 M-parameter model is neither fast nor steady: other programs
    steal cycles, the first steps of a process pay one-time costs (allocations, kernel choice), and its magnitudes are not a GPU's. So every teaching figure runs on the **modelled clock** (`minengine.timing`): each
    engine step lasts what a roofline cost model says that step would take on an **H100 SXM running Llama-3-8B
    shapes**, named under every figure. The tokens are still computed for real by the loaded model; the clock is modelled, so a figure is the same on every laptop, every run, at GPU magnitudes. Where a chapter
    measures this CPU on purpose (chapter 1), it pins threads, warms up, takes medians and shows CPU and modelled
    numbers side by side. Sentences that state a result are computed from the cell's numbers and *asserted*: if
    an experiment stopped showing what the text says, the cell would fail instead of printing it.
    """),
    code(SETUP),
    md("""
    ## The engine in ten lines
    `LLM` is vLLM's offline interface: give it prompts and `SamplingParams`, get one `RequestOutput` per prompt.
    Underneath, every request goes through the scheduler, the paged KV cache and the model, step by step.
    """),
    code("""
    from minengine.workloads import SHAKESPEARE_OPENINGS

    llm = LLM(model=COURSE_MODEL)  # None = the bundled model
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=pick(40, 16), seed=0)
    outputs = llm.generate(SHAKESPEARE_OPENINGS[:4], params, use_tqdm=False)
    for out in outputs:
        print(repr(out.prompt), "->", repr(out.outputs[0].text), f"({out.outputs[0].finish_reason})")
    """),
    code("""
    hf_config = llm.llm_engine.hf_config
    num_params = sum(p.numel() for p in llm.llm_engine.model.parameters())
    show(f"The model: {hf_config.num_hidden_layers} layers, hidden size {hf_config.hidden_size}, {hf_config.num_attention_heads} "
         f"query heads sharing {hf_config.num_key_value_heads} KV heads, vocabulary {hf_config.vocab_size:,}: "
         f"**{num_params / 1e6:.1f} M parameters** (an 8B model has about {8e9 / num_params:,.0f}x more).")
    """),
    md("""
    ## The online API: one step at a time
    `LLMEngine` is what a server drives: `add_request` whenever a request arrives, `step()` in a loop. Each step
    the scheduler picks which requests compute how many tokens (a whole prompt, a chunk of it, or one decode
    token), the model runs once over all of them, and every request that reached the end of its known tokens
    samples one new token. This is iteration-level scheduling, from Orca (Yu et al., OSDI 2022).
    """),
    code("""
    engine = modelled_engine(max_num_batched_tokens=64, block_size=16)   # LLMEngine on the modelled clock
    tokenizer = engine.get_tokenizer()
    for i, prompt in enumerate(SHAKESPEARE_OPENINGS[:3]):
        engine.add_request(f"req-{i}", prompt, SamplingParams(temperature=0.0, max_tokens=6))
    outs = run_to_completion(engine)
    for t in engine.traces:
        parts = ", ".join(f"{c.request_id}: {c.num_tokens} {'prefill' if c.is_prefill else 'decode'}"
                          f"{' +sample' if c.sampled else ''}" for c in t.chunks)
        print(f"step {t.step:2d}  {t.num_scheduled_tokens:3d} tokens  {t.duration * 1000:5.2f} ms  [{parts}]")
    print("clock:", engine.clock.label)
    """),
    conclusion("""
    first, last = engine.traces[0], engine.traces[-1]
    prompt_tokens = sum(m.num_prompt_tokens for m in engine.request_metrics.values())
    ratio = first.duration / last.duration
    conclude(f"Step 0 computed **{first.num_scheduled_tokens}** prompt tokens of {len(first.chunks)} requests in one forward "
             f"pass and took **{first.duration * 1000:.2f} ms**; the last step computed {last.num_scheduled_tokens} decode tokens in "
             f"**{last.duration * 1000:.2f} ms** ({ratio:.2f}x). On an H100 both steps are bound by reading the weights once "
             f"(chapter 1): {first.num_scheduled_tokens} tokens cost about what {last.num_scheduled_tokens} do. The run needed "
             f"**{len(engine.traces)}** steps.",
             [("step 0 prefilled every prompt token of the three requests", first.num_scheduled_tokens == prompt_tokens
               and len(first.chunks) == 3 and all(c.is_prefill for c in first.chunks)),
              ("the last step decodes one token per request", all(not c.is_prefill and c.num_tokens == 1 for c in last.chunks)),
              ("the prefill step costs within 25 % of a decode step", 0.8 < ratio < 1.25)])
    """),
    md("""
    ### What the steps looked like
    The figure comes from `minengine.viz` (shared with the Streamlit dashboard) and reads the engine's own trace. Hover a bar to see which request it was and whether it was a prefill chunk or a decode token.
    """),
    code("""
    viz.batch_composition_figure(engine.traces).show()
    """),
    code("""
    titled(viz.token_timeline_figure(engine.request_metrics), "When each request's tokens came out").show()
    print(engine.summary().as_table())
    """),
    md("""
    ## How the names map to vLLM
    | minengine | vLLM (v1) | what it is |
    |---|---|---|
    | `LLM`, `LLMEngine`, `SamplingParams`, `RequestOutput` | same names | public API |
    | `EngineConfig` | `EngineArgs` / `VllmConfig` | every knob, same field names |
    | `max_num_batched_tokens` | same | token budget per step |
    | `max_num_seqs` | same | sequence slots (most running requests) |
    | `block_size`, `num_kv_blocks` | `block_size`, `num_gpu_blocks` | KV block size (tokens) and pool size |
    | `enable_chunked_prefill`, `long_prefill_token_threshold` | same | chunked prefill |
    | `enable_prefix_caching` | same | automatic prefix caching |
    | `core/scheduler.py` `Scheduler` | `vllm/v1/core/sched/scheduler.py` | who runs what this step |
    | `core/kv_cache_manager.py`, `core/block_pool.py` | `vllm/v1/core/kv_cache_manager.py`, `block_pool.py` | block tables, prefix cache |
    | `worker/model_runner.py` | `vllm/v1/worker/gpu_model_runner.py` | tensors, slot mapping, forward |
    | `num_computed_tokens` | same | a request's progress |

    The scheduler (`minengine/core/`) never imports torch: the fleet's token-free path runs it without torch (checked: ch10 · torch is not loaded on the token-free path), just as vLLM keeps scheduling apart from the GPU worker: you can read it in one sitting.
    """),
    md("""
    ## A real Hugging Face model
    The engine loads Llama and Qwen2 checkpoints from a local directory or the Hub, for example
    `LLM(model="Qwen/Qwen2.5-0.5B-Instruct")`. That needs a download, so the cell below runs when you set `MINENGINE_HF_MODEL` to a model id or directory and is skipped otherwise (the rest of the course works offline).
    """),
    code("""
    hf_model = os.environ.get("MINENGINE_HF_MODEL")
    if hf_model:
        big = LLM(model=hf_model, max_model_len=1024)
        print(big.generate("The capital of France is", SamplingParams(temperature=0.0, max_tokens=8))[0].outputs[0].text)
    else:
        print("Skipped: set MINENGINE_HF_MODEL=Qwen/Qwen2.5-0.5B-Instruct (or a local directory) to try a real model.")
    """),
    md("""
    ## Try it: temperature and length
    Move the sliders and press *Run*: the engine generates again from the same prompt. Try temperature 0 (greedy:
    always the same text), then a higher one, and watch the text vary from run to run.
    """),
    code("""
    import ipywidgets as widgets


    def generate_once(temperature=0.8, max_tokens=24, seed=0):
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
        out = llm.generate(SHAKESPEARE_OPENINGS[2], params, use_tqdm=False)[0]
        print(out.prompt + out.outputs[0].text)


    widgets.interact_manual(generate_once,
                            temperature=widgets.FloatSlider(value=0.8, min=0.0, max=1.5, step=0.1),
                            max_tokens=widgets.IntSlider(value=pick(24, 8), min=1, max=64),
                            seed=widgets.IntText(value=0))
    """),
    *exercise(1, """
        How many output tokens did the three requests of the step-by-step run produce **in total**? Compute it
        from `outs` (the dict of finished `RequestOutput`s returned by `run_to_completion`).
        """, "Each `RequestOutput` has `.outputs[0].token_ids`.", "answer_1",
        "answer_1 = sum(len(o.outputs[0].token_ids) for o in outs.values())",
        """
        check("Exercise 1: total output tokens", answer_1, engine.summary().output_tokens)
        """, wrong=["answer_1 = len(outs)  # requests, not tokens", "answer_1 = len(engine.traces)  # steps",
                    "answer_1 = engine.summary().prompt_tokens"]),
    *exercise(2, """
        What is the name of the `EngineConfig` field (vLLM's name too) that caps how many tokens, prefill and
        decode together, one step may compute? Give it as a string.
        """, "It is the *token budget*; look at the table above.", "answer_2",
        'answer_2 = "max_num_batched_tokens"',
        """
        from dataclasses import fields

        budget_field = next(f.name for f in fields(EngineConfig) if f.name.startswith("max_num_batched"))
        check("Exercise 2: the token budget's name", answer_2, budget_field)
        """, wrong=['answer_2 = "max_num_seqs"', 'answer_2 = "max_model_len"', 'answer_2 = "num_kv_blocks"']),
    code("""
    # For exercise 3: the engine's own step counts for one request alone (prompt P tokens, budget B, max_tokens), run once here.
    def engine_steps(P, B, max_tokens):
        probe = LLMEngine.from_config(model=COURSE_MODEL, max_num_batched_tokens=B, enable_prefix_caching=False)
        probe.add_request("p", {"prompt_token_ids": [7] * P}, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        run_to_completion(probe)
        return len(probe.traces)


    cases_3 = [((P, B, n), engine_steps(P, B, n)) for P, B, n in ((100, 32, 5), (96, 32, 5), (64, 16, 1), (10, 32, 3), (33, 16, 2))]
    print(f"{len(cases_3)} runs ready for exercise 3's check")
    """),
    *exercise(3, """
        A single request with a prompt of `P` tokens and `max_tokens` output tokens runs alone with a token budget of `B` and
        chunked prefill. How many engine steps does it take? Write `answer_3(P, B, max_tokens)`; the check compares it with the
        engine's step counts from the cell above, for `P = 100, B = 32, max_tokens = 5` and a few more (some `P` a multiple of `B`).
        """, """
        The prompt is cut into chunks of at most `B` tokens; only the last chunk samples the first output token.
        Every further output token is one decode step.
        """, "answer_3",
        "answer_3 = lambda P, B, max_tokens: -(-P // B) + (max_tokens - 1)",
        """
        check_function("Exercise 3: steps for one request", answer_3, cases_3,
                       hint="count the prefill chunks of at most B tokens (is the last one full?), then ask which step samples the first output token")
        """, wrong=["answer_3 = lambda P, B, max_tokens: P // B + max_tokens  # two mistakes that cancel at P = 100: floor drops the short chunk, + max_tokens counts the first token twice",
                    "answer_3 = lambda P, B, max_tokens: P // B + max_tokens - 1  # floor drops the last, short chunk",
                    "answer_3 = lambda P, B, max_tokens: -(-P // B) + max_tokens  # the last chunk already samples token 1",
                    "answer_3 = lambda P, B, max_tokens: P // B + 1 + max_tokens - 1  # one chunk too many when B divides P",
                    "answer_3 = lambda P, B, max_tokens: P / B + max_tokens - 1"]),
    *question("why does the first step cost about what a decode step costs?", """
        Step 0 above computed every prompt token of three requests, the last step one token per request, yet on the
        modelled H100 they took about the same time. Why? And what if the prompts were 4,000 tokens each?
        """, """
        Both steps are memory-bound: the H100 must read all ~16 GB of Llama-3-8B's bf16 weights once per step, about 7 ms
        at the bandwidth a serving engine reaches, whatever the number of tokens, as long as the arithmetic per byte read
        stays below the ridge point (a few hundred tokens per step on an H100, chapter 1). A few dozen prompt tokens do not
        get there. 3 x 4,000 tokens would: the step becomes compute-bound and lasts roughly `2 x 8e9 x 12,000` FLOPs over
        the effective peak, hundreds of milliseconds: the cell below checks both on the modelled clock.
        """),
    code("""
    # The model answer, on the modelled H100: three 4,000-token prompts in one step vs three decodes.
    from minengine.course import teaching_cost_model
    from minengine.timing import StepWork

    long_prefill = teaching_cost_model().cost(StepWork.of([(4000, 0, 1)] * 3))
    three_decodes = teaching_cost_model().cost(StepWork.of([(1, 40, 1)] * 3))
    print(f"3 x 4,000-token prefill: {long_prefill.time_s * 1000:.0f} ms, {long_prefill.bound}-bound | "
          f"3 decodes: {three_decodes.time_s * 1000:.1f} ms, {three_decodes.bound}-bound")
    claim("3 x 4,000 prompt tokens make a compute-bound step of hundreds of ms",
          long_prefill.bound == "compute" and long_prefill.time_s > 0.1)
    claim("three decodes are memory-bound", three_decodes.bound == "memory")
    """),
    *question("what if the token budget were smaller than the prompts?", """
        The step-by-step engine has `max_num_batched_tokens=64`. What changes if you set it to 8?
        """, """
        A step may then compute at most 8 tokens, so the prompts are cut into chunks of at most 8 (chunked prefill,
        chapter 4) and the first output token of each request comes with its last chunk: a prompt of P tokens
        needs ceil(P / 8) steps before its first token (exercise 3 counts them). Once all prompts are done, the decode steps are unchanged (3 tokens each, under 8). Try it: change the
        budget and re-run the cell.
        """),
    *summary([
        "`LLM.generate` is the offline API; `LLMEngine.add_request` + `step()` is the online one a server drives.",
        "One step = one forward pass over the tokens the scheduler picked: prompt chunks and decode tokens mixed.",
        "A step samples a request's next token in the step that reaches the end of its known tokens: a prompt's last chunk, or a decode.",
        "`engine.traces` (one `StepTrace` per step) and `engine.request_metrics` are what every figure reads.",
        "The names (`max_num_batched_tokens`, `max_num_seqs`, `block_size`, `num_computed_tokens`) are vLLM's.",
        "Teaching figures run on the modelled clock (H100 SXM, Llama-3-8B shapes): the same numbers on every laptop; the tokens are still computed for real.",
    ]),
    *glossary([
        ("prefill", "预填充", "computing K/V for the prompt tokens (many tokens in one step)"),
        ("decode", "解码", "computing one new token per request per step"),
        ("step / iteration", "步 / 迭代", "one scheduler decision plus one forward pass"),
        ("token budget (`max_num_batched_tokens`)", "词元预算", "most tokens one step may compute"),
        ("modelled clock", "模型化时钟", "step times from a roofline cost model of a named GPU and model shape"),
        ("sequence slot (`max_num_seqs`)", "序列槽位", "most requests running at once"),
        ("KV cache", "KV 缓存", "stored keys and values of past tokens, so they are not recomputed"),
        ("block table", "块表", "a request's list of physical KV blocks"),
        ("sampling parameters", "采样参数", "temperature, top-p, top-k, max_tokens, stop, seed"),
    ]),
]

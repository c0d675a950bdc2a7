# ruff: noqa: E501  (markdown tables and prose in cell sources are long by nature)
"""Chapter 0: tour of the engine, its vLLM names, and how to load a real Hugging Face model."""

from cells import SETUP, code, exercise, glossary, header, md, summary

CELLS = [
    *header(0, "Tour: the engine in ten lines", [
        "Run the course: `pip install -e .` then `jupyter lab notebooks/`; `MINENGINE_FAST=1` shrinks workloads.",
        "Generate text with the offline API `LLM.generate` and the online API `LLMEngine.add_request` + `step()`.",
        "Read what one engine step did from its `StepTrace` (chunks, tokens, blocks, queues).",
        "Map minengine's names onto vLLM's, so what you learn here transfers to the real thing.",
        "Load a real Hugging Face checkpoint (Llama or Qwen2) instead of the bundled tiny model.",
    ], ["vLLM docs, *Offline Inference* and *Engine Arguments* (docs.vllm.ai)",
        "Kwon et al., *Efficient Memory Management for LLM Serving with PagedAttention*, SOSP 2023"]),
    md("""
    ## How to use this course
    Each chapter teaches one mechanism: first a toy of about ten lines that shows the idea, then the **real**
    minengine (imported, never copied) to measure it. Every number in a sentence comes from a cell, so when you
    change a knob and re-run, the text changes with it. Exercises end with a cell that prints **PASS** or
    **FAIL**; hints and solutions are folded under *Hint* and *Solution*.

    Everything runs on a laptop CPU, offline, with the bundled model: a tiny Llama trained on Tiny Shakespeare
    (its size is printed below). It writes bad Shakespeare, fast, which is all a serving course needs: the
    scheduler does not care what the words mean.
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
    engine = LLMEngine.from_config(model=COURSE_MODEL, max_num_batched_tokens=64, block_size=16)
    tokenizer = engine.get_tokenizer()
    for i, prompt in enumerate(SHAKESPEARE_OPENINGS[:3]):
        engine.add_request(f"req-{i}", prompt, SamplingParams(temperature=0.0, max_tokens=6))
    outs = run_to_completion(engine)
    for t in engine.traces:
        parts = ", ".join(f"{c.request_id}: {c.num_tokens} {'prefill' if c.is_prefill else 'decode'}"
                          f"{' +sample' if c.sampled else ''}" for c in t.chunks)
        print(f"step {t.step:2d}  {t.num_scheduled_tokens:3d} tokens  [{parts}]")
    """),
    code("""
    first = engine.traces[0]
    show(f"Step 0 computed **{first.num_scheduled_tokens}** prompt tokens of {len(first.chunks)} requests in one "
         f"forward pass and took {first.duration * 1000:.1f} ms; the last step computed "
         f"{engine.traces[-1].num_scheduled_tokens} decode tokens. The run needed **{len(engine.traces)}** steps.")
    """),
    md("""
    ### What the steps looked like
    The figure comes from `minengine.viz` (shared with the Streamlit dashboard) and reads only the engine's own
    trace. Hover a bar to see which request it was and whether it was a prefill chunk or a decode token.
    """),
    code("""
    viz.batch_composition_figure(engine.traces).show()
    """),
    code("""
    viz.token_timeline_figure(engine.request_metrics).show()
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

    The scheduler (`minengine/core/`) never imports torch, just as vLLM keeps scheduling apart from the GPU
    worker: you can read it in one sitting.
    """),
    md("""
    ## A real Hugging Face model
    The engine loads Llama and Qwen2 checkpoints from a local directory or the Hub, for example
    `LLM(model="Qwen/Qwen2.5-0.5B-Instruct")`. That needs a download, so the cell below runs only when you set
    `MINENGINE_HF_MODEL` to a model id or directory (the course itself never touches the network).
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
    Move the sliders and press *Run*: the engine generates again from the same prompt. Temperature 0 is greedy
    (always the same text); higher temperatures spread the choice over more tokens.
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
        """),
    *exercise(2, """
        What is the name of the `EngineConfig` field (vLLM's name too) that caps how many tokens, prefill and
        decode together, one step may compute? Give it as a string.
        """, "It is the *token budget*; look at the table above.", "answer_2",
        'answer_2 = "max_num_batched_tokens"',
        """
        from dataclasses import fields

        budget_field = next(f.name for f in fields(EngineConfig) if f.name.startswith("max_num_batched"))
        check("Exercise 2: the token budget's name", answer_2, budget_field)
        """),
    *exercise(3, """
        A single request with a prompt of `P = 100` tokens and `max_tokens = 5` runs alone with a token budget of
        `B = 32` and chunked prefill. How many engine steps does it take? Write a formula in `P`, `B` and
        `max_tokens`; the check runs the engine and counts the steps.
        """, """
        The prompt is cut into chunks of at most `B` tokens; only the last chunk samples the first output token.
        Every further output token is one decode step.
        """, "answer_3",
        "P, B, max_tokens = 100, 32, 5\nanswer_3 = -(-P // B) + (max_tokens - 1)",
        """
        probe = LLMEngine.from_config(model=COURSE_MODEL, max_num_batched_tokens=32)
        probe.add_request("p", {"prompt_token_ids": [7] * 100}, SamplingParams(temperature=0.0, max_tokens=5,
                                                                               ignore_eos=True))
        run_to_completion(probe)
        check("Exercise 3: steps for one request", answer_3, len(probe.traces),
              hint="ceil(P / B) prefill steps, then max_tokens - 1 decode steps")
        """),
    *summary([
        "`LLM.generate` is the offline API; `LLMEngine.add_request` + `step()` is the online one a server drives.",
        "One step = one forward pass over the tokens the scheduler picked: prompt chunks and decode tokens mixed.",
        "A step samples for a request only when it reaches the end of that request's known tokens.",
        "`engine.traces` (one `StepTrace` per step) and `engine.request_metrics` are what every figure reads.",
        "The names (`max_num_batched_tokens`, `max_num_seqs`, `block_size`, `num_computed_tokens`) are vLLM's.",
    ]),
    *glossary([
        ("prefill", "预填充", "computing K/V for the prompt tokens (many tokens in one step)"),
        ("decode", "解码", "computing one new token per request per step"),
        ("step / iteration", "步 / 迭代", "one scheduler decision plus one forward pass"),
        ("token budget (`max_num_batched_tokens`)", "令牌预算", "most tokens one step may compute"),
        ("sequence slot (`max_num_seqs`)", "序列槽位", "most requests running at once"),
        ("KV cache", "KV 缓存", "stored keys and values of past tokens, so they are not recomputed"),
        ("block table", "块表", "a request's list of physical KV blocks"),
        ("sampling parameters", "采样参数", "temperature, top-p, top-k, max_tokens, stop, seed"),
    ]),
]

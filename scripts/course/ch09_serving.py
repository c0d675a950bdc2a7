# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 9: serving for real: the OpenAI-compatible server as a process, the openai client, cancellation that frees
KV blocks, /metrics, the step feed, bench-serve --base-url."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(9, "Serving for real", [
        "Start minengine's OpenAI-compatible server (`python -m minengine serve`) from the notebook, as a real process on a free port.",
        "Send completions and chat through the official `openai` client, streamed and not, and check them against `LLM.generate`.",
        "Cancel a stream mid-way and watch the request leave and its KV blocks come back in `/metrics`.",
        "Read `/metrics` (Prometheus, vLLM's series names) and the step feed `/v1/engine/steps` that a live view draws.",
        "Attach the dashboard's live view (`ServerFeed`, the page's own client) to the server while clients stream, and draw what it draws.",
        "Load the server with `bench-serve --base-url` and reconcile the client's numbers with the server's counters.",
    ], ["vLLM docs, *OpenAI-Compatible Server* and *Production Metrics*", "OpenAI API reference (completions, chat completions, streaming)",
        "Prometheus text exposition format", "vLLM `benchmarks/benchmark_serving.py` (the client bench-serve --base-url follows)"]),
    code(SETUP + """\
import statistics
import subprocess
import sys
import threading

import httpx
import openai

from minengine.course.serving import ServerProcess, child_env, metric, read_metrics, read_steps
from minengine.viz.server_feed import rename_requests
from minengine.workloads import SHAKESPEARE_OPENINGS
"""),
    md("""
    ## Start the server
    Every production engine is met through a server. `python -m minengine serve` is minengine's (vLLM: `vllm serve
    MODEL`): FastAPI routes under `/v1` (OpenAI's API), `/metrics` (Prometheus), `/v1/engine/steps` (every step as it
    happens), and one engine loop that owns the `LLMEngine`; the HTTP handlers enqueue requests and await their tokens. Here it runs as a real subprocess on a free port, with the bundled model and a small KV pool so the numbers
    are easy to follow. This chapter's times are **wall-clock** times of this machine (a server lives in real time),
    so its sentences state counts and blocks, not speeds.

    Starting takes a few seconds on an idle machine and can take minutes on a busy one (the server loads the model and
    may first build the C++ attention kernel): the cell prints its progress every 20 s, and if the server exits or has
    not answered `/health` within 9 minutes it stops with a message saying why and what to try, not a traceback.
    """),
    code("""
    SERVER_ARGS = ["--max-model-len", "512", "--num-kv-blocks", "256", "--max-num-batched-tokens", "256", "--max-num-seqs", "32"]
    if COURSE_MODEL:
        SERVER_ARGS = [COURSE_MODEL] + SERVER_ARGS
    server = ServerProcess(SERVER_ARGS, timeout_s=9 * 60, progress_every_s=20)
    print("started:", " ".join(server.command[1:]))
    print("base URL:", server.url)
    print(httpx.get(server.url + "/v1/models", timeout=10).json())
    """),
    md("""
    ## The official `openai` client
    Point the client at the server (`base_url`, any API key) and use it as you would use OpenAI's service. Greedy
    decoding (`temperature=0`) lets us check the server's text against the offline `LLM.generate` on the same model.
    """),
    code("""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="EMPTY", timeout=120, max_retries=0)
    model = client.models.list().data[0].id
    reply = client.completions.create(model=model, prompt="ROMEO:", max_tokens=16, temperature=0)
    print(repr(reply.choices[0].text), reply.usage)

    t0 = time.perf_counter()
    stream = client.chat.completions.create(model=model, stream=True, max_tokens=24, temperature=0,
                                            messages=[{"role": "user", "content": "Good morrow, fair maid."}])
    pieces, first_at = [], None
    for chunk in stream:
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            first_at = first_at or time.perf_counter() - t0
            pieces.append(delta)
            print(delta, end="", flush=True)
    print(f"\\n{len(pieces)} streamed pieces; the first after {first_at * 1000:.0f} ms (wall clock, this machine)")
    """),
    conclusion("""
    offline = LLM(model=COURSE_MODEL, max_model_len=512)
    want = offline.generate("ROMEO:", SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)[0].outputs[0].text
    (want_chat,) = offline.chat([{"role": "user", "content": "Good morrow, fair maid."}], SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
    conclude(f"The server's completion {reply.choices[0].text!r} is **the same text** `LLM.generate` gives offline, and the streamed chat "
             f"reply, {len(pieces)} pieces put together, equals `LLM.chat`'s: the server is a thin shell around the same engine.",
             [("the completion equals LLM.generate's", reply.choices[0].text == want),
              ("the streamed chat equals LLM.chat's", "".join(pieces) == want_chat.outputs[0].text),
              ("the usage counts the tokens", reply.usage.completion_tokens == 16)])
    """),
    md("""
    ## Cancel a stream, watch the KV blocks come back
    A user who closes the tab leaves a *zombie* request: still decoding, still holding KV blocks, for nobody. The server
    notices the closed connection (its next write fails, or the disconnect message arrives) and queues an abort, which
    the engine loop applies between two steps: the step after the request's last one no longer has it, and its blocks
    are already free when that step is scheduled. Below: start a long stream (`ignore_eos`, 400 tokens), read a few
    chunks, start a second stream (a neighbour, so the engine keeps stepping after the hang-up), look at `/metrics`,
    close the first stream, and read the server's own steps from the step feed.
    """),
    code("""
    before = read_metrics(server.url)
    total_blocks = int(next(s for s in before["vllm:cache_config_info"].samples).labels["num_gpu_blocks"])
    steps_before = int(metric(before, "minengine:num_steps"))


    def wait_running(n, timeout_s=30):
        \"\"\"Poll /metrics until n requests are running (or the time is up); returns the last reading.\"\"\"
        deadline = time.monotonic() + timeout_s
        while metric(fam := read_metrics(server.url), "vllm:num_requests_running") != n and time.monotonic() < deadline:
            time.sleep(0.02)
        return fam


    long_stream = client.completions.create(model=model, prompt=SHAKESPEARE_OPENINGS[0], max_tokens=400, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    received = 0
    for chunk in long_stream:
        received += bool(chunk.choices and chunk.choices[0].text)
        if received == 8:
            break
    neighbour = threading.Thread(target=lambda: sum(1 for _ in client.completions.create(
        model=model, prompt=SHAKESPEARE_OPENINGS[1], max_tokens=pick(200, 120), temperature=0, stream=True, extra_body={"ignore_eos": True})))
    neighbour.start()
    mid = wait_running(2)
    long_stream.close()                                          # the client hangs up mid-stream
    wait_running(1)
    neighbour.join(timeout=120)
    after = wait_running(0)
    engine_info, cancel_feed = read_steps(server.url, history=int(metric(after, "minengine:num_steps")) - steps_before)
    for label, fam in (("before", before), ("mid-stream", mid), ("after both", after)):
        print(f"{label:12s} running {metric(fam, 'vllm:num_requests_running'):.0f} | free KV blocks {metric(fam, 'minengine:num_free_blocks'):.0f} "
              f"of {total_blocks} | KV usage {metric(fam, 'vllm:kv_cache_usage_perc'):.3f} | aborted so far "
              f"{metric(fam, 'vllm:request_success', finished_reason='abort'):.0f}")
    cancelled, other = list(dict.fromkeys(c.request_id for t in cancel_feed for c in t.chunks))[:2]   # in order of first appearance
    served = [t.step for t in cancel_feed if any(c.request_id == cancelled for c in t.chunks)]
    next_step = next((t for t in cancel_feed if t.step == served[-1] + 1), None)
    for t in cancel_feed:
        if served[-1] - 2 <= t.step <= served[-1] + 2:
            print(f"step {t.step}: {['cancelled' if c.request_id == cancelled else 'neighbour' for c in t.chunks]}, running {t.num_running}, "
                  f"free blocks {t.num_free_blocks}")
    """),
    conclusion("""
    held_mid = total_blocks - metric(mid, "minengine:num_free_blocks")
    aborted = metric(after, "vllm:request_success", finished_reason="abort") - metric(before, "vllm:request_success", finished_reason="abort")
    generated = sum(c.sampled for t in cancel_feed for c in t.chunks if c.request_id == cancelled)
    neighbour_chunk = next((c for c in next_step.chunks if c.request_id == other), None) if next_step else None
    neighbour_blocks = -(-(neighbour_chunk.start_pos + neighbour_chunk.num_tokens) // engine_info["block_size"]) if neighbour_chunk else None
    conclude(f"Mid-stream both requests were running and held **{held_mid:.0f} KV blocks**. The client read {received} tokens and hung up; "
             f"the server had computed the cancelled request in every step from {served[0]} to {served[-1]} ({generated} tokens of the 400) and counted **{aborted:.0f} aborted request**. In the very next step, "
             f"{served[-1] + 1}, it was gone: the step ran only the neighbour, one request was running, and {next_step.num_free_blocks} of "
             f"{total_blocks} blocks were free, all but the neighbour's {neighbour_blocks}: the abort was applied before that step was "
             f"scheduled. Once the neighbour finished, every block was free again.",
             [("both streams held blocks while they ran", metric(mid, "vllm:num_requests_running") == 2 and held_mid > 0),
              ("the cancelled request was served every step until it left", served == list(range(served[0], served[-1] + 1))),
              ("the engine stepped on after it left", next_step is not None and neighbour_chunk is not None),
              ("the next step had only the neighbour", next_step is not None and {c.request_id for c in next_step.chunks} == {other}
               and next_step.num_running == 1),
              ("its blocks were free in that step", next_step is not None and next_step.num_free_blocks == total_blocks - neighbour_blocks),
              ("closing it aborted the request, well short of 400 tokens", aborted == 1 and received <= generated < 400),
              ("and every block is free in the end", metric(after, "minengine:num_free_blocks") == total_blocks
               and metric(after, "vllm:num_requests_running") == 0)])
    """),
    md("""
    ## Read `/metrics`
    The Prometheus text format, with vLLM's series names, so an existing vLLM Grafana dashboard works unchanged.
    Gauges (`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`) say *now*; counters (`..._total`) only grow (source: Prometheus docs, *Metric types*);
    histograms give `_count`, `_sum` and cumulative `_bucket`s, so a dashboard computes means and percentiles over any
    window. A few of them, parsed with `prometheus_client`:
    """),
    code("""
    fams = read_metrics(server.url)
    rows = [("vllm:num_requests_running", None), ("vllm:num_requests_waiting", None), ("vllm:kv_cache_usage_perc", None),
            ("vllm:prompt_tokens", None), ("vllm:generation_tokens", None), ("vllm:num_preemptions", None),
            ("vllm:prefix_cache_queries", None), ("vllm:prefix_cache_hits", None),
            ("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count"),
            ("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_sum"),
            ("vllm:iteration_tokens_total", "vllm:iteration_tokens_total_count"), ("minengine:num_steps", None)]
    for name, sample in rows:
        print(f"{sample or name:45s} {fams[name].type:9s} {metric(fams, name, sample):12.4g}")
    ttft_count = metric(fams, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count")
    print(f"mean TTFT so far: {metric(fams, 'vllm:time_to_first_token_seconds', 'vllm:time_to_first_token_seconds_sum') / ttft_count * 1000:.0f} ms "
          f"over {ttft_count:.0f} requests (wall clock)")
    """),
    md("""
    ## The step feed: what a live view draws
    `GET /v1/engine/steps` streams every `StepTrace` as JSON (server-sent events); `?history=N` first replays the last N
    steps the server kept. It is the same record the engine keeps in `engine.traces`, so the same `minengine.viz`
    builders draw a server's steps as they draw a notebook run's. Four streams at once, then the feed's replay of them:
    """),
    code("""
    def named(traces):
        # the steps with the server's ids (cmpl-<hex>-0) renamed req-1, req-2, ... in order of first appearance:
        # numbered ids get distinct colours (viz.colors.request_color) and readable labels in the figures
        order = dict.fromkeys(r for t in traces for r in [*(c.request_id for c in t.chunks), *(t.block_tables or {})])
        names = {rid: f"req-{i + 1}" for i, rid in enumerate(order)}
        return [rename_requests(t, lambda r: names.get(r, r)) for t in traces]


    def one_stream(i):
        s = client.completions.create(model=model, prompt=SHAKESPEARE_OPENINGS[i], max_tokens=24, temperature=0, stream=True,
                                      extra_body={"ignore_eos": True})
        return sum(1 for _ in s)


    steps_before = int(metric(read_metrics(server.url), "minengine:num_steps"))
    threads = [threading.Thread(target=one_stream, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    steps_now = int(metric(read_metrics(server.url), "minengine:num_steps"))
    engine_info, feed = read_steps(server.url, history=steps_now - steps_before)
    print({k: engine_info[k] for k in ("model", "block_size", "num_kv_blocks", "max_num_batched_tokens", "scheduling_policy")})
    viz.batch_composition_figure(named(feed)).update_layout(title="The server's steps while 4 clients streamed (from /v1/engine/steps)").show()
    """),
    conclusion("""
    most = max(t.num_running for t in feed)
    tokens = sum(t.num_scheduled_tokens for t in feed)
    conclude(f"The feed replayed **{len(feed)} steps**; at most {most} requests ran in one step, so the four clients were batched "
             f"together, and the steps computed {tokens} tokens in all. The dashboard's figures read exactly these records.",
             [("the feed replayed the steps the counter reports", len(feed) == steps_now - steps_before),
              ("the four streams were batched together", most == 4)])
    """),
    md("""
    ## The dashboard, attached live
    The replay above came after the fact. The dashboard watches a server *while* it serves: run `streamlit run app.py`
    in a terminal, pick the sidebar source **live server**, type the URL printed below and press **Connect**. The page
    reads the step feed with `minengine.viz.server_feed.ServerFeed`, a client that connects and reads in its own thread,
    and redraws the block pool, the batch bars and the token timeline as steps arrive, with `/metrics` as cards. Below,
    the notebook attaches that same client before three clients stream, and draws what the page draws from what it
    received. (In a terminal, `curl -N URL/v1/engine/steps` shows the raw feed, one JSON step per event.)
    """),
    code("""
    from minengine.viz.server_feed import ServerFeed

    print(f"streamlit run app.py   ->   sidebar: live server, URL {server.url}, Connect")
    live = ServerFeed(server.url, metrics_every_s=0.2).start()      # the dashboard's client, history=0: from now on
    deadline = time.monotonic() + 30
    while live.state == "connecting" and time.monotonic() < deadline:
        time.sleep(0.05)
    claim("the dashboard's client connected to the server", live.state == "connected")
    steps_at_connect = int(metric(read_metrics(server.url), "minengine:num_steps"))
    LIVE_PROMPTS = [SHAKESPEARE_OPENINGS[0] * 3, SHAKESPEARE_OPENINGS[1], SHAKESPEARE_OPENINGS[2]]   # one longer prompt, two short
    threads = [threading.Thread(target=lambda p=p: sum(1 for _ in client.completions.create(
        model=model, prompt=p, max_tokens=20, temperature=0, stream=True, extra_body={"ignore_eos": True}))) for p in LIVE_PROMPTS]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    steps_live = int(metric(read_metrics(server.url), "minengine:num_steps")) - steps_at_connect


    def finished_requests(fams):                                   # vllm:request_success summed over finished_reason
        return sum(s.value for s in fams["vllm:request_success"].samples if s.name.endswith("_total"))


    finished_now = finished_requests(read_metrics(server.url))
    while (live.num_received < steps_live or (live.metrics or {}).get("requests_finished") != finished_now) and time.monotonic() < deadline:
        time.sleep(0.05)                                           # the feed's thread catches up, then /metrics once more
    seen = live.poll(100_000)
    cards = dict(live.metrics)
    live.stop()
    print(f"feed state {live.state} ({live.stop_reason}); steps received {len(seen)}, dropped by the server {live.num_dropped}")
    print("metric cards:", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in cards.items()})
    busiest = max(seen, key=lambda t: (t.num_running, t.num_used_blocks))
    wall = "wall clock: live server"
    seen_named = named(seen)
    viz.block_pool_figure(seen_named[seen.index(busiest)], request_ids=viz.run_request_ids(seen_named)).update_layout(
        title=f"The KV block pool at the server's busiest step ({busiest.num_running} running)").show()
    viz.batch_composition_figure(seen_named).update_layout(title="Each step's tokens against the budget, as the live page draws them").show()
    titled(viz.step_token_timeline_figure(seen_named, clock_label=wall), "Tokens as they came out", clock_label=wall).show()
    """),
    conclusion("""
    chunks = [c for t in seen for c in t.chunks]
    conclude(f"Attached before the clients started, the dashboard's client received **{len(seen)} steps**, exactly the "
             f"{steps_live} the server counted meanwhile, none dropped; they carried {sum(c.is_prefill for c in chunks)} prefill chunks "
             f"and {sum(not c.is_prefill for c in chunks)} decodes of {len(LIVE_PROMPTS)} requests, and the busiest step held "
             f"{busiest.num_used_blocks} of {busiest.num_total_blocks} KV blocks. The page's cards read `/metrics` beside it: "
             f"{cards['requests_finished']:.0f} requests finished since the server started.",
             [("the live feed missed no step", len(seen) == steps_live and live.num_dropped == 0 and live.num_lost == 0),
              ("it saw the three requests finish", live.num_finished == len(LIVE_PROMPTS)),
              ("the cards agree with /metrics", cards["requests_finished"] == finished_now),
              ("the feed stopped when told", live.state == "stopped" and live.stop_reason == "disconnect")])
    """),
    md("""
    ## Load it: `bench-serve --base-url`
    The same benchmark as chapter 7's replays, but as a client of any OpenAI-compatible server (minengine's, vLLM's,
    SGLang's): each request is sent at its arrival time as a streaming `/v1/completions` call with `ignore_eos` and
    `max_tokens` = its output length; TTFT and ITL are measured by the client on the wall clock.
    """),
    code("""
    BENCH = dict(num_requests=pick(32, 16), input_len=64, output_len=16, rate=8.0)
    before_bench = read_metrics(server.url)
    bench = subprocess.run([sys.executable, "-m", "minengine", "bench-serve", "--base-url", server.url, "--trace", "poisson",
                            "--num-requests", str(BENCH["num_requests"]), "--request-rate", str(BENCH["rate"]),
                            "--input-len", str(BENCH["input_len"]), "--output-len", str(BENCH["output_len"]),
                            "--slo-ttft-ms", "2000"], capture_output=True, text=True, timeout=600, env=child_env())
    print(bench.stdout[-3000:])
    claim("bench-serve ran", bench.returncode == 0)
    after_bench = read_metrics(server.url)
    """),
    conclusion("""
    table = {line.rpartition(":")[0].strip(): line.rpartition(":")[2].strip() for line in bench.stdout.splitlines() if ":" in line}
    ok = int(table["Successful requests"])
    delta = {name: metric(after_bench, name) - metric(before_bench, name) for name in ("vllm:prompt_tokens", "vllm:generation_tokens")}
    finished = sum(metric(after_bench, "vllm:request_success", finished_reason=r) - metric(before_bench, "vllm:request_success", finished_reason=r)
                   for r in ("stop", "length", "abort", "timeout"))
    conclude(f"The client counted **{ok} of {BENCH['num_requests']}** requests successful; the server's counters moved by exactly "
             f"{finished:.0f} finished requests, {delta['vllm:prompt_tokens']:.0f} prompt tokens ({BENCH['num_requests']} x {BENCH['input_len']}) and "
             f"{delta['vllm:generation_tokens']:.0f} generated tokens ({BENCH['num_requests']} x {BENCH['output_len']}): one benchmark, two views that agree. "
             f"Its latencies are this CPU's, on the wall clock, so they vary with the machine's load; the counts do not.",
             [("every request succeeded", ok == BENCH["num_requests"]), ("the server finished as many", finished == BENCH["num_requests"]),
              ("and counted every prompt and output token", delta == {"vllm:prompt_tokens": BENCH["num_requests"] * BENCH["input_len"],
                                                                        "vllm:generation_tokens": BENCH["num_requests"] * BENCH["output_len"]})])
    """),
    md("## Try it: concurrent clients"),
    code("""
    import ipywidgets as widgets


    def concurrent(clients=4, max_tokens=16):
        start = int(metric(read_metrics(server.url), "minengine:num_steps"))
        ttfts = []

        def one(i):
            t = time.perf_counter()
            s = client.completions.create(model=model, prompt=SHAKESPEARE_OPENINGS[i % len(SHAKESPEARE_OPENINGS)], max_tokens=max_tokens,
                                          temperature=0, stream=True, extra_body={"ignore_eos": True})
            for chunk in s:
                if chunk.choices and chunk.choices[0].text:
                    ttfts.append(time.perf_counter() - t)
                    break
            for _ in s:
                pass

        ths = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        end = int(metric(read_metrics(server.url), "minengine:num_steps"))
        _, steps = read_steps(server.url, history=end - start)
        print(f"{clients} clients: {len(steps)} server steps, at most {max(t.num_running for t in steps)} running at once; "
              f"client TTFT median {statistics.median(ttfts) * 1000:.0f} ms (wall clock)")


    widgets.interact_manual(concurrent, clients=widgets.IntSlider(value=4, min=1, max=32), max_tokens=widgets.IntSlider(value=16, min=1, max=128))
    """),
    *exercise(1, """
        From the mid-stream metrics snapshot `mid` (taken while the cancelled stream ran), compute the KV cache usage as a fraction of
        the pool from `minengine:num_free_blocks` and `total_blocks`. The check compares it with the server's own
        `vllm:kv_cache_usage_perc`. Use `metric(mid, name)`.
        """, "Usage is the share of blocks held: 1 - free / total. vLLM's gauge is a fraction (1 means 100 %), despite its name.", "answer_1",
        'answer_1 = 1 - metric(mid, "minengine:num_free_blocks") / total_blocks',
        """
        check_close("Exercise 1: KV cache usage", answer_1, metric(mid, "vllm:kv_cache_usage_perc"), rel_tol=1e-6)
        """, wrong=['answer_1 = metric(mid, "minengine:num_free_blocks") / total_blocks  # the free share',
                    'answer_1 = 100 * (1 - metric(mid, "minengine:num_free_blocks") / total_blocks)  # "_perc" is a fraction',
                    'answer_1 = total_blocks - metric(mid, "minengine:num_free_blocks")  # blocks, not a fraction']),
    *exercise(2, """
        Before running a benchmark, predict how the server's counters must move: `bench-serve` above sent `BENCH["num_requests"]` requests
        of `BENCH["input_len"]` prompt tokens and `BENCH["output_len"]` output tokens each (`ignore_eos`). Answer
        `(prompt_tokens_added, generation_tokens_added)`; the check reads the counters' real movement.
        """, "Every request's prompt is counted once, every generated token once (the first one included).", "answer_2",
        'answer_2 = (BENCH["num_requests"] * BENCH["input_len"], BENCH["num_requests"] * BENCH["output_len"])',
        """
        check("Exercise 2: counter movement", answer_2, (round(delta["vllm:prompt_tokens"]), round(delta["vllm:generation_tokens"])))
        """, wrong=['answer_2 = (BENCH["num_requests"], BENCH["num_requests"])  # requests, not tokens',
                    'answer_2 = (BENCH["num_requests"] * BENCH["input_len"], BENCH["num_requests"] * (BENCH["output_len"] - 1))  # the first token counts too',
                    'answer_2 = (BENCH["input_len"], BENCH["output_len"])']),
    *question("why must the server abort a request when its client disconnects?", """
        The cancelled stream above was aborted once the server saw its connection close. What would happen to a busy server that
        kept decoding for clients that had left?
        """, """
        A zombie request keeps its sequence slot and its KV blocks (its whole context stays in the pool) and takes a token
        of every step's budget, for output whose client has gone: above, the stream held blocks and was served every step
        until it was aborted (checked: both streams held blocks while they ran; the cancelled request was served every step
        until it left). Without the abort the request would decode on to its `max_tokens`, and what a pool short of blocks does
        to the requests behind it is chapter 06's subject; this chapter did not run a server full of zombies, so it puts no
        number on it. Aborting frees the slot and the blocks between two steps (checked: its blocks were free in that step).
        """),
    *question("what if /metrics showed KV usage near 1 and a growing waiting queue?", """
        You are on call. `vllm:kv_cache_usage_perc` sits near 1.0, `vllm:num_requests_waiting` keeps growing and
        `vllm:num_preemptions_total` is rising. What is happening, and what would you change?
        """, """
        Memory is the bottleneck: the running requests' contexts fill the KV pool, new requests cannot be admitted, and
        running ones are preempted when they grow (checked: ch06 · the small pool forces preemptions and the roomy one none): recompute preemption then
        re-prefills them, wasting compute. What helps: add KV memory (raise `gpu_memory_utilization`, or use tensor
        parallelism to spread the weights), cap the concurrent sequences (`max_num_seqs`) so the admitted ones finish,
        cache prefixes if prompts share them, cap `max_model_len`, or add replicas. Check TTFT P99 and goodput to see how much users feel it.
        """),
    md("""
    ## Structured outputs: a mask over the vocabulary
    A client that needs JSON sends `response_format={"type": "json_schema", ...}` (OpenAI's) or vLLM's
    `structured_outputs` (`{"json": ...}`, `{"regex": ...}`, `{"choice": [...]}`, `{"grammar": ...}`). The engine
    compiles the constraint with **xgrammar** into an automaton over the tokenizer's vocabulary (XGrammar, Dong et al.
    2025; Willard & Louf 2023). Before each token, the automaton's state after the tokens so far gives a bitmask: the
    tokens that keep the text a prefix of a valid answer. The sampler sets every other logit to -inf, so the token is
    valid whether it is the argmax or a draw, and the request stops when the grammar has accepted its end. The state
    lives on the request next to its output tokens and moves only when a step commits: a failed step never moved it,
    a preempted request keeps it. Below, the same server answers with a choice, then one request is replayed in this
    process to see the mask at every position: how much of the vocabulary it leaves, and what filling it
    cost (wall time of this machine: xgrammar computes a state's mask at its first fill, so the output is replayed 7
    times through fresh states and the median first fill is kept, torch pinned to 1 thread; the load average is in
    the title).
    """),
    conclusion("""
    import json

    from minengine.sampling_params import StructuredOutputsParams
    from minengine.viz.structured_figures import mask_figure
    from minengine.worker.structured_output import mask_profile

    verdict = httpx.post(server.url + "/v1/completions", timeout=120, json={
        "prompt": "ROMEO:", "max_tokens": 8, "temperature": 0.8, "structured_outputs": {"choice": ["aye", "nay"]}}).json()
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"], "additionalProperties": False}
    so = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    local = LLM(num_kv_blocks=64)
    tok = local.get_tokenizer()
    closing = {tok.convert_tokens_to_ids(ch): 4.0 for ch in '"},'}  # the tiny model rambles: nudge it to close
    answer = local.generate("ROMEO:", SamplingParams(temperature=0.8, seed=4, max_tokens=64, structured_outputs=so,
                                                     logit_bias=closing), use_tqdm=False)[0].outputs[0]
    profile = mask_profile(local.llm_engine.structured_output_manager, so, answer.token_ids, repeats=7)
    mask_figure(profile, labels=[repr(tok.decode([t])) for t in answer.token_ids]).show()
    shares = [s.allowed_share for s in profile.steps]
    forced = sum(s.num_allowed == 1 for s in profile.steps)
    conclude(f"The server chose **{verdict['choices'][0]['text']!r}** of `aye` / `nay`. The JSON answer "
             f"`{answer.text}` ({answer.finish_reason}) took {len(profile.steps)} tokens; at **{forced}** of them the mask "
             f"left exactly one token (a key, a quote, the end), and at most it left **{max(shares):.1%}** of the vocabulary.",
             [("the server answered one of the choices", verdict["choices"][0]["text"] in ("aye", "nay")),
              ("the JSON answer is complete and valid", answer.finish_reason == "stop"
               and set(json.loads(answer.text)) == {"name", "age"}),
              ("some positions were forced", forced > 0), ("the share is at most 1", max(shares) <= 1)])
    """),
    md("## Stop the server"),
    conclusion("""
    final = read_metrics(server.url)
    code_at_exit = server.stop()
    conclude(f"At the end nothing was running and **{metric(final, 'minengine:num_free_blocks'):.0f} of {total_blocks}** KV blocks were free; "
             f"the server process exited with code {code_at_exit} after SIGTERM.",
             [("no request left running", metric(final, "vllm:num_requests_running") == 0),
              ("no KV block leaked", metric(final, "minengine:num_free_blocks") == total_blocks),
              ("the server stopped", not server.running)])
    """),
    *summary([
        "`python -m minengine serve` is an OpenAI-compatible server around the same `LLMEngine`: the official client works unchanged, and greedy text equals `LLM.generate`.",
        "A client that hangs up aborts its request between two steps: the next step no longer has it, and its KV blocks are already free (no zombies).",
        "`/metrics` speaks Prometheus with vLLM's names: gauges for now (running, waiting, KV usage), counters and histograms for rates and percentiles.",
        "`/v1/engine/steps` streams every `StepTrace`; the course's and the dashboard's figures draw it unchanged, and the dashboard's *live server* source (`ServerFeed`) reads it while the server serves.",
        "`bench-serve --base-url` measures any OpenAI-compatible server from the client side; its counts reconcile with the server's counters.",
    ]),
    *glossary([
        ("OpenAI-compatible server", "OpenAI 兼容服务器", "HTTP routes and JSON shapes of OpenAI's API (`/v1/completions`, `/v1/chat/completions`)"),
        ("server-sent events (SSE)", "服务器发送事件", "one HTTP response streamed as `data:` events; how tokens stream"),
        ("cancellation / abort", "取消 / 中止", "a client that leaves ends its request, freeing slot and KV blocks"),
        ("gauge / counter / histogram", "仪表 / 计数器 / 直方图", "Prometheus metric types: a value now / only grows / bucketed counts"),
        ("step feed", "步进事件流", "`/v1/engine/steps`: every engine step as JSON"),
        ("zombie request", "僵尸请求", "a request still decoding for a client that has gone"),
    ]),
]

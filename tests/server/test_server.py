"""The OpenAI-compatible server, through the official ``openai`` client and raw HTTP, on loopback: the same
text as ``LLM.generate``, 64 concurrent streams, disconnects that free their KV blocks within a step, 400s
naming the field while others stream, Prometheus metrics consistent with the engine's summary, the step feed."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from minengine import LLM, SamplingParams
from minengine.entrypoints.protocol import MAX_N, ChatCompletionRequest, CompletionRequest, OpenAIError
from minengine.metrics.prometheus import ITL_BUCKETS, TTFT_BUCKETS
from minengine.workloads import SHAKESPEARE_OPENINGS
from tests.server_helpers import running_server

TIMEOUT = 60.0  # seconds: every client call is bounded
GREEDY = dict(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="EMPTY", timeout=TIMEOUT, max_retries=0)


def ref_texts(ref, prompts, max_tokens=24, **kw):
    outs = ref.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, **kw), use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def test_models_health_version(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-shakespeare-llama"]
    assert httpx.get(server.url + "/health", timeout=TIMEOUT).status_code == 200
    assert httpx.get(server.url + "/version", timeout=TIMEOUT).json()["version"]


def test_completions_equal_llm_generate(client, ref):
    prompts = SHAKESPEARE_OPENINGS[:4]
    want = ref_texts(ref, prompts)
    for p, w in zip(prompts, want):
        r = client.completions.create(model="tiny-shakespeare-llama", prompt=p, **GREEDY)
        assert r.choices[0].text == w and r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == 24
        stream = client.completions.create(model="tiny-shakespeare-llama", prompt=p, stream=True,
                                           stream_options={"include_usage": True}, **GREEDY)
        chunks = list(stream)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == w
        assert chunks[-1].usage.completion_tokens == 24 and not chunks[-1].choices
    batch = client.completions.create(model="tiny-shakespeare-llama", prompt=prompts, **GREEDY)
    assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == want
    ids = ref.get_tokenizer()(prompts[0])["input_ids"]
    by_ids = client.completions.create(model="tiny-shakespeare-llama", prompt=ids, **GREEDY)
    assert by_ids.choices[0].text == want[0]


def test_chat_equals_llm_chat(client, ref):
    messages = [{"role": "system", "content": "A street in Verona."},
                {"role": "user", "content": "Good morrow, fair maid."}]
    (want,) = ref.chat(messages, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    r = client.chat.completions.create(model="tiny-shakespeare-llama", messages=messages, **GREEDY)
    assert r.choices[0].message.content == want.outputs[0].text and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)
    stream = client.chat.completions.create(model="tiny-shakespeare-llama", messages=messages, stream=True,
                                            **GREEDY)
    deltas = list(stream)
    assert deltas[0].choices[0].delta.role == "assistant"
    assert "".join(d.choices[0].delta.content or "" for d in deltas) == want.outputs[0].text
    assert deltas[-1].choices[0].finish_reason == "length"


def test_64_concurrent_streaming_clients(server, ref):
    prompts = [SHAKESPEARE_OPENINGS[i % len(SHAKESPEARE_OPENINGS)] + " " * (i % 3) for i in range(64)]
    lengths = [8 + i % 17 for i in range(64)]
    want = [ref_texts(ref, [p], max_tokens=n)[0] for p, n in zip(prompts, lengths)]

    async def one(aclient, prompt, n):
        stream = await aclient.completions.create(model="tiny-shakespeare-llama", prompt=prompt, stream=True,
                                                  temperature=0, max_tokens=n)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def main():
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="EMPTY", timeout=TIMEOUT, max_retries=0)
        async with aclient:
            return await asyncio.gather(*(one(aclient, p, n) for p, n in zip(prompts, lengths)))

    steps_before = server.engine.num_steps
    got = asyncio.run(main())
    assert got == want
    server.wait_idle()
    batched = [t for t in server.engine.traces if t.step >= steps_before]
    assert max(t.num_running for t in batched) > 16  # they really ran concurrently
    assert server.engine.kv_cache_manager.num_free_blocks == server.engine.num_kv_blocks


def _read_chunks(response, count: int) -> str:
    """Read ``count`` SSE data chunks of a streaming completion; returns its id."""
    seen, rid = 0, None
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            rid = json.loads(line[6:])["id"]
            seen += 1
            if seen == count:
                return rid
    raise AssertionError("stream ended early")


def test_client_closed_mid_stream_frees_request_and_blocks_within_a_step(server):
    engine = server.engine
    body = {"prompt": SHAKESPEARE_OPENINGS[0], "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=TIMEOUT) as r:
        rid = _read_chunks(r, 3) + "-0"
        steps_at_close = engine.num_steps
    server.wait_idle()
    assert rid not in engine.scheduler.requests
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
    m = engine.request_metrics[rid]
    assert m.finish_reason == "abort" and m.num_output_tokens < 400
    later = [t.step for t in engine.traces if t.step >= steps_at_close and any(c.request_id == rid for c in t.chunks)]
    # the step running when the client left, and at most the one the loop had started before it read the
    # disconnect; never more
    assert len(later) <= 2, later


def test_client_gone_before_non_streamed_answer_aborts(server):
    engine = server.engine
    body = {"prompt": SHAKESPEARE_OPENINGS[1], "max_tokens": 450, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(TIMEOUT, read=0.5))
    server.wait_idle()
    aborted = [m for m in engine.request_metrics.values() if m.finish_reason == "abort" and m.num_prompt_tokens
               and m.num_output_tokens < 450]
    assert aborted and engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


BAD_REQUESTS = [
    ("/v1/completions", {"prompt": "ROMEO:", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "ROMEO:", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "ROMEO:", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "ROMEO:", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "ROMEO:", "n": 100_000, "max_tokens": 1}, 400, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 129}, 400, "n"),
    ("/v1/completions", {"prompt": "ROMEO:", "priority": 3}, 400, "priority"),  # the server runs decode-first
    ("/v1/completions", {"prompt": "ROMEO:", "logprobs": 50}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "ROMEO:", "stop": 123}, 400, "stop"),
    ("/v1/completions", {"prompt": "ROMEO:", "presence_penalty": 3}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": [5, 10**6]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x " * 600}, 400, "prompt"),
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/completions", {"prompt": "ROMEO:", "model": "gpt-4"}, 404, "model"),
    ("/v1/completions", {"prompt": "ROMEO:", "suffix": "x"}, 400, "suffix"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400,
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1}, 400,
     "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
     400, "tools"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/tokenize", {}, 400, "prompt"),
    # lone surrogates (JSON "\\ud800" escapes) reached the tokenizer, a TypeError and a 500
    ("/tokenize", {"prompt": "a\ud800"}, 400, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": "\udfff"}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi\ud800"}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "name": "\ud800"}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ '\ud800' }}"},
     400, "chat_template"),
]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(min_value=MAX_N + 1, max_value=2**70), chat=st.booleans())
def test_n_over_openais_limit_names_that_limit(n, chat):
    """Any ``n`` above the server's 128 is refused with 128 as the limit: above 65,536 the message used to name
    ``SamplingParams``' own limit instead, so a client that lowered ``n`` to it was refused again."""
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], n=n) if chat else \
        CompletionRequest(prompt="ROMEO:", n=n)
    with pytest.raises(OpenAIError) as info:
        body.sampling_params(None, None, {})
    assert info.value.param == "n" and f"n must be <= {MAX_N}" in info.value.message


def test_bad_requests_get_400_naming_the_field_while_others_stream(server, ref):
    prompt = SHAKESPEARE_OPENINGS[2]
    (want,) = ref_texts(ref, [prompt], max_tokens=120, ignore_eos=True)
    got, progress = [], []

    def stream():
        with httpx.stream("POST", server.url + "/v1/completions", timeout=TIMEOUT, json={
                "prompt": prompt, "max_tokens": 120, "temperature": 0, "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    got.append(json.loads(line[6:])["choices"][0]["text"])
                    progress.append(time.monotonic())

    t = threading.Thread(target=stream)
    t.start()
    while not progress:
        time.sleep(0.01)
    answered = []
    for path, body, status, field in BAD_REQUESTS:
        r = httpx.post(server.url + path, content=json.dumps(body), timeout=TIMEOUT,  # \u escapes, as clients
                       headers={"content-type": "application/json"})
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert err["code"] == status and err["param"] == field and field.split("_")[0] in err["message"], err
        answered.append(time.monotonic())
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", timeout=TIMEOUT,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    # the step feed's query parameters name themselves too (their param was null)
    for query, field in (("history=abc", "history"), ("history=-1", "history"), ("block_tables=maybe", "block_tables")):
        r = httpx.get(server.url + "/v1/engine/steps?" + query, timeout=TIMEOUT)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    t.join(TIMEOUT)
    assert "".join(got) == want
    assert any(p > answered[0] for p in progress)  # it kept streaming while the bad ones were answered
    server.wait_idle()
    assert server.engine.kv_cache_manager.num_free_blocks == server.engine.num_kv_blocks


def test_n_logprobs_and_penalties_over_http(client, ref):
    r = client.completions.create(model="tiny-shakespeare-llama", prompt="ROMEO:", n=3, temperature=0.9,
                                  seed=7, max_tokens=12)
    assert sorted(c.index for c in r.choices) == [0, 1, 2] and len({c.text for c in r.choices}) > 1
    (want,) = ref.generate("ROMEO:", SamplingParams(n=3, temperature=0.9, seed=7, max_tokens=12), use_tqdm=False)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == [o.text for o in want.outputs]
    r = client.completions.create(model="tiny-shakespeare-llama", prompt="ROMEO:", logprobs=3, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 24 and len(lp.top_logprobs[0]) == 3 and "".join(lp.tokens) == r.choices[0].text
    assert all(t <= 0 for t in lp.token_logprobs) and lp.text_offset[0] == 0
    (w,) = ref.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=24, logprobs=3), use_tqdm=False)
    assert lp.token_logprobs == pytest.approx([p[t].logprob for p, t in zip(w.outputs[0].logprobs,
                                                                            w.outputs[0].token_ids)])
    chat = client.chat.completions.create(model="tiny-shakespeare-llama", logprobs=True, top_logprobs=2,
                                          messages=[{"role": "user", "content": "Speak."}], **GREEDY)
    content = chat.choices[0].logprobs.content
    assert len(content) == 24 and len(content[0].top_logprobs) == 2
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    pen = client.completions.create(model="tiny-shakespeare-llama", prompt="ROMEO:", temperature=0, max_tokens=24,
                                    extra_body={"repetition_penalty": 1.5, "top_k": 0})
    assert pen.choices[0].text == ref_texts(ref, ["ROMEO:"], repetition_penalty=1.5)[0]


def test_tokenize_detokenize_reset_prefix_cache(server, ref):
    tok = ref.get_tokenizer()
    r = httpx.post(server.url + "/tokenize", json={"prompt": "ROMEO:\nO Romeo"}, timeout=TIMEOUT).json()
    assert r["tokens"] == tok("ROMEO:\nO Romeo")["input_ids"] and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 512
    d = httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}, timeout=TIMEOUT).json()
    assert d["prompt"] == "ROMEO:\nO Romeo"
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]},
                      timeout=TIMEOUT).json()
    assert tok.decode(chat["tokens"]) == "ROMEO:\nHi\n\nJULIET:\n"
    server.wait_idle()
    assert httpx.post(server.url + "/reset_prefix_cache", timeout=TIMEOUT).json() == {"reset": True}
    assert server.engine.kv_cache_manager.pool.num_cached_free_blocks == 0


def _metrics(url: str) -> dict:
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families: dict, name: str, sample: str | None = None, **labels) -> float:
    fam = families[name]
    want = sample or name
    return sum(s.value for s in fam.samples if s.name == want and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_move_and_match_the_engine_summary(bundled_model):
    # a small KV pool, so concurrent requests preempt each other; a shared prefix, so the prefix cache hits
    with running_server(bundled_model, num_kv_blocks=24, max_num_batched_tokens=64) as server:
        before = _metrics(server.url)
        assert before["vllm:num_requests_running"].type == "gauge"
        assert before["vllm:prompt_tokens"].type == "counter"
        assert before["vllm:time_to_first_token_seconds"].type == "histogram"
        assert _value(before, "vllm:generation_tokens", "vllm:generation_tokens_total") == 0
        shared = "ROMEO:\n" + "O Romeo, Romeo, wherefore art thou Romeo? " * 3

        async def main():
            aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="EMPTY", timeout=TIMEOUT,
                                         max_retries=0)
            async with aclient:
                return await asyncio.gather(*(aclient.completions.create(
                    model="tiny-shakespeare-llama", prompt=shared + str(i), temperature=0, max_tokens=60,
                    extra_body={"ignore_eos": True}) for i in range(6)))

        responses = asyncio.run(main())
        server.wait_idle()
        after = _metrics(server.url)
        s = server.engine.summary()
        done = list(server.engine.request_metrics.values())
        gen = _value(after, "vllm:generation_tokens", "vllm:generation_tokens_total")
        assert gen == sum(r.usage.completion_tokens for r in responses) == s.output_tokens == 360
        assert _value(after, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == s.prompt_tokens
        assert _value(after, "vllm:request_success", "vllm:request_success_total") == s.num_requests == 6
        assert _value(after, "vllm:request_success", "vllm:request_success_total", finished_reason="length") == 6
        assert _value(after, "vllm:num_preemptions", "vllm:num_preemptions_total") == s.num_preemptions > 0
        assert _value(after, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == s.prefix_hit_tokens > 0
        assert _value(after, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") == \
            s.prefix_queried_tokens
        assert _value(after, "vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count") == 6
        ttft_sum = _value(after, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_sum")
        assert ttft_sum == pytest.approx(sum(m.ttft for m in done))
        assert _value(after, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == \
            sum(len(m.itls) for m in done)
        assert _value(after, "vllm:iteration_tokens_total", "vllm:iteration_tokens_total_count") == s.num_steps
        assert _value(after, "minengine:num_steps", "minengine:num_steps_total") == s.num_steps
        assert _value(after, "vllm:num_requests_running") == 0 and _value(after, "vllm:kv_cache_usage_perc") == 0
        assert _value(after, "minengine:num_free_blocks") == 24
        buckets = [float(x.labels["le"]) for x in after["vllm:time_to_first_token_seconds"].samples
                   if x.name.endswith("_bucket")]
        assert buckets == TTFT_BUCKETS + [float("inf")]
        itl_buckets = [float(x.labels["le"]) for x in after["vllm:inter_token_latency_seconds"].samples
                       if x.name.endswith("_bucket")]
        assert itl_buckets == ITL_BUCKETS + [float("inf")]
        labels = after["vllm:num_requests_running"].samples[0].labels
        assert labels == {"model_name": "tiny-shakespeare-llama", "engine": "0"}
        assert _value(after, "vllm:cache_config_info", block_size="16", num_gpu_blocks="24") == 1


def _sse_events(response, until):
    """(event, data) pairs of a server-sent-event stream until ``until(event, data)`` is true."""
    event = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            yield event, data
            if until(event, data):
                return


def test_step_feed_streams_every_step_as_json(server):
    events, ready = [], threading.Event()

    def watch():
        with httpx.stream("GET", server.url + "/v1/engine/steps", timeout=TIMEOUT) as r:
            for ev in _sse_events(r, lambda e, d: e == "step" and any(rid.startswith("cmpl-") and rid.endswith("-0")
                                                                      for rid in d["finished_ids"])):
                events.append(ev)
                ready.set()

    t = threading.Thread(target=watch)
    t.start()
    assert ready.wait(TIMEOUT)  # the engine event arrived: subscribed
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 5, "temperature": 0},
                   timeout=TIMEOUT).json()
    t.join(TIMEOUT)
    assert events[0][0] == "engine"
    info = events[0][1]
    assert info["num_kv_blocks"] == 256 and info["block_size"] == 16 and info["max_num_batched_tokens"] == 256
    steps = [d for e, d in events if e == "step"]
    rid = r["id"] + "-0"
    mine = [d for d in steps if any(c["request_id"] == rid for c in d["chunks"])]
    assert len(mine) == 5 and mine[0]["admitted_ids"] == [rid] and rid in mine[-1]["finished_ids"]
    assert [d["step"] for d in steps] == sorted(d["step"] for d in steps)
    assert mine[0]["block_tables"][rid] and mine[0]["num_total_blocks"] == 256 and mine[0]["num_dropped"] == 0
    assert all(d["end_time"] >= d["start_time"] for d in steps)
    with httpx.stream("GET", server.url + "/v1/engine/steps?history=3&block_tables=false", timeout=TIMEOUT) as r:
        replay = [d for _, d in _sse_events(r, lambda e, d: e == "step" and d["step"] == steps[-1]["step"])]
    assert replay[-1]["step"] == steps[-1]["step"] and replay[-1]["block_tables"] is None


def test_step_feed_stops_replaying_history_to_a_client_that_left(bundled_model, monkeypatch):
    """A client that asks for a long history and leaves after the first step stops the replay: before, the
    server serialised and wrote every kept step to the closed socket (thousands of "socket.send() raised
    exception." lines) while holding the event loop. Its subscription is gone too."""
    from minengine.entrypoints.openai_server import OpenAIServing

    sent = []
    real = OpenAIServing._trace_json

    def counting(trace, block_tables, num_dropped):
        sent.append(trace.step)
        # 2 ms a step: the replay outlasts the client's close even on an idle machine (else all 400 small steps
        # can fit the loopback socket's buffers before the close arrives); without a suspension point in the
        # replay loop every step is still sent, so the test fails on the old code
        time.sleep(0.002)
        return real(trace, block_tables, num_dropped)

    monkeypatch.setattr(OpenAIServing, "_trace_json", staticmethod(counting))
    with running_server(bundled_model) as s:
        httpx.post(s.url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 400, "ignore_eos": True,
                                                    "temperature": 0}, timeout=TIMEOUT)
        kept = len(s.engine.traces)
        assert kept >= 400
        with httpx.stream("GET", s.url + f"/v1/engine/steps?history={kept}", timeout=TIMEOUT) as r:
            for line in r.iter_lines():
                if line.startswith("event: step"):
                    break
        deadline = time.monotonic() + TIMEOUT
        while s.async_engine._subscribers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not s.async_engine._subscribers
        assert len(sent) < kept // 2, (len(sent), kept)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_prepends_the_prompt_text_for_text_and_token_prompts(server, ref, stream):
    """``echo``: each choice starts with its prompt's text, for a token-id prompt too (its decoded text, as
    vLLM; it was echoed as nothing), streamed or not."""
    tok = ref.get_tokenizer()
    ids = tok("JULIET:\nO Romeo")["input_ids"]
    for prompt, text in (("ROMEO:", "ROMEO:"), (ids, tok.decode(ids)), ([ids, [5, 6]], None)):
        body = {"prompt": prompt, "echo": True, "n": 2, "max_tokens": 4, "temperature": 0}
        plain = httpx.post(server.url + "/v1/completions", json={**body, "echo": False}, timeout=TIMEOUT).json()
        if stream:
            got = {}
            with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True},
                              timeout=TIMEOUT) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        for c in json.loads(line[6:])["choices"]:
                            got[c["index"]] = got.get(c["index"], "") + c["text"]
        else:
            r = httpx.post(server.url + "/v1/completions", json=body, timeout=TIMEOUT).json()
            got = {c["index"]: c["text"] for c in r["choices"]}
        prompts = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt
        texts = [p if isinstance(p, str) else tok.decode(p) for p in prompts]
        assert text is None or texts == [text]
        want = {c["index"]: texts[c["index"] // 2] + c["text"] for c in plain["choices"]}
        assert got == want and len(got) == 2 * len(prompts)


def test_priority_is_honoured_by_a_priority_server(bundled_model):
    """With --scheduling-policy priority, a request's priority is accepted (and a decode-first server refuses it,
    in BAD_REQUESTS): the field is never silently ignored."""
    with running_server(bundled_model, scheduling_policy="priority") as s:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 3, "priority": 3},
                       timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3


def test_speculative_decoding_through_the_server(bundled_model):
    """With a speculative_config the server streams the same text as plain greedy generation (several tokens
    may arrive in one chunk), and /metrics has vLLM's spec-decode counters matching the engine's summary."""
    prompt = "ROMEO:\nO, she doth teach the torches to burn bright!\n" * 4
    (ref,) = LLM(bundled_model, max_model_len=512).generate([prompt], SamplingParams(temperature=0, max_tokens=40),
                                                           use_tqdm=False)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    with running_server(bundled_model, speculative_config=spec) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="EMPTY", timeout=TIMEOUT, max_retries=0)
        whole = client.completions.create(model="tiny-shakespeare-llama", prompt=prompt, temperature=0,
                                          max_tokens=40)
        stream = client.completions.create(model="tiny-shakespeare-llama", prompt=prompt, temperature=0,
                                           max_tokens=40, stream=True)
        streamed = "".join(chunk.choices[0].text for chunk in stream)
        assert whole.choices[0].text == streamed == ref.outputs[0].text
        server.wait_idle()
        families = _metrics(server.url)
        s = server.engine.summary()
        assert s.spec_accepted_tokens > 0
        for name, value in (("vllm:spec_decode_num_drafts", s.spec_num_drafts),
                            ("vllm:spec_decode_num_draft_tokens", s.spec_draft_tokens),
                            ("vllm:spec_decode_num_accepted_tokens", s.spec_accepted_tokens)):
            assert _value(families, name, name + "_total") == value, name
        assert _value(families, "vllm:generation_tokens", "vllm:generation_tokens_total") == 80


CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def check_continuous_usage(chunks, prompt_tokens_of, final_prompt_tokens, final_completion_tokens):
    """vLLM's continuous usage stats: every chunk with a choice carries its prompt's token count (constant) and
    its own choice's completion tokens so far (0 before the first token, non-decreasing, ending at the
    choice's length); the last chunk (no choices) sums them all."""
    assert not chunks[-1].choices and chunks[-1].usage.prompt_tokens == final_prompt_tokens
    assert chunks[-1].usage.completion_tokens == final_completion_tokens
    so_far: dict[int, int] = {}
    for c in chunks[:-1]:
        (choice,) = c.choices
        u = c.usage
        assert u.prompt_tokens == prompt_tokens_of(choice.index), (choice.index, u)
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens
        assert u.completion_tokens >= so_far.get(choice.index, 0), (choice.index, u)
        so_far[choice.index] = u.completion_tokens
    assert sum(so_far.values()) == final_completion_tokens
    return so_far


@pytest.mark.parametrize("n", [1, 2])
def test_chat_continuous_usage_stats_on_every_chunk_the_role_chunk_included(client, n):
    """``stream_options.continuous_usage_stats``: the role chunk reports the prompt's tokens (it said 0) and
    0 completion tokens; every later chunk the same prompt count and its choice's tokens so far (vLLM)."""
    messages = [{"role": "user", "content": "Good morrow, fair maid."}]
    kw = dict(model="tiny-shakespeare-llama", messages=messages, n=n, temperature=0.0, max_tokens=12)
    plain = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options=CONTINUOUS))
    roles = [c for c in chunks if c.choices and c.choices[0].delta.role]
    assert sorted(c.choices[0].index for c in roles) == list(range(n)) and chunks[:n] == roles
    assert all(c.usage.prompt_tokens == plain.usage.prompt_tokens > 0 and c.usage.completion_tokens == 0
               for c in roles)
    per_choice = check_continuous_usage(chunks, lambda i: plain.usage.prompt_tokens, plain.usage.prompt_tokens,
                                        plain.usage.completion_tokens)
    assert per_choice == {i: 12 for i in range(n)}


def test_completions_continuous_usage_stats_per_prompt_and_choice(client, ref):
    """The completions stream counts, per chunk, its own prompt's tokens and its own choice's tokens so far (a
    batch of prompts of different lengths, n=2: the sums over prompts seen so far it reported grew mid-stream)."""
    prompts = ["ROMEO:", SHAKESPEARE_OPENINGS[1]]
    lengths = [len(ref.get_tokenizer()(p)["input_ids"]) for p in prompts]
    assert lengths[0] != lengths[1]
    kw = dict(model="tiny-shakespeare-llama", prompt=prompts, n=2, temperature=0.0, max_tokens=6)
    plain = client.completions.create(**kw)
    assert plain.usage.prompt_tokens == sum(lengths)
    chunks = list(client.completions.create(**kw, stream=True, stream_options=CONTINUOUS))
    per_choice = check_continuous_usage(chunks, lambda i: lengths[i // 2], plain.usage.prompt_tokens,
                                        plain.usage.completion_tokens)
    assert per_choice == {i: 6 for i in range(4)}


def chat_texts(server, body: dict, stream: bool) -> tuple[dict[int, str], dict[int, list[str]], set[str]]:
    """(text per choice, its content deltas in order, the roles seen) of a chat completion over raw HTTP."""
    if not stream:
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        choices = r.json()["choices"]
        return ({c["index"]: c["message"]["content"] for c in choices}, {},
                {c["message"]["role"] for c in choices})
    deltas: dict[int, list[str]] = {}
    roles = set()
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True},
                      timeout=TIMEOUT) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    if "role" in c["delta"]:
                        roles.add(c["delta"]["role"])
                    deltas.setdefault(c["index"], []).append(c["delta"].get("content") or "")
    return {i: "".join(d) for i, d in deltas.items()}, deltas, roles


ECHOED = "But soft, what light"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("content", [ECHOED, [{"type": "text", "text": "But soft, "}, {"type": "text", "text":
                                                                                          "what light"}]])
def test_chat_echo_prepends_the_last_message_of_the_responses_role(server, stream, content):
    """Chat ``echo`` (vLLM): continuing an assistant message, each of the n choices starts with that message's
    content (as text, from text parts too): in the message, or streamed as the first content chunk after the
    role; the rest is what ``echo=false`` generates."""
    messages = [{"role": "user", "content": "Good morrow."}, {"role": "assistant", "content": content}]
    body = {"messages": messages, "n": 2, "max_tokens": 6, "temperature": 0, "add_generation_prompt": False,
            "continue_final_message": True}
    plain, _, _ = chat_texts(server, body, stream=False)
    got, deltas, roles = chat_texts(server, {**body, "echo": True}, stream)
    assert got == {i: ECHOED + plain[i] for i in range(2)} and roles == {"assistant"}
    if stream:
        assert all(d[:2] == ["", ECHOED] for d in deltas.values()), deltas


@pytest.mark.parametrize("stream", [False, True])
def test_chat_echo_of_another_roles_message_or_echo_false_prepends_nothing(server, ref, stream):
    """``echo`` with a user's last message under the assistant's generation prompt prepends nothing; neither does
    ``echo=false`` (the text is ``LLM.chat``'s). Without a generation prompt the response's role is the last
    message's (vLLM), so then that message is echoed."""
    messages = [{"role": "user", "content": "Good morrow, fair maid."}]
    (want,) = ref.chat(messages, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    body = {"messages": messages, "n": 2, "max_tokens": 6, "temperature": 0}
    for echo in (False, True):
        got, _, roles = chat_texts(server, {**body, "echo": echo}, stream)
        assert got == {0: want.outputs[0].text, 1: want.outputs[0].text} and roles == {"assistant"}
    body.update(add_generation_prompt=False)
    plain, _, roles = chat_texts(server, body, stream)
    got, _, _ = chat_texts(server, {**body, "echo": True}, stream)
    assert roles == {"user"} and got == {i: messages[0]["content"] + plain[i] for i in range(2)}

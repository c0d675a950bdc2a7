"""Request isolation through the real server: one poisoned request among concurrent streams fails alone (the
official openai client sees the others' text unchanged); the work of one call is bounded (bytes, prompts x n);
``/health`` answers while a huge prompt is refused; a client that leaves aborts every child of its call; every
4xx is OpenAI's error body; and for random JSON in every field the server answers 200 or a 4xx, never a 500,
and leaks no KV block."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine import LLM, SamplingParams
from minengine.engine.detokenizer import IncrementalDetokenizer
from minengine.entrypoints.cli_args import FrontendArgs
from minengine.entrypoints.protocol import ChatCompletionRequest, CompletionRequest
from minengine.workloads import SHAKESPEARE_OPENINGS
from tests.server_helpers import SERVER_CONFIG, running_server

TIMEOUT = 60.0
MODEL = "tiny-shakespeare-llama"


def is_openai_error(r: httpx.Response, status: int) -> dict:
    """The response is ``status`` with OpenAI's error body; returns its ``error`` object."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status, err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err
    return err


# ---- (b) a poisoned request fails alone ---------------------------------------------------------------------

POISON_IDS = [7, 8, 9, 10]  # the prompt whose detokenizer the test breaks


def test_a_poisoned_request_among_concurrent_streams_fails_alone(bundled_model, monkeypatch):
    """Before: a step that raised failed every request in flight. Now the culprit's stream ends with an error
    (the openai client raises), the 400s are 400s, and the N others stream exactly their unpoisoned text."""
    advanced = IncrementalDetokenizer.advanced

    def poisoned(self, token_id):
        if list(self.prompt_token_ids) == POISON_IDS and self.num_tokens >= 2:  # fails mid-stream
            raise UnicodeError("poisoned detokenizer")
        return advanced(self, token_id)

    prompts = [SHAKESPEARE_OPENINGS[i % len(SHAKESPEARE_OPENINGS)] + " " * (i // 4) for i in range(8)]
    lengths = [16 + 3 * i for i in range(8)]
    ref = LLM(bundled_model, **SERVER_CONFIG)
    want = [ref.generate(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0].text for p, n in zip(prompts, lengths)]
    monkeypatch.setattr(IncrementalDetokenizer, "advanced", poisoned)

    async def stream(aclient, prompt, n, **kw):
        s = await aclient.completions.create(model=MODEL, prompt=prompt, stream=True, temperature=0, max_tokens=n,
                                             extra_body={"ignore_eos": True, **kw.pop("extra_body", {})}, **kw)
        return "".join([c.choices[0].text async for c in s if c.choices])

    async def main(url):
        aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="EMPTY", timeout=TIMEOUT, max_retries=0)
        async with aclient:
            calls = [stream(aclient, p, n) for p, n in zip(prompts, lengths)]
            calls.insert(3, stream(aclient, POISON_IDS, 40))  # fails in the engine, after its first tokens
            calls.insert(5, stream(aclient, "ROMEO:", 10**400))  # was: passed, then broke everyone's step
            calls.insert(7, stream(aclient, "ROMEO:", 8, extra_body={"stop_token_ids": [2**70], "min_tokens": 1}))
            return await asyncio.gather(*calls, return_exceptions=True)

    with running_server(bundled_model) as s:
        got = asyncio.run(main(s.url))
        s.wait_idle()
        assert s.engine.kv_cache_manager.num_free_blocks == s.engine.num_kv_blocks
    stop_id, huge, poison = got.pop(7), got.pop(5), got.pop(3)
    assert isinstance(poison, openai.APIError) and "poisoned detokenizer" in str(poison)
    assert isinstance(huge, openai.BadRequestError) and huge.body["param"] == "max_tokens"
    assert isinstance(stop_id, openai.BadRequestError) and stop_id.body["param"] == "stop_token_ids"
    assert got == want


# ---- bounded work per call ----------------------------------------------------------------------------------

def test_prompts_times_n_is_bounded_by_a_setting(bundled_model):
    with running_server(bundled_model, FrontendArgs(max_requests_per_call=8)) as s:
        url = s.url
        ok = httpx.post(url + "/v1/completions", timeout=TIMEOUT, json={
            "prompt": ["ROMEO:"] * 4, "n": 2, "max_tokens": 2, "temperature": 0.8, "seed": 1})
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 8
        err = is_openai_error(httpx.post(url + "/v1/completions", timeout=TIMEOUT, json={
            "prompt": ["ROMEO:"] * 3, "n": 3, "max_tokens": 2}), 400)
        assert err["param"] == "n" and "3 prompts x n=3 = 9" in err["message"] and "limit of 8" in err["message"]
        err = is_openai_error(httpx.post(url + "/v1/completions", timeout=TIMEOUT, json={
            "prompt": [[5, 6]] * 9, "max_tokens": 2}), 400)
        assert err["param"] == "prompt"
        err = is_openai_error(httpx.post(url + "/v1/chat/completions", timeout=TIMEOUT, json={
            "messages": [{"role": "user", "content": "hi"}], "n": 9, "max_tokens": 2}), 400)
        assert err["param"] == "n"
        assert s.engine.kv_cache_manager.num_free_blocks == s.engine.num_kv_blocks


def test_the_default_limit_refuses_a_batch_of_tens_of_thousands(server):
    before = len(server.engine.request_metrics)
    err = is_openai_error(httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={
        "prompt": ["ROMEO:"] * 200, "n": 128, "max_tokens": 1}), 400)
    assert "25600 requests" in err["message"] and "limit of 1024" in err["message"]
    assert len(server.engine.request_metrics) == before  # nothing was queued


def test_a_body_over_the_byte_limit_is_refused_before_it_is_parsed(bundled_model):
    with running_server(bundled_model, FrontendArgs(max_request_body_bytes=2000)) as s:
        body = json.dumps({"prompt": "x" * 1900, "max_tokens": 1}).encode()
        assert len(body) < 2000
        assert httpx.post(s.url + "/tokenize", content=json.dumps({"prompt": "ROMEO:"}), timeout=TIMEOUT,
                          headers={"content-type": "application/json"}).status_code == 200
        big = json.dumps({"prompt": "x" * 2100}).encode()
        err = is_openai_error(httpx.post(s.url + "/v1/completions", content=big, timeout=TIMEOUT,
                                         headers={"content-type": "application/json"}), 413)
        assert "2000 bytes" in err["message"] and "--max-request-body-bytes" in err["message"]

        def chunked():  # no Content-Length: counted as it arrives
            yield b'{"prompt": "'
            for _ in range(30):
                yield b"x" * 100
            yield b'"}'

        is_openai_error(httpx.post(s.url + "/v1/completions", content=chunked(), timeout=TIMEOUT,
                                   headers={"content-type": "application/json"}), 413)
        assert httpx.get(s.url + "/health", timeout=TIMEOUT).status_code == 200


def test_a_25_mb_prompt_is_refused_without_tokenizing_it(server):
    """The default limit (8 MiB): 20-30 MB prompts are a 413, answered long before a tokenizer could
    have read them (tokenizing 11.6 MB took 40-50 s here)."""
    start = time.monotonic()
    err = is_openai_error(httpx.post(server.url + "/v1/completions", timeout=TIMEOUT,
                                     json={"prompt": "ROMEO: " * (25 * 2**20 // 7), "max_tokens": 1}), 413)
    assert "8388608 bytes" in err["message"] and time.monotonic() - start < 30


def test_health_answers_while_a_huge_prompt_is_refused(server):
    """Tokenizing a 1 MB prompt took seconds on a CPU core; on the event loop it held every other client for all
    of it. It runs in the tokenizer thread, and is now refused after counting a bounded part of it
    (``tests/server/test_server_hardening.py`` counts the tokenizer's calls): /health answers meanwhile, each time
    under 2 s (generously for a loaded 2-core machine), and the prompt is refused as too long."""
    result = {}

    def huge_call():
        start = time.monotonic()
        r = httpx.post(server.url + "/v1/completions", timeout=300,
                       json={"prompt": "ROMEO: what light through yonder window. " * 25_000, "max_tokens": 1})
        result["call"] = (time.monotonic() - start, r)

    thread = threading.Thread(target=huge_call)
    thread.start()
    latencies = []
    while thread.is_alive():
        start = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=TIMEOUT).status_code == 200
        latencies.append(time.monotonic() - start)
        time.sleep(0.02)
    thread.join()
    duration, r = result["call"]
    assert is_openai_error(r, 400)["param"] == "prompt"
    assert max(latencies, default=0.0) < 2.0, (duration, latencies)


# ---- a client that leaves aborts every child of its call ----------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_aborts_every_child_of_a_batch_x_n_call(server, stream):
    engine = server.engine
    before = set(engine.request_metrics)
    body = {"prompt": SHAKESPEARE_OPENINGS[:4], "n": 3, "max_tokens": 400, "temperature": 0.9, "seed": 5,
            "ignore_eos": True, "stream": stream}
    if stream:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=TIMEOUT) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break  # leave after the first chunk
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(TIMEOUT, read=1.0))
    server.wait_idle()
    new = {rid: m for rid, m in engine.request_metrics.items() if rid not in before}
    assert len(new) == 12 and {m.finish_reason for m in new.values()} == {"abort"}, new
    assert all(m.num_output_tokens < 400 for m in new.values())
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


# ---- every 4xx in OpenAI's shape ----------------------------------------------------------------------------

RAW = {"content-type": "application/json"}
BAD_BODIES = [
    ("/v1/completions", b'{"prompt": ', 400, None, "not valid JSON"),
    ("/v1/completions", b'{"prompt": "\xff\xfe"}', 400, None, "not valid UTF-8"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xc3"}]}', 400, None, "UTF-8"),
    ("/v1/completions", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None, "too deeply"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
     400, None, "too deeply"),
    ("/v1/completions", b"[1, 2]", 400, None, "JSON object"),
    ("/v1/completions", b"", 400, None, "not valid JSON"),
    ("/v1/completions", b'{"prompt": [true, 5], "max_tokens": 2}', 400, "prompt", "prompt"),
    ("/v1/completions", b'{"prompt": "ROMEO:", "stop_token_ids": [true]}', 400, "stop_token_ids", "integer"),
    ("/detokenize", b'{"tokens": [false]}', 400, "tokens", "integer"),
    ("/v1/completions", b'{"prompt": "ROMEO:", "stop": ["ok", "\\ud800"]}', 400, "stop", "surrogate"),
    ("/v1/completions", b'{"prompt": "ROMEO:", "max_tokens": 1' + b"0" * 400 + b"}", 400, "max_tokens", "too large"),
    ("/v1/completions", b'{"prompt": "ROMEO:", "max_tokens": 600}', 400, "max_tokens", "600 > 512 - 2"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9999}',
     400, "max_tokens", "too large"),
    ("/v1/completions", b'{"prompt": "ROMEO:", "seed": 18446744073709551616}', 400, "seed", "2**64"),
    ("/v1/completions", b'{"prompt": "ROMEO:", "temperature": NaN}', 400, "temperature", "nan"),
    ("/v1/completions", b'{"prompt": "ROMEO:", "n": 1' + b"0" * 400 + b"}", 400, "n", "n must be"),
    ("/v1/nowhere", b"{}", 404, None, "Not Found"),
]


@pytest.mark.parametrize("path, body, status, param, words", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_every_4xx_is_openai_shaped(server, path, body, status, param, words):
    err = is_openai_error(httpx.post(server.url + path, content=body, headers=RAW, timeout=TIMEOUT), status)
    assert err["param"] == param and words in err["message"], err


def test_wrong_method_is_openai_shaped(server):
    err = is_openai_error(httpx.get(server.url + "/v1/completions", timeout=TIMEOUT), 405)
    assert err["type"] == "MethodNotAllowedError"
    # vLLM's boundary for an explicit max_tokens: 508 + 4 = max_model_len fits exactly, one more is a 400
    fits = {"prompt": [5] * 508, "max_tokens": 4}
    assert httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json=fits).status_code == 200
    err = is_openai_error(httpx.post(server.url + "/v1/completions", timeout=TIMEOUT,
                                     json={**fits, "max_tokens": 5}), 400)
    assert err["param"] == "max_tokens"


# ---- the property: random JSON in every field ---------------------------------------------------------------

SURROGATES = st.sampled_from(["\ud800", "a\udfffb"])
EDGE_INTS = st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64, 10**30, 10**400, -10**400])  # type boundaries, and beyond
SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.integers(-3, 40) | EDGE_INTS
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8) | SURROGATES)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=3), max_leaves=8)


def _fields(model) -> list[str]:
    return sorted(model.model_fields)


def _body(base: dict, model, draws: dict) -> bytes:
    body = dict(base)
    body.update(draws)
    if "max_tokens" not in draws:
        body["max_tokens"] = 4
    return json.dumps(body, allow_nan=True).encode()  # NaN / Infinity as Python's json writes them


STATUSES: dict[int, int] = {}  # status -> count over the random bodies (checked at the end: both kinds occur)


def _check_response(status: int, text: str, body: bytes) -> None:
    STATUSES[status] = STATUSES.get(status, 0) + 1
    assert status == 200 or 400 <= status < 500, (status, text[:300], body[:300])
    if status != 200:
        err = json.loads(text)["error"]
        assert err["code"] == status and err["message"], text[:300]
    elif text.startswith("data: "):  # a stream: no error chunk from the engine
        assert '"error"' not in text and text.rstrip().endswith("data: [DONE]"), text[-300:]


def _check(server, path: str, body: bytes) -> None:
    with httpx.stream("POST", server.url + path, content=body, headers=RAW, timeout=TIMEOUT) as r:
        text = r.read().decode()
    _check_response(r.status_code, text, body)


def _check_all(server, path: str, bodies: list[bytes]) -> None:
    """``_check`` for many bodies at once (the engine batches them)."""
    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as client:
            async def one(body):
                r = await client.post(path, content=body, headers=RAW)
                return r.status_code, r.text

            return await asyncio.gather(*(one(b) for b in bodies))

    for body, (status, text) in zip(bodies, asyncio.run(main())):
        _check_response(status, text, body)


@pytest.fixture(scope="module")
def small_server(bundled_model):
    with running_server(bundled_model, max_model_len=48, num_kv_blocks=96) as s:
        yield s


@given(draws=st.dictionaries(st.sampled_from(_fields(CompletionRequest)), JSON, max_size=4))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
def test_random_completion_bodies_get_200_or_a_4xx(small_server, draws):
    _check(small_server, "/v1/completions", _body({"prompt": "ROMEO:"}, CompletionRequest, draws))


@given(draws=st.dictionaries(st.sampled_from(_fields(ChatCompletionRequest)), JSON, max_size=4))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
def test_random_chat_bodies_get_200_or_a_4xx(small_server, draws):
    _check(small_server, "/v1/chat/completions",
           _body({"messages": [{"role": "user", "content": "Good morrow."}]}, ChatCompletionRequest, draws))


def _numeric_fields(model) -> list[str]:
    """The fields whose annotation holds int or float (alone, in a union, or in a list)."""
    return sorted(name for name, f in model.model_fields.items() if "int" in str(f.annotation)
                  or "float" in str(f.annotation))


NUMBER = st.one_of(EDGE_INTS, st.lists(EDGE_INTS, min_size=1, max_size=3),
                   st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 600))


EDGES = [0, -1, 2**31, 2**63, 2**64, 10**400, -10**400, 0.5, 1e308, math.inf, -math.inf, math.nan, True, None]


@pytest.mark.parametrize("path, model, base", [
    ("/v1/completions", CompletionRequest, {"prompt": "ROMEO:"}),
    ("/v1/chat/completions", ChatCompletionRequest, {"messages": [{"role": "user", "content": "Good morrow."}]})])
def test_every_numeric_field_at_every_boundary_gets_200_or_a_4xx(small_server, path, model, base):
    """The same property, swept rather than drawn (a random draw rarely hits one field's one bad value alone):
    every integer and float field (and list of them) at every type boundary and beyond (2**63, 2**64,
    10**400, NaN, inf, a bool), one field at a time."""
    bodies = [_body(base, model, {name: [value] if "list" in str(model.model_fields[name].annotation) else value})
              for name in _numeric_fields(model) for value in EDGES]
    _check_all(small_server, path, bodies)


@given(draws=st.dictionaries(st.sampled_from(_numeric_fields(CompletionRequest)), NUMBER, min_size=1, max_size=4))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
def test_edge_numbers_together_get_200_or_a_4xx(small_server, draws):
    """Several numeric fields at their boundaries at once."""
    _check(small_server, "/v1/completions", _body({"prompt": "ROMEO:"}, CompletionRequest, draws))


def test_no_block_leaked_after_the_random_bodies(small_server):
    if STATUSES:  # run after the property tests (alone, it checks only the idle server)
        assert STATUSES.get(200, 0) >= 10 and STATUSES.get(400, 0) >= 10, STATUSES
    small_server.wait_idle()
    assert small_server.engine.kv_cache_manager.num_free_blocks == small_server.engine.num_kv_blocks
    assert small_server.engine.num_bookkeeping_errors == 0

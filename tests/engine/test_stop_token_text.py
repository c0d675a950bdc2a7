"""A token that stops a request (a stop token id, or EOS) adds no text, as in vLLM, unless
``include_stop_str_in_output``: for final outputs, DELTA streams, n > 1 and the OpenAI server's SSE chunks."""

from __future__ import annotations

import dataclasses
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine import LLMEngine, SamplingParams
from minengine.engine.detokenizer import IncrementalDetokenizer, full_decode_text
from minengine.sampling_params import RequestOutputKind
from tests.prompts import TEXT

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def engine(bundled_model):
    return LLMEngine.from_config(model=bundled_model, max_model_len=256, num_kv_blocks=64)


def run(engine, prompt, params: SamplingParams):
    """(final output, the concatenated DELTA texts per index) of one request."""
    engine.add_request("final", prompt, params)
    engine.add_request("delta", prompt, dataclasses.replace(params, output_kind=RequestOutputKind.DELTA))
    deltas: dict[int, str] = {}
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == "delta":
                for c in out.outputs:
                    deltas[c.index] = deltas.get(c.index, "") + c.text
            elif out.finished:
                final = out
    return final, deltas


def greedy_ids(engine, prompt) -> list[int]:
    engine.add_request("ref", prompt, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
    while engine.has_unfinished_requests():
        outs = engine.step()
    return outs[0].outputs[0].token_ids


# any stretch of the bundled text (the model's own language, so outputs vary with it)
ANY_PROMPT = st.builds(lambda start, length: TEXT[start:start + length], st.integers(0, len(TEXT) - 120),
                       st.integers(1, 120))


@given(prompt=ANY_PROMPT, where=st.integers(0, MAX_TOKENS - 1), include=st.booleans(),
       n=st.sampled_from([1, 2]))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_stop_token_text_is_left_out_unless_included(engine, prompt, where, include, n):
    """For any prompt and any stop token greedy would produce: text == the decode of the tokens before the stop
    token (with it, when ``include_stop_str_in_output``), the concatenated DELTA stream == the final text, and
    the stop token is still in ``token_ids``."""
    ref = greedy_ids(engine, prompt)
    stop = ref[where]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=[stop], n=n,
                            include_stop_str_in_output=include)
    final, deltas = run(engine, prompt, params)
    prompt_ids = final.prompt_token_ids
    for c in final.outputs:
        assert c.token_ids == ref[:ref.index(stop) + 1] and c.token_ids[-1] == stop
        last_is_length = len(c.token_ids) == MAX_TOKENS  # length is checked before stop tokens (as vLLM)
        assert c.finish_reason == ("length" if last_is_length else "stop")
        kept = c.token_ids if include or last_is_length else c.token_ids[:-1]
        assert c.text == full_decode_text(engine.tokenizer, prompt_ids, kept)
        assert deltas[c.index] == c.text
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


def test_eos_text_is_left_out_even_when_special_tokens_are_kept(engine):
    """EOS ends a request with reason "stop" too: with ``skip_special_tokens=False`` its text ('<|endoftext|>')
    stays out unless ``include_stop_str_in_output`` (vLLM's detokenizer drops any stop-finished last token)."""
    tok = engine.tokenizer
    eos = engine.eos_token_id
    prompt_ids = tok("ROMEO:")["input_ids"]
    text = tok.decode([eos])
    assert text  # a visible special token, or the check below would prove nothing
    for include in (False, True):
        params = SamplingParams(skip_special_tokens=False, include_stop_str_in_output=include)
        req = type("R", (), {"prompt_token_ids": prompt_ids, "sampling_params": params})
        params.all_stop_token_ids = frozenset({eos})
        params.max_tokens = 16
        detok = IncrementalDetokenizer.for_request(tok, req)
        ids = tok(" O Romeo")["input_ids"] + [eos]
        for t in ids:
            detok = detok.advanced(t)
        want = full_decode_text(tok, prompt_ids, ids if include else ids[:-1], skip_special_tokens=False)
        assert detok.text(finished=True) == want and want.endswith(text) == include


def test_server_stream_and_final_text_leave_the_stop_token_out(bundled_model, engine):
    """The OpenAI server: the final text and the concatenated SSE chunks of each of n choices are the engine's
    text, without the stop token's."""
    from tests.server_helpers import running_server

    stop = greedy_ids(engine, "ROMEO:")[3]
    want, _ = run(engine, "ROMEO:", SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=[stop]))
    assert want.outputs[0].text == full_decode_text(engine.tokenizer, want.prompt_token_ids,
                                                    want.outputs[0].token_ids[:-1])
    with running_server(bundled_model) as server:
        body = {"model": server.engine.config.served_model_name, "prompt": "ROMEO:", "temperature": 0,
                "max_tokens": MAX_TOKENS, "stop_token_ids": [stop], "n": 2}
        final = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
        streamed = {0: "", 1: ""}
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for choice in json.loads(line[6:])["choices"]:
                        streamed[choice["index"]] += choice["text"]
        for choice in final["choices"]:
            assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
            assert choice["text"] == want.outputs[0].text == streamed[choice["index"]]
        server.wait_idle()

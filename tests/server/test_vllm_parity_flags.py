"""vLLM flags and names that serve once refused: ``--disable-log-requests`` (accepted), ``--max-logprobs`` (a real
limit: any ``logprobs`` / ``prompt_logprobs`` above it is a ValueError naming the field and the limit, a 400 from
the server, and nothing is queued or leaked), and ``quantization="experts_int8"`` (vLLM's name for the
per-output-channel int8 weights minengine calls "int8")."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine import LLM, EngineArgs, EngineConfig, LLMEngine, SamplingParams
from minengine.__main__ import _config, build_parser
from tests.server_helpers import running_server

SMALL = dict(max_model_len=128, num_kv_blocks=32)
CAPS = (0, 3, 20, -1)
TIMEOUT = 60


def _serve(argv: list[str]):
    return build_parser().parse_args(["serve", *argv])


def test_serve_accepts_disable_log_requests_and_max_logprobs(bundled_model):
    a = _serve([bundled_model, "--disable-log-requests", "--max-logprobs", "5"])
    a.model = a.model_tag
    assert a.disable_log_requests and _config(a).max_logprobs == 5
    assert not _serve([]).disable_log_requests and _config(_serve([])).max_logprobs == 20  # vLLM's default
    assert _config(_serve(["--max-logprobs", "-1"])).max_logprobs == -1  # no cap
    for bad in (-2, 1.5, True, "20"):
        with pytest.raises(ValueError, match="max_logprobs"):
            EngineConfig(max_logprobs=bad)


@pytest.fixture(scope="module")
def engines(bundled_model) -> dict[int, LLMEngine]:
    return {cap: LLMEngine.from_config(model=bundled_model, max_logprobs=cap, **SMALL) for cap in CAPS}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.sampled_from(CAPS), field=st.sampled_from(["logprobs", "prompt_logprobs"]), k=st.integers(0, 200))
def test_max_logprobs_limits_every_request(engines, cap, field, k):
    """Any count: accepted up to the cap (-1: the vocabulary size), refused above it with the field and the limit
    named, before anything is queued; the engine then serves the next request."""
    engine = engines[cap]
    vocab = engine.input_processor.vocab_size
    limit = vocab if cap == -1 else min(cap, vocab)
    free = engine.kv_cache_manager.num_free_blocks
    params = SamplingParams(temperature=0, max_tokens=2, **{field: k})
    if k <= limit:
        engine.add_request("ok", {"prompt_token_ids": [5, 6, 7]}, params)
        outputs = []
        while engine.has_unfinished_requests():
            outputs += engine.step()
        out = [o for o in outputs if o.finished][0]
        got = out.outputs[0].logprobs[0] if field == "logprobs" else out.prompt_logprobs[1]
        assert len(got) >= min(k, vocab)  # k alternatives (and the chosen token, if not among them)
    else:
        with pytest.raises(ValueError, match=rf"^{field}: requested .* logprobs of {k}, which is greater than max "
                                             rf"allowed: {limit} "):
            engine.add_request("refused", {"prompt_token_ids": [5, 6, 7]}, params)
        assert not engine.has_unfinished_requests()
    assert engine.kv_cache_manager.num_free_blocks == free


def test_the_server_page_quotes_the_refusal_the_engine_raises(engines):
    """docs/server.md quotes the refusal of ``logprobs=25`` under the default cap: the engine's own words."""
    import re
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text().split())
    quoted = re.search(r"`(logprobs: requested sample logprobs of (\d+)[^`]*)`", text)
    assert quoted, "the quoted refusal is gone from docs/server.md"
    assert EngineConfig().max_logprobs == 20 and "default 20 as in vLLM" in text
    params = SamplingParams(temperature=0, max_tokens=2, logprobs=int(quoted.group(2)))
    with pytest.raises(ValueError) as refusal:
        engines[20].add_request("quoted", {"prompt_token_ids": [5, 6, 7]}, params)
    assert str(refusal.value).startswith(quoted.group(1)), (str(refusal.value), quoted.group(1))


def test_offline_llm_refuses_more_logprobs_than_max_logprobs(bundled_model):
    llm = LLM(bundled_model, **SMALL)
    with pytest.raises(ValueError, match="logprobs of 21, which is greater than max allowed: 20"):
        llm.generate(["ROMEO:"], SamplingParams(max_tokens=2, logprobs=21), use_tqdm=False)
    (out,) = llm.generate(["ROMEO:"], SamplingParams(max_tokens=2, logprobs=20), use_tqdm=False)
    assert len(out.outputs[0].logprobs[0]) >= 20


def test_server_answers_400_naming_the_field_and_the_limit(bundled_model):
    with running_server(bundled_model, max_logprobs=4) as s:
        cases = [("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 2, "logprobs": 5}, "logprobs"),
                 ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                           "logprobs": True, "top_logprobs": 5}, "top_logprobs"),
                 ("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 2, "prompt_logprobs": 9},
                  "prompt_logprobs")]
        for route, body, field in cases:
            r = httpx.post(s.url + route, json=body, timeout=TIMEOUT)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == field and "greater than max allowed: 4" in error["message"], error
        s.wait_idle()
        assert s.engine.kv_cache_manager.num_free_blocks == s.engine.num_kv_blocks
        ok = httpx.post(s.url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 2, "logprobs": 4},
                        timeout=TIMEOUT)
        assert ok.status_code == 200 and len(ok.json()["choices"][0]["logprobs"]["top_logprobs"][0]) >= 4


def test_experts_int8_is_vllms_name_for_int8(bundled_model):
    assert EngineConfig(quantization="experts_int8").quantization == "int8"
    a = _serve(["--quantization", "experts_int8"])
    assert _config(a).quantization == "int8"
    assert EngineArgs(quantization="experts_int8").create_engine_config().quantization == "int8"
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    by_name = [LLM(bundled_model, quantization=q, **SMALL).generate(["ROMEO:"], params, use_tqdm=False)[0]
               .outputs[0].token_ids for q in ("int8", "experts_int8")]
    assert by_name[0] == by_name[1]
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    assert "experts_int8" in help_text
    with pytest.raises(ValueError, match="'experts_int8' is vLLM's name for minengine's 'int8'"):
        EngineConfig(quantization="fp8")

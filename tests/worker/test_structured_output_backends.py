"""Structured-output backends: JSON-schema keywords xgrammar would not enforce go to llguidance ("auto", as
vLLM), keywords neither enforces are refused by name (a 400 on the server), the engine-wide
``structured_outputs_config`` applies, and ``response_format`` merges with ``structured_outputs`` options (the
official openai client's ``.parse``)."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine import LLM, SamplingParams
from minengine.config import StructuredOutputsConfig
from minengine.sampling_params import StructuredOutputsParams
from minengine.worker.structured_output import StructuredOutputManager, xgrammar_unenforced_keywords
from tests.server_helpers import running_server

NAME = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}},
        "required": ["name"], "additionalProperties": False}
MULTIPLE = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 7, "minimum": 0, "maximum": 99}},
            "required": ["n"], "additionalProperties": False}
WORD = {"type": "object", "properties": {"w": {"type": "string", "pattern": "^[a-z ]+$", "minLength": 3,
                                               "maxLength": 6}}, "required": ["w"], "additionalProperties": False}
# keywords llguidance names in its "Unimplemented keys" error; xgrammar would ignore each of them
NEITHER = {"uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
           "not": {"not": {"type": "integer"}},
           "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
           "contains": {"type": "array", "contains": {"const": 5}},
           "propertyNames": {"type": "object", "propertyNames": {"pattern": "^a"}}}
CLOSING = {2: 4.0, 93: 4.0}  # '"' and '}': most outputs complete within max_tokens
SPACE, NEWLINE = 221, 199


@pytest.fixture(scope="module")
def llm(bundled_model):
    return LLM(bundled_model, max_model_len=256, num_kv_blocks=128)


def manager(llm, **config) -> StructuredOutputManager:
    e = llm.llm_engine
    return StructuredOutputManager(e.tokenizer, e.hf_config.vocab_size, e.eos_token_id,
                                   StructuredOutputsConfig(**config))


@pytest.mark.parametrize("schema", [NAME, MULTIPLE, WORD],
                         ids=["pattern+maxLength", "multipleOf", "pattern+min/maxLength"])
def test_keywords_xgrammar_ignores_are_enforced_through_llguidance(llm, schema):
    """Every output under a schema whose keywords xgrammar would drop validates (the ones cut by max_tokens
    are a prefix llguidance accepts), with free sampling that would otherwise break them."""
    so = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    params = [SamplingParams(temperature=1.0, max_tokens=24, seed=s, structured_outputs=so, logit_bias=CLOSING)
              for s in range(6)]
    outs = llm.generate(["ROMEO:"] * 6, params, use_tqdm=False)
    assert llm.llm_engine.structured_output_manager.backend_for(so) == "guidance"
    complete = 0
    for out in outs:
        c = out.outputs[0]
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.text), schema)
            complete += 1
        else:
            state = manager(llm).new_request(so)
            assert all(state.accept_token(t) for t in c.token_ids), c.text
    assert complete >= 3


def test_xgrammar_alone_would_not_have_enforced_them(llm):
    """The reason for the fallback: xgrammar's grammar for pattern + maxLength accepts a too-long string."""
    import xgrammar as xgr

    tok = llm.get_tokenizer()
    bad = '{"name": "abcdefgh"}'
    assert not jsonschema.Draft202012Validator(NAME).is_valid(json.loads(bad))
    ids = tok(bad, add_special_tokens=False)["input_ids"]
    matcher = xgr.GrammarMatcher(manager(llm).compile(StructuredOutputsParams(json=NAME)))
    assert all(matcher.accept_token(t) for t in ids)
    state = manager(llm).new_request(StructuredOutputsParams(json=NAME))
    assert not all(state.accept_token(t) for t in ids)


@given(keyword=st.sampled_from(sorted(NEITHER)), depth=st.integers(0, 3), wrap=st.sampled_from(
    ["properties", "items", "anyOf", "allOf"]))
@settings(max_examples=30, deadline=None)
def test_a_keyword_neither_backend_enforces_is_refused_by_name_at_any_depth(llm, keyword, depth, wrap):
    schema = NEITHER[keyword]
    for _ in range(depth):
        schema = {"properties": {"x": schema}} if wrap == "properties" else {"items": schema} if wrap == "items" \
            else {"anyOf": [{"type": "null"}, schema]} if wrap == "anyOf" else {"allOf": [schema]}
    assert keyword in xgrammar_unenforced_keywords(schema)
    m = manager(llm)
    with pytest.raises(ValueError, match=f"structured_outputs.json uses '{keyword}'.*neither"):
        m.new_request(StructuredOutputsParams(json=schema))


def test_keyword_names_are_not_keywords():
    """A property called "format" or "not" is a name, not a keyword; const / enum values are data."""
    schema = {"type": "object", "properties": {"format": {"type": "string"}, "not": {"const": {"uniqueItems": 1}}},
              "required": ["format", "not"], "enum": [{"contains": 1}]}
    assert xgrammar_unenforced_keywords(schema) == []
    assert xgrammar_unenforced_keywords({"type": "array", "uniqueItems": False}) == []


def test_configured_backends(llm):
    """backend "xgrammar" refuses what it would not enforce (naming it); "guidance" serves every kind but
    structural tags; the config's disable_any_whitespace applies to every request."""
    with pytest.raises(ValueError, match="'pattern with maxLength'.*xgrammar"):
        manager(llm, backend="xgrammar").new_request(StructuredOutputsParams(json=NAME))
    guidance = manager(llm, backend="guidance")
    tok = llm.get_tokenizer()
    for so, text in [(StructuredOutputsParams(regex="[0-9]{2}"), "42"),
                     (StructuredOutputsParams(choice=["aye", "nay"]), "nay"),
                     (StructuredOutputsParams(json_object=True), '{"a": 1}')]:
        state = guidance.new_request(so)
        assert type(state).__name__ == "GuidanceRequest"
        assert all(state.accept_token(t) for t in tok(text, add_special_tokens=False)["input_ids"]), so
        assert not state.accept_token(tok.convert_tokens_to_ids("Z")) or so.json_object
    with pytest.raises(ValueError, match="structural_tag"):
        guidance.new_request(StructuredOutputsParams(structural_tag='{"structures": [], "triggers": []}'))
    compact = manager(llm, disable_any_whitespace=True)
    for backend_schema in ({"type": "object"}, NAME):
        state = compact.new_request(StructuredOutputsParams(json=backend_schema))
        assert state.accept_token(91) and not state.accept_token(SPACE)  # '{' then no free whitespace
    with pytest.raises(ValueError, match="structured_outputs_config.backend"):
        StructuredOutputsConfig(backend="outlines")


def is_compact(text: str) -> bool:
    """JSON without free whitespace: xgrammar's compact form (``json.dumps``'s ", " and ": ") or llguidance's."""
    value = json.loads(text)
    return text in (json.dumps(value), json.dumps(value, separators=(",", ":")))


class Who(pydantic.BaseModel):
    who: Literal["ROMEO", "JULIET"]


def test_response_format_merges_with_structured_outputs_options_through_the_openai_client(bundled_model):
    """``response_format`` (the openai SDK's ``.parse``) with ``structured_outputs: {disable_any_whitespace:
    true}``: compact JSON, where a bias towards whitespace fills the output with it otherwise; a second
    constraint in structured_outputs is a 400; a keyword neither backend enforces is a 400 naming it; the
    server-wide --structured-outputs-config works too."""
    chat = [{"role": "user", "content": "Who?"}]
    bias = {str(SPACE): 6, str(NEWLINE): 6, "2": 3, "26": 3, "93": 3}
    with running_server(bundled_model) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        model = server.engine.config.served_model_name

        def ask(extra: dict, seed: int):
            return client.chat.completions.parse(model=model, messages=chat, response_format=Who, max_tokens=80,
                                                 temperature=1.0, seed=seed, logit_bias=bias, extra_body=extra)
        loose = [client.chat.completions.create(
            model=model, messages=chat, max_tokens=80, temperature=1.0, seed=s, logit_bias=bias, response_format={
                "type": "json_schema", "json_schema": {"name": "who", "schema": Who.model_json_schema()}})
            for s in range(3)]
        # the test can tell the two apart: without the option the bias fills the output with free whitespace
        assert all(any(ch.isspace() for ch in r.choices[0].message.content) for r in loose)
        for seed in range(3):
            r = ask({"structured_outputs": {"disable_any_whitespace": True}}, seed)
            assert r.choices[0].finish_reason == "stop" and is_compact(r.choices[0].message.content)
            assert r.choices[0].message.parsed.who in ("ROMEO", "JULIET")
        with pytest.raises(openai.BadRequestError) as info:
            ask({"structured_outputs": {"regex": "a+"}}, 0)
        assert info.value.body["param"] == "response_format"
        for keyword, schema in NEITHER.items():
            with pytest.raises(openai.BadRequestError) as info:
                client.chat.completions.create(model=model, messages=chat, max_tokens=4, response_format={
                    "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
            assert info.value.body["param"] == "response_format" and repr(keyword) in info.value.body["message"]
        server.wait_idle()
        assert server.engine.kv_cache_manager.num_free_blocks == server.engine.num_kv_blocks
    with running_server(bundled_model, structured_outputs_config={"disable_any_whitespace": True}) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        for seed in range(2):
            r = client.chat.completions.parse(model=model, messages=chat, response_format=Who, max_tokens=80,
                                              temperature=1.0, seed=seed, logit_bias=bias)
            assert is_compact(r.choices[0].message.content)


def test_the_doc_lists_every_keyword_xgrammar_does_not_enforce():
    from pathlib import Path

    from minengine.worker.structured_output import XGRAMMAR_UNENFORCED

    text = (Path(__file__).resolve().parents[2] / "docs" / "features" / "structured_outputs.md").read_text()
    assert all(f"`{k}`" in text for k in XGRAMMAR_UNENFORCED if k not in ("if", "then", "else")), text
    assert "`if`/`then`/`else`" in text and "`minLength`" in text and "`maxLength`" in text


def test_the_command_line_flags_reach_the_engine_config():
    """``--structured-outputs-config`` (vLLM's JSON) and ``--max-history-bytes``; bad values name the field."""
    import argparse

    from minengine import EngineArgs
    from minengine.exceptions import VLLMValidationError

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--structured-outputs-config", '{"backend": "guidance", "disable_any_whitespace": true}',
                              "--max-history-bytes", "123456"])
    config = EngineArgs.from_cli_args(args).create_engine_config()
    assert config.structured_outputs_config == StructuredOutputsConfig(backend="guidance", disable_any_whitespace=True)
    assert config.max_history_bytes == 123456
    for bad, field in [('{"backend": "outlines"}', "structured_outputs_config.backend"),
                       ('{"backend": "auto", "typo": 1}', "structured_outputs_config"),
                       ('{"disable_any_whitespace": "yes"}', "structured_outputs_config.disable_any_whitespace")]:
        args = parser.parse_args(["--structured-outputs-config", bad])
        with pytest.raises(VLLMValidationError) as info:
            EngineArgs.from_cli_args(args).create_engine_config()
        assert info.value.parameter == field
    with pytest.raises(VLLMValidationError, match="max_history_bytes"):
        EngineArgs.from_cli_args(parser.parse_args(["--max-history-bytes", "0"])).create_engine_config()


def test_llguidance_states_under_speculative_decoding_match_plain_greedy(bundled_model, llm):
    """The sampler advances a grammar state through accepted proposals and rolls it back: with llguidance as with
    xgrammar, constrained greedy output is the same with and without speculation."""
    spec = LLM(bundled_model, max_model_len=256, num_kv_blocks=128, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    prompt = 'ROMEO: {"w":"abc"} {"w":"ab c"} {"w":"'
    for schema in (WORD, NAME):
        params = SamplingParams(temperature=0, max_tokens=24, logit_bias=CLOSING,
                                structured_outputs=StructuredOutputsParams(json=schema, disable_any_whitespace=True))
        (a,), (b,) = spec.generate(prompt, params, use_tqdm=False), llm.generate(prompt, params, use_tqdm=False)
        assert (a.outputs[0].token_ids, a.outputs[0].text) == (b.outputs[0].token_ids, b.outputs[0].text)
        if a.outputs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(a.outputs[0].text), schema)
    assert spec.llm_engine.structured_output_manager.backend_for(StructuredOutputsParams(json=WORD)) == "guidance"

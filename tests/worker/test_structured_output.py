"""Structured outputs and logits processing: every constrained output is valid (jsonschema on random schemas,
in batches that mix constrained and unconstrained requests, n > 1, chunked prefill and speculative decoding),
the grammar state moves only with committed tokens, and bad constraints are a ValueError naming the field.

The bundled model writes gibberish, so a constrained output may reach max_tokens before it is complete: an
output that finished by grammar completion ("stop") must parse and validate; one cut by "length" must be a
prefix the grammar accepts token by token (replayed through a fresh grammar state). A logit bias towards
closing tokens makes most of them complete.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine import LLM, SamplingParams
from minengine.core.scheduler_output import ScheduledRequest
from minengine.engine.bad_words import bad_words_token_ids
from minengine.sampling_params import StructuredOutputsParams
from minengine.worker.sampler import Sampler
from minengine.worker.structured_output import StructuredOutputManager

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
LONG_PROMPT = ("ROMEO: {\"name\": \"Romeo\", \"age\": 16, \"tags\": [\"a\"]}\nJULIET: O Romeo, Romeo! wherefore art "
               "thou Romeo? Deny thy father and refuse thy name; or, if thou wilt not, be but sworn my love, and "
               "I'll no longer be a Capulet.\nROMEO:")


@pytest.fixture(scope="module")
def llm(bundled_model):
    """Speculative decoding on and a 48-token budget (the long prompt is prefilled in chunks)."""
    return LLM(bundled_model, num_kv_blocks=512, max_num_batched_tokens=48, speculative_config=SPEC)


@pytest.fixture(scope="module")
def closing_bias(llm):
    tok = llm.get_tokenizer()
    return {tok.convert_tokens_to_ids(c): 4.0 for c in ['"', "}", "]", ","]}


def manager_of(llm) -> StructuredOutputManager:
    """A grammar compiler for ``llm``'s tokenizer, separate from the engine's own."""
    e = llm.llm_engine
    return StructuredOutputManager(e.tokenizer, e.hf_config.vocab_size, e.eos_token_id)


def replay_ok(llm, so: StructuredOutputsParams, token_ids: list[int]) -> bool:
    """Whether a fresh grammar state accepts every token of an output, in order."""
    state = manager_of(llm).new_request(so)
    return all(state.accept_token(t) for t in token_ids)


def check_json_output(llm, so, schema, completion) -> bool:
    """The validity rule of this file; returns whether the output was complete."""
    assert replay_ok(llm, so, completion.token_ids), completion.text
    if completion.finish_reason == "stop":
        jsonschema.Draft202012Validator(schema).validate(json.loads(completion.text))
        return True
    assert completion.finish_reason == "length"
    return False


# ---- random schemas ----------------------------------------------------------------------------------------
_leaf = st.one_of(
    st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}),
    st.tuples(st.integers(-50, 50), st.integers(0, 300)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}),
    st.just({"type": "boolean"}), st.just({"type": "null"}), st.just({"type": "number"}),
    st.lists(st.sampled_from(["a", "bb", 1, 2.5, True, None]), min_size=1, max_size=3, unique_by=repr).map(
        lambda v: {"enum": v}),
)


def _object(children):
    names = st.lists(st.sampled_from(["id", "name", "age", "x", "tags"]), min_size=1, max_size=3, unique=True)
    return names.flatmap(lambda ks: st.tuples(st.lists(children, min_size=len(ks), max_size=len(ks)),
                                              st.lists(st.sampled_from(ks), unique=True), st.booleans()).map(
        lambda t: {"type": "object", "properties": dict(zip(ks, t[0])), "required": t[1],
                   **({"additionalProperties": False} if t[2] else {})}))


schemas = st.recursive(_leaf, lambda c: st.one_of(
    st.tuples(c, st.integers(0, 3)).map(lambda t: {"type": "array", "items": t[0], "maxItems": t[1]}),
    _object(c)), max_leaves=5)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, compact=st.booleans(), seed=st.integers(0, 2**16))
def test_random_schemas_give_valid_json_in_mixed_batches(llm, closing_bias, schema, compact, seed):
    so = StructuredOutputsParams(json=schema, disable_any_whitespace=compact)
    params = [SamplingParams(temperature=0, max_tokens=48, structured_outputs=so, logit_bias=closing_bias),
              SamplingParams(temperature=0.9, seed=seed, n=2, max_tokens=48, structured_outputs=so,
                             logit_bias=closing_bias),
              SamplingParams(temperature=1.0, max_tokens=32, structured_outputs=so),
              SamplingParams(temperature=0, max_tokens=24)]
    prompts = [LONG_PROMPT, "JULIET:", LONG_PROMPT, LONG_PROMPT]
    outs = llm.generate(prompts, params, use_tqdm=False)
    for out in outs[:3]:
        for c in out.outputs:
            check_json_output(llm, so, schema, c)
    alone = llm.generate([LONG_PROMPT], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    assert outs[3].outputs[0].token_ids == alone[0].outputs[0].token_ids  # no mask leaks into other rows
    assert llm.llm_engine.kv_cache_manager.num_used_blocks == 0


def test_most_biased_outputs_complete_and_validate(llm, closing_bias):
    """The validity check above is not vacuous: with the bias, complete outputs are the rule."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"]}
    so = StructuredOutputsParams(json=schema, disable_any_whitespace=True)  # free whitespace can run on forever
    outs = llm.generate(["ROMEO:"] * 4, [SamplingParams(temperature=0.8, seed=i, max_tokens=64, structured_outputs=so,
                                                        logit_bias=closing_bias) for i in range(4)], use_tqdm=False)
    complete = [check_json_output(llm, so, schema, o.outputs[0]) for o in outs]
    assert sum(complete) >= 3
    assert all(o.outputs[0].token_ids[-1] == 0 for o, done in zip(outs, complete) if done)  # ends at EOS


@pytest.mark.parametrize("so, check", [
    (StructuredOutputsParams(regex=r"[A-Z][a-z]{1,4}( [a-z]{1,3}){0,2}\."), lambda t: re.fullmatch(
        r"[A-Z][a-z]{1,4}( [a-z]{1,3}){0,2}\.", t)),
    (StructuredOutputsParams(choice=["yes", "no", "maybe so"]), lambda t: t in ("yes", "no", "maybe so")),
    (StructuredOutputsParams(grammar='root ::= "ROMEO" | "JULIET" ("!" | "?")'),
     lambda t: t in ("ROMEO", "JULIET!", "JULIET?")),
    (StructuredOutputsParams(json_object=True), lambda t: isinstance(json.loads(t), (dict, list))),
    (StructuredOutputsParams(structural_tag=json.dumps({"structures": [{"begin": "<x>", "schema": {
        "type": "integer", "minimum": 0, "maximum": 9}, "end": "</x>"}], "triggers": ["<x>"]})),
     lambda t: "<x>" not in t or re.search(r"<x>\d</x>", t)),
])
def test_every_constraint_kind_completes_validly(llm, closing_bias, so, check):
    outs = llm.generate(["ROMEO:"] * 3, [SamplingParams(temperature=t, seed=3, max_tokens=40, structured_outputs=so,
                                                        logit_bias=closing_bias if so.json_object else None)
                                         for t in (0, 0.7, 1.2)], use_tqdm=False)
    for out in outs:
        c = out.outputs[0]
        assert replay_ok(llm, so, c.token_ids)
        if c.finish_reason == "stop":
            assert check(c.text), c.text
    if not so.structural_tag:  # a structural tag lets free text run on
        assert any(o.outputs[0].finish_reason == "stop" for o in outs)


def test_grammar_completion_stops_the_request_even_with_ignore_eos(llm):
    so = StructuredOutputsParams(choice=["yes", "no"])
    out = llm.generate("ROMEO:", SamplingParams(temperature=0, ignore_eos=True, max_tokens=30,
                                                structured_outputs=so), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.text in ("yes", "no")


# ---- speculative decoding ----------------------------------------------------------------------------------
def _scheduled(tok_ids, spec, so, params=None) -> ScheduledRequest:
    return ScheduledRequest(request_id="r", token_ids=[tok_ids[0]] + list(spec), start_pos=5, block_ids=[0],
                            sample=True, is_prefill=False, sampling_params=params or SamplingParams(temperature=0),
                            output_index=0, prompt_token_ids=[1, 2, 3, 4, 5], output_token_ids=[],
                            spec_token_ids=list(spec), structured_output=so)


def test_sampler_never_accepts_a_proposal_the_grammar_rejects(llm):
    """Row i is masked by the state after the first i proposals: the model's favourite 'z' at row 1 is
    outside the regex, so proposal 'z' is rejected and the row's best allowed token replaces it; the grammar
    state is rolled back afterwards (only update_from_output commits)."""
    tok = llm.get_tokenizer()
    a, b, c, z = (tok.convert_tokens_to_ids(ch) for ch in "abcz")
    so_params = StructuredOutputsParams(regex="[a-c]+")
    state = manager_of(llm).new_request(so_params)
    logits = torch.zeros(4, llm.llm_engine.hf_config.vocab_size)
    for row, (best, second) in enumerate([(a, b), (z, c), (b, a), (c, a)]):
        logits[row, best], logits[row, second] = 10.0, 5.0
    tokens = Sampler()(logits.clone(), [_scheduled([a], [a, z, b], state)])  # masks rows in place
    assert tokens == [[a, c]]
    assert state.num_accepted == 0 and state.accept_token(a)  # rolled back to the start, still usable
    # unconstrained, the same logits accept every proposal and add c (so the mask made the difference)
    assert Sampler()(logits, [_scheduled([a], [a, z, b], None)]) == [[a, z, b, c]]


def test_accepted_run_ends_where_the_grammar_completes(llm):
    tok = llm.get_tokenizer()
    a, b, x = (tok.convert_tokens_to_ids(ch) for ch in "abx")
    eos = 0
    state = manager_of(llm).new_request(StructuredOutputsParams(regex="ab"))
    logits = torch.zeros(5, llm.llm_engine.hf_config.vocab_size)
    for row, best in enumerate([a, b, eos, x, x]):
        logits[row, best] = 10.0
    assert Sampler()(logits, [_scheduled([a], [a, b, eos, x], state)]) == [[a, b, eos]]
    assert state.num_accepted == 0


def test_constrained_greedy_is_identical_with_and_without_speculation(bundled_model, llm):
    so = StructuredOutputsParams(regex=r"(ROMEO|JULIET|[a-z ,]){1,40}")
    prompt = "ROMEO, JULIET, ROMEO, JULIET, ROMEO, JULIET, ROMEO,"
    params = SamplingParams(temperature=0, max_tokens=30, structured_outputs=so)
    plain = LLM(bundled_model, num_kv_blocks=256)
    want = plain.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    engine = llm.llm_engine
    before = len(engine.traces)
    got = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert got == want
    chunks = [c for tr in engine.traces[before:] for c in tr.chunks]
    assert sum(c.num_spec_tokens for c in chunks) > 0  # proposals were verified under the grammar


# ---- the state lives with the outputs: preemption and rollback ---------------------------------------------
def test_recompute_preemption_and_failed_steps_keep_the_grammar_state_with_the_outputs(bundled_model, monkeypatch):
    so = StructuredOutputsParams(json={"type": "array", "items": {"type": "string", "maxLength": 4}})
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs=so)
    prompts = [LONG_PROMPT, "JULIET:", "ROMEO:", LONG_PROMPT[:80]]
    want = [o.outputs[0].token_ids for o in LLM(bundled_model, num_kv_blocks=256).generate(prompts, params,
                                                                                            use_tqdm=False)]
    tight = LLM(bundled_model, num_kv_blocks=24, block_size=8, max_num_batched_tokens=32)
    engine = tight.llm_engine
    sampler, calls = engine.runner.sampler, [0]

    class FailingEvery5th:
        def __call__(self, logits, requests):
            calls[0] += 1
            out = sampler(logits, requests)
            if calls[0] % 5 == 0:
                raise RuntimeError("injected failure after sampling")
            return out

        def __getattr__(self, name):
            return getattr(sampler, name)

    monkeypatch.setattr(engine.runner, "sampler", FailingEvery5th())
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    done, failures = {}, 0
    while engine.has_unfinished_requests():
        try:
            outs = engine.step()
        except RuntimeError:
            failures += 1
            for r in engine.scheduler.requests.values():  # the state is exactly the committed outputs
                assert r.structured_output is None or r.structured_output.num_accepted == r.num_output_tokens
            continue
        done.update({o.request_id: o.outputs[0].token_ids for o in outs if o.finished})
    assert failures > 0 and engine.scheduler.num_preemptions > 0
    assert [done[str(i)] for i in range(len(prompts))] == want
    assert engine.kv_cache_manager.num_used_blocks == 0


# ---- logit_bias, allowed_token_ids, bad_words ----------------------------------------------------------------
def test_allowed_token_ids_logit_bias_and_bad_words(llm):
    tok = llm.get_tokenizer()
    allowed = [tok.convert_tokens_to_ids(c) for c in "abc"] + [221]
    outs = llm.generate(["ROMEO:"] * 4, [
        SamplingParams(temperature=1.0, seed=1, max_tokens=20, allowed_token_ids=allowed),
        SamplingParams(temperature=0, max_tokens=5, logit_bias={str(allowed[1]): 100}),
        SamplingParams(temperature=0, max_tokens=40, bad_words=["thee", "the"]),
        SamplingParams(temperature=0, max_tokens=40)], use_tqdm=False)
    assert set(outs[0].outputs[0].token_ids) <= set(allowed)
    assert outs[1].outputs[0].token_ids == [allowed[1]] * 5
    plain, banned = outs[3].outputs[0], outs[2].outputs[0]
    assert "the" in plain.text.lower()  # the ban below is not vacuous
    words = bad_words_token_ids(llm.get_tokenizer(), ["thee", "the"], llm.llm_engine.input_processor.vocab_size)
    ids = banned.token_ids
    assert not any(tuple(ids[i:i + len(w)]) == w for w in words for i in range(len(ids)))


# ---- bad input ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    ({"structured_outputs": StructuredOutputsParams(json={"type": "object", "properties": 5})},
     "structured_outputs.json"),
    ({"structured_outputs": StructuredOutputsParams(json='{"type": "strin')}, "structured_outputs.json"),
    ({"structured_outputs": StructuredOutputsParams(regex="(?=a)b")}, "structured_outputs.regex"),
    ({"structured_outputs": StructuredOutputsParams(regex="[a-")}, "structured_outputs.regex"),
    ({"structured_outputs": StructuredOutputsParams(regex="a\x00b")}, "structured_outputs.regex"),
    ({"structured_outputs": StructuredOutputsParams(grammar="foo ::= 'a'")}, "structured_outputs.grammar"),
    ({"structured_outputs": StructuredOutputsParams(json={}, whitespace_pattern=" ")},
     "structured_outputs.whitespace_pattern"),
    ({"logit_bias": {5000: 1.0}}, "logit_bias"),
    ({"allowed_token_ids": [1, 99999]}, "allowed_token_ids"),
])
def test_bad_constraints_are_a_value_error_naming_the_field_and_the_engine_goes_on(llm, kwargs, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        llm.generate("ROMEO:", SamplingParams(max_tokens=4, **kwargs), use_tqdm=False)
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests() and engine.kv_cache_manager.num_used_blocks == 0
    assert llm.generate("ROMEO:", SamplingParams(max_tokens=3), use_tqdm=False)[0].finished


@pytest.mark.parametrize("kwargs, field", [
    ({"json": {}, "regex": "a"}, "structured_outputs"), ({}, "structured_outputs"),
    ({"choice": []}, "structured_outputs.choice"), ({"json_object": False}, "structured_outputs.json_object"),
    ({"grammar": "  "}, "structured_outputs.grammar"),
])
def test_structured_outputs_params_validate_their_fields(kwargs, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        StructuredOutputsParams(**kwargs)


def test_sampling_params_validate_logits_processing_fields():
    for kwargs, field in [({"logit_bias": {"x": 1}}, "logit_bias"), ({"logit_bias": {1: float("nan")}}, "logit_bias"),
                          ({"allowed_token_ids": []}, "allowed_token_ids"), ({"bad_words": [""]}, "bad_words"),
                          ({"structured_outputs": {"jsn": {}}}, "structured_outputs")]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs)
    assert SamplingParams(logit_bias={"7": 500}).logit_bias == {7: 100.0}  # vLLM's clamp
    assert SamplingParams(structured_outputs={"regex": "a+"}).structured_outputs.regex == "a+"


def test_a_model_without_tokenizer_refuses_structured_outputs(random_llama):
    llm = LLM(random_llama, num_kv_blocks=64)
    with pytest.raises(ValueError, match="structured_outputs needs a tokenizer"):
        llm.generate({"prompt_token_ids": [3, 4]}, SamplingParams(structured_outputs=StructuredOutputsParams(
            regex="a")), use_tqdm=False)
    with pytest.raises(ValueError, match="bad_words"):
        llm.generate({"prompt_token_ids": [3, 4]}, SamplingParams(bad_words=["a"]), use_tqdm=False)


# ---- a tokenizer of a random config ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def random_model_with_tokenizer(tmp_path_factory):
    """A random-weight Llama (vocab 512) with a byte-level BPE tokenizer of 300 tokens trained here: the
    logits are wider than the vocabulary, as for many real checkpoints."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    from tests.conftest import _save_random_model
    from tests.prompts import TEXT

    out = tmp_path_factory.mktemp("llama_tok")
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    _save_random_model(cfg, out, seed=3)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(out)
    return str(out)


def test_random_config_tokenizer_with_padded_vocabulary(random_model_with_tokenizer):
    llm = LLM(random_model_with_tokenizer, num_kv_blocks=128)
    size = len(llm.get_tokenizer())
    assert size < llm.llm_engine.hf_config.vocab_size
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "y"]}},
              "required": ["a", "b"], "additionalProperties": False}
    so = StructuredOutputsParams(json=schema)
    outs = llm.generate(["ROMEO:"] * 3, [SamplingParams(temperature=t, seed=5, max_tokens=40, structured_outputs=so)
                                         for t in (0, 0.8, 1.5)], use_tqdm=False)
    for out in outs:
        c = out.outputs[0]
        assert max(c.token_ids) < size  # the padding ids past the tokenizer are never allowed
        check_json_output(llm, so, schema, c)


# ---- the persistent batch of custom logits processors -------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.lists(st.integers(0, 9), unique=True, max_size=6), min_size=1, max_size=12))
def test_batch_updates_keep_a_processors_index_map_exact(steps):
    """A processor that tracks {batch index: request id} through process_dict_updates always agrees with the
    slots the rows are put in, and the batch stays dense."""
    from minengine.v1.sample.logits_processor import LogitsProcessor, process_dict_updates
    from minengine.worker.logits_processors import CustomLogitsProcessors

    class Tracker(LogitsProcessor):
        def __init__(self, vllm_config, device, is_pin_memory):
            self.ids: dict[int, str] = {}

        def is_argmax_invariant(self):
            return False

        def update_state(self, batch_update):
            process_dict_updates(self.ids, batch_update, lambda params, _, __: params.extra_args["rid"])

        def apply(self, logits):
            assert set(self.ids) == set(range(logits.shape[0]))
            for i, rid in self.ids.items():  # row i must be the row of request rid
                assert logits[i, 0].item() == float(rid)
            return logits

    lps = CustomLogitsProcessors([Tracker], None, torch.device("cpu"))
    for ids in steps:
        requests = [ScheduledRequest(request_id=str(i), token_ids=[1], start_pos=0, block_ids=[], sample=True,
                                     is_prefill=False, sampling_params=SamplingParams(extra_args={"rid": str(i)}),
                                     output_index=0) for i in ids]
        logits = torch.tensor([[float(i), 0.0] for i in ids]).reshape(len(ids), 2)
        out = lps.apply(logits.clone(), requests)
        assert torch.equal(out, logits)
        assert sorted(lps.slots.values()) == list(range(len(ids)))


def test_logits_processors_reject_speculative_decoding_and_bad_classes(bundled_model):
    from minengine.config import EngineConfig

    with pytest.raises(ValueError, match="speculative"):
        EngineConfig(logits_processors=["x:Y"], speculative_config=SPEC)
    with pytest.raises(ValueError, match=r"logits_processors\[0\]"):
        LLM(bundled_model, num_kv_blocks=32, logits_processors=[int])
    with pytest.raises(ValueError, match=r"logits_processors\[0\]"):
        LLM(bundled_model, num_kv_blocks=32, logits_processors=["no_such_module:Thing"])


def test_mask_profile_counts_the_allowed_share(llm):
    from minengine.viz.structured_figures import mask_figure
    from minengine.worker.structured_output import mask_profile

    so = StructuredOutputsParams(choice=["yes", "no"])
    out = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=8, structured_outputs=so),
                       use_tqdm=False)[0].outputs[0]
    prof = mask_profile(manager_of(llm), so, out.token_ids, repeats=3)
    tok = llm.get_tokenizer()
    starts = {t for t in range(len(tok)) if any(w.startswith(tok.decode([t])) for w in ("yes", "no"))
              and tok.decode([t])}
    assert prof.steps[0].num_allowed == len(starts)  # the tokens that begin "yes" or "no"
    assert all(0 < s.num_allowed <= s.vocab_size and s.fill_seconds > 0 for s in prof.steps)
    assert prof.steps[-1].num_allowed == 1  # the complete choice leaves only EOS
    fig = mask_figure(prof)
    assert len(fig.data) == 2


# ---- the OpenAI server: response_format and structured_outputs ----------------------------------------------
def test_server_response_format_and_structured_outputs(bundled_model):
    import httpx

    from tests.server_helpers import running_server

    schema = {"type": "object", "properties": {"who": {"enum": ["ROMEO", "JULIET"]}}, "required": ["who"],
              "additionalProperties": False}
    chat = [{"role": "user", "content": "Who?"}]
    with running_server(bundled_model) as server:
        def post(path, body):
            return httpx.post(server.url + path, json=body, timeout=60.0)

        r = post("/v1/chat/completions", {"messages": chat, "temperature": 0, "max_tokens": 60, "response_format": {
            "type": "json_schema", "json_schema": {"name": "who", "schema": schema}},
            "logit_bias": {"2": 100, "26": 100, "93": 100}})  # '"', ':', '}' over free whitespace
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        r = post("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 10, "temperature": 0.8, "n": 2,
                                     "structured_outputs": {"choice": ["aye", "nay"]}})
        assert r.status_code == 200, r.text
        assert {c["text"] for c in r.json()["choices"]} <= {"aye", "nay"}
        r = post("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 10, "temperature": 0,
                                     "response_format": {"type": "json_object"}, "logit_bias": {"93": 5}})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "length" or isinstance(json.loads(choice["text"]), (dict, list))
        for body, field in [
            ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "response_format"),
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "required": "who"}}}}, "response_format"),
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
            ({"response_format": {"type": "yaml"}}, "response_format"),
            ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs.regex"),
            ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs"),
            ({"logit_bias": {"99999": 1}}, "logit_bias"),
            ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
        ]:
            r = post("/v1/chat/completions", {"messages": chat, "max_tokens": 4, **body})
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["param"] == field, (body, r.json())
        server.wait_idle()
        assert server.engine.kv_cache_manager.num_free_blocks == server.engine.num_kv_blocks

"""Edge cases found by adversarial QA (2026-12-01), each once a real defect: valid but extreme sampling
settings, ``min_tokens`` with stop strings, text that is not valid Unicode on every text route."""

from __future__ import annotations

import itertools

import pytest
import torch

from minengine import SamplingParams
from minengine.worker.logits_processing import process_logits
from tests.conftest import drain

EXTREME = [dict(repetition_penalty=r) for r in (1e-300, 1e-45, 1e-30, 1e30, 1e300)] + [
    dict(temperature=t) for t in (1e-5, 2e-5, 1e300)] + [
    dict(repetition_penalty=1e-300, temperature=1e-5, min_tokens=3),
    dict(repetition_penalty=1e300, temperature=1e-5, top_k=2, top_p=0.5, min_p=0.9)]


# the settings of this module's ``engine`` fixture (tests/conftest.py)
ENGINE_CONFIG = dict(max_model_len=256, num_kv_blocks=64, max_num_batched_tokens=32)


@pytest.mark.parametrize("kw", EXTREME, ids=str)
@pytest.mark.parametrize("greedy", [False, True])
def test_extreme_valid_params_give_a_distribution(kw, greedy):
    """Every setting ``SamplingParams`` accepts leaves a finite, normalised distribution (float32 overflow of a
    logit divided by a tiny penalty or temperature made +inf, and softmax of +inf is NaN), whatever the logits:
    large ones, all negative, every token seen; ``min_tokens``' masked stop tokens stay impossible."""
    gen = torch.Generator().manual_seed(0)
    vocab = 64
    p = SamplingParams(**({"temperature": 0} if greedy else {}) | kw)
    p.all_stop_token_ids = frozenset({0, 1})
    for scale, shift, seen in itertools.product((1.0, 80.0), (0.0, -200.0), (8, vocab)):
        logits = torch.randn(vocab, generator=gen) * scale + shift
        x = process_logits(logits, p, list(range(seen)), [])
        probs = x.softmax(-1)
        assert not torch.isnan(x).any() and torch.isfinite(probs).all(), (kw, scale, shift, seen)
        assert abs(float(probs.sum()) - 1) < 1e-4
        if p.min_tokens:
            assert float(probs[[0, 1]].sum()) == 0.0
        torch.multinomial(probs, 1)  # what the sampler draws with


def test_extreme_params_in_a_batch_do_not_fail_the_others(engine):
    """A request with extreme settings runs beside a greedy one: no step raises (on the server a failed step
    fails every running request), the greedy one's tokens are those it gets alone, and every block is free."""
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine.add_request("alone", "ROMEO:", greedy)
    want = drain(engine)["alone"].outputs[0].token_ids
    engine.add_request("g", "ROMEO:", greedy)
    for i, kw in enumerate(EXTREME):
        engine.add_request(f"x{i}", "JULIET:\nO Romeo", SamplingParams(max_tokens=6, seed=i, **kw))
    outs = drain(engine)
    assert outs["g"].outputs[0].token_ids == want
    assert all(len(outs[f"x{i}"].outputs[0].token_ids) >= 1 for i in range(len(EXTREME)))
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


@pytest.mark.parametrize("stop", [["e"], ["\n"], ["the", "I"], [", "], ["o", "ll"]])
@pytest.mark.parametrize("min_tokens", [0, 1, 4, 9])
def test_min_tokens_holds_for_stop_strings(engine, stop, min_tokens):
    """As vLLM (PR #22014): no stop string ends a request within its first ``min_tokens`` tokens; the text is
    the unstopped text cut right before the first stop string that ends after those tokens' text."""
    prompt = "ROMEO:\nO, she doth teach the torches to burn bright!"
    free = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine.add_request("free", prompt, free)
    full = drain(engine)["free"].outputs[0]
    tok = engine.get_tokenizer()
    head = tok.decode(full.token_ids[:min_tokens]) if min_tokens else ""
    assert full.text.startswith(head)
    engine.add_request("s", prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=stop,
                                                   min_tokens=min_tokens))
    out = drain(engine)["s"].outputs[0]
    assert full.text.startswith(out.text)
    if out.finish_reason == "length":
        assert out.text == full.text
        return
    assert len(out.token_ids) > min_tokens and out.stop_reason in stop
    assert full.text[len(out.text):].startswith(out.stop_reason)
    assert len(out.text) + len(out.stop_reason) > len(head)  # the match ends after the first tokens' text
    for s in stop:  # and it is the first such match
        i = full.text.find(s, max(0, len(head) - len(s) + 1))
        assert i == -1 or i >= len(out.text)
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


@pytest.mark.parametrize("messages, kwargs, field", [
    ([{"role": "user", "content": "hi\ud800"}], {}, r"messages\[0\].content"),
    ([{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}], {}, r"messages\[0\].content"),
    ([{"role": "system", "content": "x"}, {"role": "user\udc80", "content": "hi"}], {}, r"messages\[1\].role"),
    ([{"role": "user", "content": "hi", "name": "\ud800"}], {}, r"messages\[0\].name"),
    ([{"role": "user", "content": "hi"}], {"chat_template": "{{ '\ud800' }}"}, "chat template output"),
])
def test_chat_text_that_is_not_unicode_is_a_value_error(engine, messages, kwargs, field):
    """A lone surrogate anywhere in a conversation is a ValueError naming where (it was a TypeError from the
    tokenizer: a 500 on the server)."""
    from minengine.entrypoints.chat_utils import render_chat

    with pytest.raises(ValueError, match=field + " is not valid Unicode"):
        render_chat(engine.get_tokenizer(), messages, **kwargs)

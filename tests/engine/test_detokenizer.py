"""Streamed text: it never retracts, a stop string on the last allowed token is a "stop",
and the text grows with tokenizers' incremental DecodeStream, equal to a full decode.

Two tokenizers: the bundled byte-level BPE (GPT-2 / Llama-3 style: one character may span several tokens) and a
Llama-2 style one built here (Metaspace spaces, byte-fallback tokens ``<0xE4>`` for characters not in the
vocabulary, a leading space stripped)."""

from __future__ import annotations

import json
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine import LLM, LLMEngine, SamplingParams
from minengine.engine import detokenizer as detok_module
from minengine.engine.detokenizer import IncrementalDetokenizer, full_decode_text
from tests.prompts import TEXT

ALPHABET = "abcdefghij ROMEO:\n,.'!é中文🙂"


@cache
def bundled_tokenizer():
    from transformers import AutoTokenizer

    from minengine.config import BUNDLED_MODEL

    return AutoTokenizer.from_pretrained(BUNDLED_MODEL)


@cache
def byte_fallback_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    return Tokenizer.from_str(json.dumps(spec))


TOKENIZERS = {"byte-level": bundled_tokenizer, "byte-fallback": byte_fallback_tokenizer}


def encode(tok, text: str) -> list[int]:
    ids = tok.encode(text)
    return list(ids.ids if hasattr(ids, "ids") else ids)


def vocab_size(tok) -> int:
    return tok.get_vocab_size() if hasattr(tok, "get_vocab_size") else len(tok)


@st.composite
def token_streams(draw, tok):
    """Token ids: encoded random text with multi-byte characters (split across byte tokens), spliced with
    random vocabulary ids (which may be lone pieces of a character)."""
    ids = encode(tok, draw(st.text(alphabet=ALPHABET, max_size=40)))
    noise = draw(st.lists(st.integers(0, vocab_size(tok) - 1), max_size=6))
    for t in noise:
        ids.insert(draw(st.integers(0, len(ids))), t)
    return ids


def stream(tok, prompt, ids, stop, finish_at=None):
    """Feed ``ids`` one at a time as the engine does. Returns (texts shown after each token, final text,
    stop string, tokens consumed). ``finish_at``: the request ends (length) after that many tokens."""
    d = IncrementalDetokenizer(tok, prompt, stop)
    shown = []
    for k, t in enumerate(ids, start=1):
        d = d.advanced(t)
        done = d.stop_reason is not None or k == (finish_at or len(ids))
        shown.append(d.text(done))
        if done:
            return shown, shown[-1], d.stop_reason, k
    return shown, d.text(True), None, len(ids)


@pytest.mark.parametrize("name", list(TOKENIZERS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_incremental_text_equals_full_decode(name, data):
    """DecodeStream's text equals one full decode of the tokens so far whenever that decode is clean
    (a full decode may show a character still incomplete as U+FFFD, and byte-fallback decoding then even
    replaces the bytes before it), and the final text equals the full decode exactly."""
    tok = TOKENIZERS[name]()
    prompt = data.draw(token_streams(tok)) or encode(tok, "ROMEO:")
    ids = data.draw(token_streams(tok))
    d = IncrementalDetokenizer(tok, prompt, [])
    for k, t in enumerate(ids, start=1):
        d = d.advanced(t)
        full = full_decode_text(tok, prompt, ids[:k])
        if "\ufffd" not in full:
            assert d.output_text == full
    assert d.text(True).startswith(d.output_text)
    if name == "byte-level" or "\ufffd" not in full_decode_text(tok, prompt, ids):  # as above
        assert d.text(True) == full_decode_text(tok, prompt, ids)


@pytest.mark.parametrize("name", list(TOKENIZERS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_streamed_text_never_retracts(name, data):
    """With random stop strings (pieces of the text itself, across token boundaries, and multi-byte
    characters) every streamed text is a prefix of the next one and of the final text, and the final text is
    the full decode cut before the first stop string, stopping at the token that completes it."""
    tok = TOKENIZERS[name]()
    prompt = data.draw(token_streams(tok)) or encode(tok, "ROMEO:")
    ids = data.draw(token_streams(tok))
    text = full_decode_text(tok, prompt, ids)
    pieces = [text[i:j] for i in range(len(text)) for j in range(i + 1, min(len(text), i + 6) + 1)]
    pieces = [p for p in pieces if "\ufffd" not in p]
    stop = data.draw(st.lists(st.one_of(st.sampled_from(pieces), st.text(alphabet=ALPHABET, min_size=1, max_size=4))
                              if pieces else st.text(alphabet=ALPHABET, min_size=1, max_size=4), max_size=3))
    shown, final, reason, used = stream(tok, prompt, ids, stop)
    for a, b in zip(shown, shown[1:]):
        assert b.startswith(a), (a, b)
    assert all(final.startswith(s) for s in shown)
    if name == "byte-fallback" and "\ufffd" in text:
        return  # a byte that is no part of any character: a byte-fallback full decode itself changes its mind
    # the reference: the first token after which a stop string is in the fully decoded text
    for k in range(1, len(ids) + 1):
        full = full_decode_text(tok, prompt, ids[:k])
        found = [(full.find(s), n, s) for n, s in enumerate(stop) if s in full]
        if found:  # the earliest stop string, the first listed on a tie
            i, _, s = min(found)
            assert (final, reason, used) == (full[:i], s, k)
            break
    else:
        assert (final, reason, used) == (text, None, len(ids))


def test_text_that_could_start_a_stop_string_is_held_back():
    """Text ``"\\nI'll be"`` must not be streamed when a stop string ``"be g"`` then cuts it back to
    ``"\\nI'll "``: the characters that could start a stop string are held back until they cannot."""
    tok = bundled_tokenizer()
    prompt = encode(tok, "ROMEO:")
    ids = encode(tok, "\nI'll be gone")
    shown, final, reason, _ = stream(tok, prompt, ids, ["be g"])
    assert final == "\nI'll " and reason == "be g"
    assert all(final.startswith(s) for s in shown)


def test_partial_characters_are_held_back_and_flushed_at_the_end():
    tok = bundled_tokenizer()
    ids = encode(tok, " 中")  # a space, then three byte tokens
    shown, final, _, _ = stream(tok, encode(tok, "A:"), ids, [])
    assert "\ufffd" not in "".join(shown[:-1]) and final == " 中"
    cut, final, _, _ = stream(tok, encode(tok, "A:"), ids, [], finish_at=len(ids) - 1)  # ends mid-character
    assert final == full_decode_text(tok, encode(tok, "A:"), ids[:-1]) and final.endswith("\ufffd")


def test_no_full_decode_per_token(monkeypatch):
    """The text grows by DecodeStream steps; the whole output is never decoded again per token."""
    tok = bundled_tokenizer()
    ids = encode(tok, TEXT)[:300]
    calls = []
    monkeypatch.setattr(detok_module, "full_decode_text", lambda *a: calls.append(a) or "")
    d = IncrementalDetokenizer(tok, encode(tok, "ROMEO:"), [])
    for t in ids:
        d = d.advanced(t)
    assert not calls and d.output_text == tok.decode(ids)


# ---- through the engine -------------------------------------------------------------------------------------

def reference_output(llm, prompt, max_tokens):
    (out,) = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                          use_tqdm=False)
    return out.outputs[0]


def stop_across_tokens(tok, ids, text, first):
    """A stop string from the middle of output token ``first`` to the middle of token ``first + 2``."""
    pieces = [tok.decode(ids[:i]) for i in range(len(ids) + 1)]
    for i in range(first, len(ids) - 3):
        if len(pieces[i + 1]) - len(pieces[i]) >= 2 and len(pieces[i + 3]) - len(pieces[i + 2]) >= 2:
            start, end = len(pieces[i]) + 1, len(pieces[i + 3]) - 1
            if text.find(text[start:end]) == start:
                return text[start:end], start, i + 3
    raise AssertionError("no stop string across tokens found")


@pytest.mark.parametrize("prompt", ["KING RICHARD III:\n", "ROMEO:\n", "HAMLET:\nTo be, or not to be"])
def test_engine_stream_never_retracts(bundled_model, prompt):
    """Through ``LLMEngine.step``, each output's text is a prefix of the next and of the final one."""
    llm = LLM(bundled_model, max_model_len=512)
    ref = reference_output(llm, prompt, 40)
    stop, start, _ = stop_across_tokens(llm.get_tokenizer(), ref.token_ids, ref.text, 3)
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=512)
    engine.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]))
    shown = []
    while engine.has_unfinished_requests():
        shown += [o.outputs[0].text for o in engine.step()]
    assert shown[-1] == ref.text[:start]
    for a, b in zip(shown, shown[1:]):
        assert b.startswith(a), (a, b)


def test_stop_string_on_the_last_allowed_token_is_a_stop(bundled_model):
    """When token ``max_tokens`` completes a stop string, finish_reason is "stop" and stop_reason the
    string (it was "length" and None)."""
    llm = LLM(bundled_model, max_model_len=512)
    ref = reference_output(llm, "KING RICHARD III:\n", 40)
    stop, start, completing = stop_across_tokens(llm.get_tokenizer(), ref.token_ids, ref.text, 5)
    (out,) = llm.generate("KING RICHARD III:\n", SamplingParams(temperature=0, max_tokens=completing,
                          ignore_eos=True, stop=[stop]), use_tqdm=False)
    c = out.outputs[0]
    assert len(c.token_ids) == completing and c.text == ref.text[:start]
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert out.metrics.finish_reason == "stop"

"""``tokenize_within``: an oversized prompt is refused after bounded tokenizer work, and a prompt that fits is never
refused and gets exactly the ids of a full tokenization; the server's tokenizer thread lets other requests'
calls run between the pieces of a long one.

Two tokenizer families: the bundled model's byte-level BPE (GPT-2 style, its pre-tokenizer splits before
spaces) and a SentencePiece-style one built here (Llama 2's shape: a word-start marker prepended and spaces
replaced by it, no pre-tokenizer), trained on the built-in text (no download).
"""

from __future__ import annotations

import asyncio
import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine.entrypoints.async_tokenizer import AsyncTokenizer
from minengine.tokenize_within import PIECE_CHARS, BoundedEncoding, PromptTooLongError, encode_within
from tests.prompts import TEXT

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))


@functools.cache
def bundled_tokenizer():
    from transformers import AutoTokenizer

    from minengine.config import BUNDLED_MODEL

    return AutoTokenizer.from_pretrained(BUNDLED_MODEL)


@functools.cache
def sentencepiece_style_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=[f"<0x{b:02X}>" for b in range(256)])
    tok.train_from_iterator([TEXT] * 4, trainer)
    # Llama 2's layout: the normalizer marks word starts, no pre-tokenizer (tokens are not cut at words)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


TOKENIZERS = {"byte-level BPE": bundled_tokenizer, "sentencepiece-style": sentencepiece_style_tokenizer}


class CountingTokenizer:
    """A tokenizer that records the length of every text it is called on."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def __call__(self, text, **kwargs):
        self.calls.append(len(text))
        return self.tokenizer(text, **kwargs)


# Texts of every shape a cut can meet: words, long runs without whitespace, runs of spaces and newlines,
# non-ASCII letters and emoji (several bytes each), repeated to a random length.
UNITS = st.sampled_from(["a ", "the ", "  ", "\n", "\n\n", "x" * 700, "é", "日本語", "🙂", "ROMEO: ", TEXT[:300],
                         "1234567890", "\t", "ab-cd.", " " * 600])
texts = st.lists(st.tuples(UNITS, st.integers(1, 2000)), min_size=1, max_size=8).map(
    lambda parts: "".join(unit * n for unit, n in parts)[:6 * PIECE_CHARS])  # up to 5 cuts


@pytest.mark.parametrize("name", TOKENIZERS)
@SETTINGS
@given(text=texts)
def test_pieces_count_is_a_lower_bound(name, text):
    tok = TOKENIZERS[name]()
    encoding = BoundedEncoding(tok, text, limit=10**12)
    while encoding.position < len(text) and len(text) > PIECE_CHARS:
        assert encoding.step() is None
    whole = len(tok(text, add_special_tokens=False)["input_ids"])
    assert encoding.lower_bound <= whole, (encoding.counted, encoding.cuts, whole)


@pytest.mark.parametrize("name", TOKENIZERS)
@SETTINGS
@given(text=texts, slack=st.integers(-40, 40), special=st.booleans())
def test_fits_iff_the_full_count_fits(name, text, slack, special):
    """Around the exact count: a prompt that fits gets the full tokenization's ids, one that does not is refused
    naming the field and the limit, never the other way round."""
    tok = TOKENIZERS[name]()
    full = tok(text, add_special_tokens=special)["input_ids"]
    limit = max(1, len(full) + slack)
    if len(full) <= limit:
        assert encode_within(tok, text, limit, special, field="messages") == full
    else:
        with pytest.raises(PromptTooLongError) as info:
            encode_within(tok, text, limit, special, field="messages")
        assert info.value.parameter == "messages" and f"maximum context length of {limit} tokens" in str(info.value)
        assert "(max_model_len)" in str(info.value) and info.value.at_least > limit


@pytest.mark.parametrize("name", TOKENIZERS)
@SETTINGS
@given(unit=UNITS, size=st.integers(PIECE_CHARS, 4_000_000), limit=st.integers(1, 4096))
def test_oversized_prompt_is_refused_after_bounded_work(name, unit, size, limit):
    """Any text with more than ``limit`` tokens is refused after tokenizing a number of characters that depends on
    the limit (each counted piece adds hundreds of tokens), not on the text's length."""
    tok = TOKENIZERS[name]()
    text = (unit * (size // len(unit) + 1))[:size]
    counting = CountingTokenizer(tok)
    tokens_per_piece = 100  # far fewer than any unit above yields in PIECE_CHARS characters
    try:
        ids = encode_within(counting, text, limit)
    except PromptTooLongError as exc:
        assert exc.parameter == "prompt" and exc.limit == limit
        assert max(counting.calls) <= PIECE_CHARS  # refused while counting pieces: no call on the whole text
    else:
        assert len(ids) <= limit
    assert sum(counting.calls) <= PIECE_CHARS * (limit // tokens_per_piece + 2), (len(text), counting.calls)


def test_the_4m_token_prompt_of_the_report_is_refused_after_one_piece():
    counting = CountingTokenizer(bundled_tokenizer())
    with pytest.raises(PromptTooLongError, match="max_model_len") as info:
        encode_within(counting, "a " * 4_000_000, 512)
    assert counting.calls == [PIECE_CHARS - 1]  # one piece, cut before its last space: 4,096 tokens > 512
    assert info.value.parameter == "prompt" and not info.value.exact


def test_other_calls_run_between_the_pieces_of_a_long_prompt():
    """The tokenizer thread is shared: a short request queued while a long prompt is counted runs after the long
    one's current piece, not after all of it."""
    tok = CountingTokenizer(bundled_tokenizer())
    tokenizer = AsyncTokenizer(tok)
    tokenizer.tokenizer = tok  # count the calls of the thread's own copy
    long_text = "ROMEO: " * (PIECE_CHARS * 5 // 7)  # 5 pieces, ~2,000 tokens each, then the exact pass
    short_text = "a"  # its calls are the only length-1 ones

    async def both():
        return await asyncio.gather(tokenizer.encode(long_text, True, limit=100_000),
                                    tokenizer.encode(short_text, True, limit=100_000))

    try:
        long_ids, short_ids = asyncio.run(both())
    finally:
        tokenizer.shutdown()
    full = bundled_tokenizer()
    assert long_ids == full(long_text)["input_ids"] and short_ids == full(short_text)["input_ids"]
    # piece 1 of the long prompt, the short call, the long prompt's other pieces, its exact pass
    assert tok.calls.index(1) == 1 and len(tok.calls) >= 6 and max(tok.calls[2:-1]) <= PIECE_CHARS, tok.calls

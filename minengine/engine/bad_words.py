"""``SamplingParams.bad_words`` as token ids, tokenized as vLLM does; the sampler masks the last token of each
when the tokens before it have just been generated (``worker/logits_processing.py``)."""

from __future__ import annotations

from minengine.exceptions import VLLMValidationError


def bad_words_token_ids(tokenizer, words: list[str], vocab_size: int) -> tuple[tuple[int, ...], ...]:
    """vLLM's tokenization of ``bad_words``: each word as it is (its leading spaces dropped) and, when that
    gives a different first token of the same length, with one leading space (a word inside the text).

    Raises:
        VLLMValidationError: (``parameter="bad_words"``) no tokenizer, or ids outside ``[0, vocab_size)``.
    """
    if tokenizer is None:
        raise VLLMValidationError("bad_words needs a tokenizer (the model has none)", parameter="bad_words")
    out: list[tuple[int, ...]] = []
    for word in dict.fromkeys(words):
        plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        out += [plain] if plain else []
        if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
            out.append(spaced)
    bad = sorted({t for w in out for t in w if not 0 <= t < vocab_size})
    if bad:
        raise VLLMValidationError(f"bad_words tokenize to ids outside the vocabulary [0, {vocab_size}): {bad[:10]}",
                                  parameter="bad_words")
    return tuple(out)

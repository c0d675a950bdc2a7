"""Incremental detokenization with stop strings."""

from __future__ import annotations

_CONTEXT = 5  # prompt tokens decoded before the output, so tokenizers that mark word starts keep the space


class IncrementalDetokenizer:
    """Keeps one request's output text in step with its tokens and finds stop strings.

    The text is re-decoded from the output tokens (plus a few prompt tokens of context) after each new
    token: simple, and exact for byte-level BPE, where a token can hold part of a UTF-8 character.

    Args:
        tokenizer: a transformers tokenizer, or None (no text; stop strings are then rejected earlier).
        prompt_token_ids: the request's prompt.
        stop: stop strings; the text is cut before the first one found, which may span several tokens.
        skip_special_tokens: drop special tokens from the text.
    """

    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: list[str], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.stop = stop
        self.skip = skip_special_tokens
        self.context = prompt_token_ids[-_CONTEXT:]
        self.prefix = self._decode(self.context)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip) if self.tokenizer is not None else ""

    def update(self, output_token_ids: list[int]) -> str | None:
        """Recompute the text for the current output tokens; returns the stop string that matched, if any
        (``self.text`` is then cut right before it)."""
        if self.tokenizer is None:
            return None
        full = self._decode(self.context + output_token_ids)
        new_text = full[len(self.prefix):] if full.startswith(self.prefix) else self._decode(output_token_ids)
        # Only the tail can hold a stop string that was not there before.
        search_from = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        self.text = new_text
        best = None
        for s in self.stop:
            i = new_text.find(s, search_from)
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        self.text = new_text[:best[0]]
        return best[1]

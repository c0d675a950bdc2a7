"""Tokenizing a prompt only as far as it can fit: an oversized prompt is refused after a bounded amount of
tokenizer work, however long its text.

A tokenizer's cost grows with its text, and a server's body limit (8 MiB) holds millions of tokens. Tokenized in
full, one oversized prompt holds the tokenizer for seconds or minutes, and its ids take hundreds of megabytes,
only to be refused by the length check that follows. ``BoundedEncoding`` counts a long text piece by piece
instead (``PIECE_CHARS`` characters a call), stops as soon as the count proves the text is longer than the
limit, and tokenizes the whole text (once, exactly) only when it may fit. Each piece is one short call, so a
caller that runs the calls one at a time on a shared thread (``AsyncTokenizer``) lets other requests' calls run
in between.

Why the pieces' count is a lower bound of the whole text's (so a prompt that fits is never refused): pieces are
cut before a whitespace character where there is one near the cut. Byte-level BPE pre-tokenizers (GPT-2,
Llama 3, Qwen) split the text before a space, so no token of the whole text crosses such a cut and the counts add
up exactly. SentencePiece-style tokenizers (``Metaspace``) start each piece with a word-start marker, which can
add a token at a cut, and a cut inside a long run without whitespace can split one token of the whole text into
a few. A cut may therefore add at most ``SLACK_PER_CUT`` tokens: the bound is the sum of the pieces' counts minus
that per cut (``tests/server/test_tokenize_within.py`` checks it against full tokenization for both families). Special
tokens (BOS) are left out of the pieces' counts; they only add to the whole text's.
"""

from __future__ import annotations

from minengine.exceptions import VLLMValidationError

PIECE_CHARS = 8192  # characters per counting call: a few milliseconds of a fast tokenizer
SLACK_PER_CUT = 8  # tokens a cut between two pieces may add to their count (see the module docstring)
WHITESPACE_SEARCH = 512  # how far back from a piece's end a whitespace character to cut before is looked for


class PromptTooLongError(VLLMValidationError):
    """A prompt has more tokens than the limit (a ``ValueError``; ``parameter`` names the field).

    Attributes:
        at_least: the prompt's token count (exact), or a lower bound of it when counting stopped early.
        exact: whether ``at_least`` is the exact count.
        limit: the most tokens allowed (``max_model_len``).
    """

    def __init__(self, field: str, at_least: int, exact: bool, limit: int):
        count = f"{at_least:,} tokens" if exact else f"more than {limit:,} tokens (at least {at_least:,} counted)"
        super().__init__(f"{field} has {count}, more than this model's maximum context length of {limit} tokens "
                         "(max_model_len): please reduce the length of the input", parameter=field)
        self.at_least, self.exact, self.limit = at_least, exact, limit


def piece_end(text: str, start: int) -> int:
    """The end of the piece of ``text`` that starts at ``start``: ``PIECE_CHARS`` characters on, moved back
    before the last whitespace character of its final ``WHITESPACE_SEARCH`` characters if there is one (a cut
    that common pre-tokenizers make too); ``len(text)`` for the last piece."""
    end = start + PIECE_CHARS
    if end >= len(text):
        return len(text)
    for i in range(end, max(start + 1, end - WHITESPACE_SEARCH) - 1, -1):
        if text[i].isspace():
            return i
    return end


class BoundedEncoding:
    """The token ids of ``text``, or a ``PromptTooLongError`` once it is known to have more than ``limit``
    tokens, computed in steps of bounded work.

    Args:
        tokenizer: a transformers tokenizer (called as ``tokenizer(text, add_special_tokens=...)``).
        text: the prompt (or a chat template's output). limit: the most tokens accepted (``max_model_len``).
        add_special_tokens: as the tokenizer's argument, for the exact pass. field: the field the error names
            (``"prompt"``, ``"messages"``).

    Call ``step()`` until it returns the ids: each call tokenizes at most ``PIECE_CHARS`` characters, except the
    last, which tokenizes the whole text once its pieces' count shows that it may fit.
    """

    def __init__(self, tokenizer, text: str, limit: int, add_special_tokens: bool = True, field: str = "prompt"):
        self.tokenizer, self.text, self.limit = tokenizer, text, limit
        self.add_special_tokens, self.field = add_special_tokens, field
        self.position = 0  # where the next piece starts
        self.counted = 0  # tokens in the pieces so far
        self.cuts = 0  # cuts between pieces so far

    @property
    def lower_bound(self) -> int:
        """Tokens the whole text has at least, from the pieces counted so far."""
        return self.counted - SLACK_PER_CUT * self.cuts

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]

    def step(self) -> list[int] | None:
        """One bounded piece of work: the token ids when done, else None (call again).

        Raises:
            PromptTooLongError: the text has more than ``limit`` tokens (counted exactly, or bounded below).
        """
        text = self.text
        if len(text) <= PIECE_CHARS or self.position >= len(text):  # it may fit: tokenize it whole, exactly
            ids = self._encode(text, self.add_special_tokens)
            if len(ids) > self.limit:
                raise PromptTooLongError(self.field, len(ids), True, self.limit)
            return ids
        end = piece_end(text, self.position)
        self.counted += len(self._encode(text[self.position:end], False))
        self.cuts += self.position > 0
        self.position = end
        if self.lower_bound > self.limit:
            raise PromptTooLongError(self.field, self.lower_bound, False, self.limit)
        return None


def encode_within(tokenizer, text: str, limit: int, add_special_tokens: bool = True,
                  field: str = "prompt") -> list[int]:
    """The token ids of ``text`` (as ``tokenizer(text)["input_ids"]``), tokenizing no more of it than is needed
    to know that it has more than ``limit`` tokens.

    Raises:
        PromptTooLongError: (a ``ValueError``) the text has more than ``limit`` tokens; names ``field``.
    """
    encoding = BoundedEncoding(tokenizer, text, limit, add_special_tokens, field)
    while (ids := encoding.step()) is None:
        pass
    return ids

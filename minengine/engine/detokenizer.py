"""Incremental detokenization with stop strings, streamed so that no text is ever taken back.

The text grows with ``tokenizers.decoders.DecodeStream``, the tokenizers library's incremental decoder: each
token costs a decode of a few tokens, not of the whole output (vLLM's ``FastIncrementalDetokenizer`` does the
same). Streamed text only grows: the decoder holds back a partial UTF-8 character (byte-level BPE splits one
character over several tokens), and while a request runs its visible text holds back the last
``max(len(stop)) - 1`` characters, which could still be the start of a stop string (vLLM's
``stop_buffer_length``), so a client printing deltas never prints what a stop string later cuts.

A token that stops the request (EOS unless ``ignore_eos``, or one of ``stop_token_ids``) adds no text unless
``include_stop_str_in_output`` (vLLM's detokenizer drops the last token of a request finished with reason
"stop"); it stays in ``token_ids``. When the same token also reaches ``max_tokens`` the reason is "length"
(length is checked first, as in vLLM) and its text is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from minengine.exceptions import RequestError
from minengine.request import Request

logger = logging.getLogger(__name__)

_CONTEXT = 5  # prompt tokens decoded before the output, so tokenizers that mark word starts keep the space


def _backend(tokenizer):
    """The ``tokenizers.Tokenizer`` behind a transformers tokenizer (or the tokenizer itself), or None."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


def _decode(tokenizer, ids: list[int], skip_special_tokens: bool) -> str:
    backend = _backend(tokenizer)
    if backend is not None:  # what DecodeStream decodes with (no transformers-level clean-up)
        return backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def decode_context(tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True) -> list[int]:
    """The last few prompt tokens to decode the output after, without a trailing partial character (a prompt
    given as token ids may end in the middle of one): its text is then a clean prefix of context + output."""
    context = list(prompt_token_ids[-_CONTEXT:])
    while context and _decode(tokenizer, context, skip_special_tokens).endswith("\ufffd"):
        context.pop()
    return context


def full_decode_text(tokenizer, prompt_token_ids: list[int], output_token_ids: list[int],
                     skip_special_tokens: bool = True) -> str:
    """The text of ``output_token_ids`` by one full decode (after the prompt's ``decode_context``): the
    reference the incremental text equals, and what a request's last held-back tokens become when it ends."""
    context = decode_context(tokenizer, prompt_token_ids, skip_special_tokens)
    prefix = _decode(tokenizer, context, skip_special_tokens)
    full = _decode(tokenizer, context + list(output_token_ids), skip_special_tokens)
    return full[len(prefix):] if full.startswith(prefix) else _decode(tokenizer, output_token_ids, skip_special_tokens)


class IncrementalDetokenizer:
    """One request's output text, kept in step with its tokens; finds stop strings.

    ``advanced(token_id)`` returns a NEW detokenizer that has seen one more token and leaves this one as it
    was, so the engine can detokenize a step before committing it (a step that fails leaves no trace).

    Args:
        tokenizer: a transformers tokenizer (or a ``tokenizers.Tokenizer``), or None (no text; stop strings
            are then rejected earlier). Without a ``tokenizers`` backend the text is re-decoded in full after
            each token (correct, slower).
        prompt_token_ids: the request's prompt.
        stop: stop strings; the text is cut before the first one found, which may span several tokens.
        skip_special_tokens: drop special tokens from the text.
        include_stop_str_in_output: the stop string will be part of the final text, so nothing needs to be
            held back for it while streaming (vLLM's ``stop_buffer_length`` is 0 then).
        min_tokens: stop strings are looked for only in the text after the first ``min_tokens`` output tokens
            (a match may start up to ``len(stop) - 1`` characters before it), as vLLM (PR #22014): the request's
            ``SamplingParams.min_tokens`` holds for stop strings as for EOS and stop token ids.
        stop_token_ids: the ids that end the request with reason "stop" (``SamplingParams.all_stop_token_ids``:
            ``stop_token_ids`` and EOS unless ``ignore_eos``); their text is left out unless
            ``include_stop_str_in_output``.
        max_tokens: the request's output limit (the engine clamps it to what fits in ``max_model_len``): a stop
            token that is also the ``max_tokens``-th token ends the request with reason "length" and keeps its
            text. None: no limit.

    Attributes:
        output_text: the text of the tokens seen so far, without a partial character at its end, cut before
            the stop string once one is found.
        stop_reason: the stop string found, or None.
        stop_token_skipped: True once a stop token ended the output without adding its text.
    """

    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: list[str], skip_special_tokens: bool = True,
                 include_stop_str_in_output: bool = False, min_tokens: int = 0,
                 stop_token_ids: frozenset[int] = frozenset(), max_tokens: int | None = None):
        self.tokenizer = tokenizer
        self.min_tokens = min_tokens
        self.stop = list(stop)
        self.skip = skip_special_tokens
        self.prompt_token_ids = prompt_token_ids
        self.output_text = ""
        self.stop_reason: str | None = None
        self.num_tokens = 0  # output tokens seen
        self._num_released = 0  # output tokens whose text is in ``output_text`` (the rest: a partial character)
        # Output ids seen, shared with the copies ``advanced`` makes: each owns its first ``num_tokens`` entries.
        self._ids: list[int] = []
        self._max_stop = max((len(s) for s in self.stop), default=0)
        self._holdback = 0 if include_stop_str_in_output else max(self._max_stop - 1, 0)
        self._silent_stop_ids = frozenset() if include_stop_str_in_output else frozenset(stop_token_ids)
        self._max_tokens = max_tokens
        self.stop_token_skipped = False
        self._stream = None
        self._backend = _backend(tokenizer) if tokenizer is not None else None  # looked up once, not per token
        if self._backend is not None:
            from tokenizers.decoders import DecodeStream

            context = decode_context(tokenizer, prompt_token_ids, skip_special_tokens)
            self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)

    @classmethod
    def for_request(cls, tokenizer, request) -> IncrementalDetokenizer:
        """The detokenizer of an engine ``Request`` (its prompt and ``sampling_params``, already checked and
        clamped by the input processor)."""
        p = request.sampling_params
        return cls(tokenizer, request.prompt_token_ids, p.stop, p.skip_special_tokens, p.include_stop_str_in_output,
                   p.min_tokens, p.all_stop_token_ids, p.max_tokens)

    def advanced(self, token_id: int) -> IncrementalDetokenizer:
        """A copy that has seen ``token_id`` as the next output token (this detokenizer is unchanged)."""
        new = object.__new__(type(self))  # a shallow copy (what copy.copy does), without its generic machinery:
        new.__dict__.update(self.__dict__)  # this runs for every token of every request
        if self._stream is not None:
            new._stream = self._stream.__copy__()  # DecodeStream copies its state (``copy.copy`` calls this)
        new._step(token_id)
        return new

    def _step(self, token_id: int) -> None:
        del self._ids[self.num_tokens:]  # drop tokens of a copy that was never committed
        self._ids.append(token_id)
        self.num_tokens += 1
        if self.tokenizer is None or self.stop_reason is not None:
            self._num_released = self.num_tokens
            return
        if self._ends_with_stop_token(token_id):
            self.stop_token_skipped = True  # the request stops here: nothing after it needs the decoder's state
            return
        old_len = len(self.output_text)
        chunk = None
        if self._stream is not None:
            try:
                chunk = self._stream.step(self._backend, token_id)
            except Exception:  # a decoder whose text is not prefix-stable: decode in full from now on
                self._stream = None
        if self._stream is None:
            full = full_decode_text(self.tokenizer, self.prompt_token_ids, self._ids, self.skip)
            if full.endswith("\ufffd") or not full.startswith(self.output_text):
                chunk = None
            else:
                chunk = full[old_len:]
        if chunk is None:
            return
        self._num_released = self.num_tokens
        self.output_text += chunk
        if self.num_tokens <= self.min_tokens:
            return
        # Only the tail can hold a stop string that was not there before.
        search_from = max(0, old_len - self._max_stop + 1)
        best = None
        for s in self.stop:
            i = self.output_text.find(s, search_from)
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            self.output_text = self.output_text[:best[0]]
            self.stop_reason = best[1]

    def _ends_with_stop_token(self, token_id: int) -> bool:
        """Whether ``token_id`` (the ``num_tokens``-th) ends the request with reason "stop", so its text is left
        out: a stop token that does not also reach ``max_tokens`` (length wins then, as in the scheduler)."""
        return token_id in self._silent_stop_ids and (self._max_tokens is None or self.num_tokens < self._max_tokens)

    def text(self, finished: bool) -> str:
        """The text to show: while running, ``output_text`` minus the ``max(len(stop)) - 1`` characters that
        could still start a stop string (none when the stop string is to be included); once finished, all of
        it (held-back partial characters of the last tokens decoded in full). Every text returned is a prefix
        of every later one."""
        if self.stop_reason is not None:
            return self.output_text
        if not finished:
            return self.output_text[:max(len(self.output_text) - self._holdback, 0)]
        end = self.num_tokens - self.stop_token_skipped  # the tokens whose text counts
        if self._num_released < end and self.tokenizer is not None:  # text still held back
            full = full_decode_text(self.tokenizer, self.prompt_token_ids, self._ids[:end], self.skip)
            if full.startswith(self.output_text):
                return full
            # the full decode reads the held bytes together with released ones (byte fallback): keep what
            # was streamed and add the held tokens' own text
            return self.output_text + _decode(self.tokenizer, self._ids[self._num_released:end], self.skip)
        return self.output_text


class Detokenizers:
    """The ``IncrementalDetokenizer`` of every unfinished request, and a step's tokens run through them.

    ``detokenize`` builds new detokenizers and commits nothing (a step may still fail); ``commit`` keeps one
    once its step has committed. ``num_errors`` counts final texts that failed to decode (each one logged).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._by_id: dict[str, IncrementalDetokenizer] = {}
        self.num_errors = 0

    def add(self, request: Request) -> None:
        self._by_id[request.request_id] = IncrementalDetokenizer.for_request(self.tokenizer, request)

    def remove(self, request_id: str) -> None:
        del self._by_id[request_id]

    def commit(self, request_id: str, detok: IncrementalDetokenizer) -> str | None:
        """Keep ``detok`` as the request's; returns the stop string its text completed, or None."""
        self._by_id[request_id] = detok
        return detok.stop_reason

    def detokenize(self, sampled: dict[str, list[int]], request_ids: list[str],
                   tokens_before_stop: Callable[[str, list[int]], int],
                   caller_id: Callable[[str], str]) -> tuple[dict[str, list[int]], dict[str, IncrementalDetokenizer]]:
        """The tokens each of ``request_ids`` keeps of ``sampled`` and its detokenizer after them (new objects).
        A request keeps its tokens up to the first stop (``tokens_before_stop(request_id, tokens)``: length, EOS,
        stop token ids, the scheduler's rules) and up to the token that completes a stop string: with
        speculative decoding a step may bring several tokens, and none after a stop may reach the output.

        Raises:
            RequestError: one request's detokenizing failed; names it (``caller_id``: the id its caller knows).
        """
        kept, detoks = {}, {}
        for rid in request_ids:
            tokens, detok = sampled[rid], self._by_id[rid]
            try:
                if len(tokens) == 1:
                    kept[rid], detoks[rid] = tokens, detok.advanced(tokens[0])
                    continue
                tokens = tokens[:tokens_before_stop(rid, tokens)]
                for i, token in enumerate(tokens):
                    detok = detok.advanced(token)
                    if detok.stop_reason is not None:
                        tokens = tokens[:i + 1]
                        break
            except Exception as exc:  # this request's text failed: the others are not to blame
                raise RequestError([caller_id(rid)], f"detokenizing request {rid!r} failed: {exc!r}") from exc
            kept[rid], detoks[rid] = tokens, detok
        return kept, detoks

    def text(self, request_id: str, finished: bool) -> str:
        """The request's text for its output; if the final full decode fails, the text streamed so far (logged
        and counted: the tokens are right, only a held-back partial character may be missing)."""
        detok = self._by_id[request_id]
        try:
            return detok.text(finished)
        except Exception:
            self.num_errors += 1
            logger.exception("request %r: decoding its final text failed; sending the text so far", request_id)
            return detok.output_text

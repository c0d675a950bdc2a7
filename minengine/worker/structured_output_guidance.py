"""The llguidance backend of structured outputs (vLLM's ``guidance``): the fallback for JSON schemas xgrammar
would compile but not enforce.

xgrammar compiles some JSON-schema keywords into a grammar that ignores them (a ``pattern`` together with
``maxLength``, ``multipleOf``, ``not``...): every output then "follows the schema" without being valid. llguidance
(``llguidance`` on PyPI, Microsoft's guidance engine) enforces more of JSON Schema and refuses, by name, every
keyword it cannot enforce ("Unimplemented keys"). ``structured_output.StructuredOutputManager`` chooses between
the two as vLLM's ``auto`` does; this file only compiles constraints for llguidance and wraps its matcher in the
interface the scheduler and the sampler use (``StructuredOutputRequest``'s methods).

The mask has xgrammar's layout ([R, ceil(V / 32)] int32, bit ``t % 32`` of word ``t // 32`` = token t allowed), so
``apply_bitmask`` serves both backends. llguidance is imported on the first request that needs it.
"""

from __future__ import annotations

import json
import re

import torch

from minengine.sampling_params import StructuredOutputsParams

_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[([^\]]*)\]")


def unimplemented_keywords(error: str) -> list[str]:
    """The JSON-schema keywords llguidance names in an "Unimplemented keys" error (empty for any other error)."""
    match = _UNIMPLEMENTED.search(error)
    return [k.strip().strip('"') for k in match.group(1).split(",")] if match else []


def guidance_grammar(so: StructuredOutputsParams, schema: dict | None, disable_any_whitespace: bool) -> str:
    """The llguidance grammar of a constraint (vLLM's ``serialize_guidance_grammar``).

    Args:
        so: the constraint (kinds json, json_object, regex, choice, grammar).
        schema: for ``json``: the checked schema (``additionalProperties`` already closed if asked).
        disable_any_whitespace: compact JSON (llguidance's ``whitespace_flexible=False``).

    Raises:
        ValueError: ``structural_tag`` (xgrammar only), naming the field.
    """
    import llguidance

    defaults = {"whitespace_flexible": not disable_any_whitespace}
    kind = so.kind
    if kind == "json":
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=defaults)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=defaults)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(so.regex)
    if kind == "choice":
        return llguidance.grammar_from("choice", json.dumps(so.choice))
    if kind == "grammar":
        return llguidance.grammar_from("grammar", so.grammar)
    raise ValueError(f"structured_outputs.{kind} is not supported by the guidance backend (use xgrammar)")


class GuidanceBackend:
    """llguidance's tokenizer view of one engine's vocabulary, built on the first request that needs it.

    Args:
        tokenizer: the engine's Hugging Face tokenizer.
        vocab_size: the logits width V (at least the tokenizer's vocabulary).
        eos_token_id: the token a complete output ends with.
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_id: int | None):
        import llguidance.hf

        try:
            self.ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos_token_id)
        except Exception as exc:  # a tokenizer llguidance cannot read
            raise ValueError(f"structured_outputs: the tokenizer cannot be used by llguidance: {exc}") from None
        self.vocab_size = vocab_size

    def check(self, grammar: str, field: str) -> None:
        """Raise a ``ValueError`` naming ``field`` (and the keywords, for a JSON schema) when llguidance
        cannot enforce ``grammar``."""
        import llguidance

        error = llguidance.LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        if not error:
            return
        keys = unimplemented_keywords(error)
        if keys:
            raise ValueError(f"{field} uses {', '.join(repr(k) for k in keys)}, which neither xgrammar nor "
                             "llguidance can enforce: remove it, or check it on the output")
        raise ValueError(f"{field} cannot be compiled by llguidance: {error.splitlines()[0]}")

    def new_request(self, grammar: str) -> GuidanceRequest:
        """A fresh grammar state of a grammar ``check`` accepted."""
        import llguidance

        return GuidanceRequest(llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0), self.vocab_size)


class GuidanceRequest:
    """One request's grammar state (an llguidance ``LLMatcher``), with ``StructuredOutputRequest``'s interface.

    llguidance's matcher enters a permanent error state on a token it rejects, so each token is validated
    before it is consumed: a rejected token leaves the state as it was, as xgrammar's does.
    """

    __slots__ = ("matcher", "vocab_size", "num_accepted")

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.num_accepted = 0

    def _advance(self, token: int) -> bool:
        if self.matcher.is_stopped() or self.matcher.validate_tokens([token]) != 1:
            return False
        return self.matcher.consume_token(token)

    def accept_token(self, token: int) -> bool:
        """Advance by one committed output token; False (state unchanged) when the grammar rejects it."""
        ok = self._advance(token)
        self.num_accepted += ok
        return ok

    def is_terminated(self) -> bool:
        """True once the grammar accepted its stop token (EOS): the output is complete."""
        return self.matcher.is_stopped()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the next-token mask into ``bitmask[row]`` ([R, ceil(V / 32)] int32, set bit = allowed)."""
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, row)

    def speculate(self, token: int) -> bool:
        """Advance through a proposal the sampler accepted while verifying (undone by ``rollback``)."""
        return self._advance(token)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` speculative advances."""
        if num_tokens:
            self.matcher.rollback(num_tokens)

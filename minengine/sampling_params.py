"""SamplingParams: how one request samples and when it stops (vLLM's names, defaults and meanings).
``StructuredOutputsParams`` (a request's output constraint) is re-exported from ``structured_outputs_params.py``."""

from __future__ import annotations

import copy
import enum
import math
from dataclasses import dataclass, field

from minengine.exceptions import VLLMValidationError, show
from minengine.structured_outputs_params import STRUCTURED_OUTPUT_KINDS, StructuredOutputsParams  # noqa: F401
from minengine.value_checks import as_float, check_unicode, token_ids

SAMPLING_EPS = 1e-5  # vLLM's threshold under which a temperature means greedy
MAX_LOGPROBS = 20  # vLLM's default ``max_logprobs`` (EngineConfig.max_logprobs): most alternatives per position
LOGPROBS_BOUND = 2**31 - 1  # what a request may name at all; the engine's max_logprobs is the real limit
# The most completions of one request: every child is a request queued at once, so a larger n is a typo (vLLM has
# no bound; its OpenAI server, as minengine's, takes at most 128).
MAX_N = 2**16


class RequestOutputKind(enum.IntEnum):
    """What each ``RequestOutput`` of a request carries (vLLM's ``RequestOutputKind``).

    CUMULATIVE: the whole text and token ids so far (the default); DELTA: only what is new since the last
    output (what a streaming server sends); FINAL_ONLY: one output, when the request finishes.
    """

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


LOGIT_BIAS_LIMIT = 100.0  # vLLM clamps each bias to [-100, 100] (OpenAI's range)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _invalid(parameter: str, message: str):
    raise VLLMValidationError(message, parameter=parameter)


def _is_number(x) -> bool:
    """A finite real number (an integer too large for a float is not: it would overflow in the sampler)."""
    f = as_float(x)
    return f is not None and math.isfinite(f)


@dataclass(kw_only=True)
class SamplingParams:
    """Sampling and stopping settings of one request, with vLLM's field names, defaults and meanings.

    Sampling order (vLLM v1's sampler): raw logprobs are taken first; then ``min_tokens`` masks EOS and the
    stop token ids; then the penalties (repetition, then frequency and presence); greedy requests take the
    argmax here; others divide by the temperature, apply ``min_p``, then top-k and top-p, and draw.

    Attributes:
        n: completions to generate for the prompt (each is a child request; outputs carry ``.index``); at most
            ``MAX_N`` (65,536).
        best_of: accepted when None or equal to ``n`` (vLLM v1 dropped generating more than ``n``).
        presence_penalty: subtracted from the logit of every token already generated (OpenAI's; in [-2, 2]).
        frequency_penalty: subtracted once per earlier occurrence in the output (OpenAI's; in [-2, 2]).
        repetition_penalty: divides positive / multiplies negative logits of every token seen in the prompt or
            the output (Keskar et al. 2019, CTRL; > 0, 1 = off).
        temperature: 0 (or below 1e-5) means greedy (argmax); > 0 divides the logits before softmax.
        top_p: nucleus sampling (Holtzman et al., ICLR 2020): keep the smallest set of tokens whose probability
            sums to >= top_p; in (0, 1].
        top_k: keep the k most likely tokens; 0 or -1 keeps all (vLLM's meaning).
        min_p: drop tokens less likely than ``min_p`` times the most likely one (after temperature); [0, 1].
        seed: per-request seed in [0, 2**64); the request's samples then depend on nothing else in the batch.
            -1 = None (vLLM's).
        stop: strings that end generation; the returned text is cut before the stop string unless
            ``include_stop_str_in_output``.
        stop_token_ids: token ids that end generation (the token is kept in ``token_ids``); Python or numpy
            integers, below the model's vocabulary size (checked when the request is added).
        ignore_eos: keep generating past the model's EOS token.
        max_tokens: the most tokens to generate (>= 1); None = as many as fit in ``max_model_len``. A larger value
            is clamped to what fits when the request is added (as vLLM's offline ``LLM``, whose requests stop at
            ``max_model_len``); the OpenAI server answers 400 instead, as vLLM's.
        min_tokens: EOS and ``stop_token_ids`` cannot be sampled, nor stop strings end the request, before
            this many tokens (<= max_tokens; as vLLM).
        logprobs: return, for every generated token, the log-probabilities of the sampled token and of the
            ``logprobs`` most likely ones (0 = the sampled token only), from the raw model distribution
            (before penalties, temperature and truncation, as vLLM's default); None = none. The engine allows at
            most its ``max_logprobs`` (20 by default; vLLM's rule: the check is the engine's, when the request is
            added, not ``SamplingParams``').
        prompt_logprobs: the same for every prompt token (the first has None); the request then skips the
            prefix cache, as in vLLM, since cached positions compute no logits.
        skip_special_tokens: drop special tokens from the returned text.
        spaces_between_special_tokens: accepted for vLLM compatibility (the tokenizer's decode decides).
        include_stop_str_in_output: keep the matched stop string at the end of the text.
        output_kind: CUMULATIVE, DELTA or FINAL_ONLY outputs (``RequestOutputKind``).
        structured_outputs: a ``StructuredOutputsParams`` constraint (JSON schema, regex, choice, grammar, JSON
            object): each step only tokens that keep the output a prefix of a valid one can be sampled, and the
            request stops when the grammar is complete (its stop token accepted); None = unconstrained.
        logit_bias: {token id: bias} added to the raw logits before sampling (OpenAI's; each clamped to
            [-100, 100] as vLLM; string keys are converted to ints). Ids must be in the vocabulary.
        allowed_token_ids: only these token ids can be sampled (non-empty; ids in the vocabulary).
        bad_words: words never generated: the last token of each word's tokenization (with and without a
            leading space) is masked whenever the tokens before it have just been generated (vLLM's rule).
        extra_args: free-form arguments for custom logits processors (``LLM(logits_processors=[...])``);
            minengine's own sampler never reads them.

    The logits processing order is vLLM v1's (``worker/sampler.py``): the grammar bitmask first (so raw logprobs
    are those of the constrained distribution, as in vLLM), then ``allowed_token_ids``, ``bad_words``,
    ``logit_bias``, ``min_tokens``, the penalties, and then temperature and truncation.

    Raises:
        VLLMValidationError: (a ``ValueError``) naming the field and the allowed range.
    """

    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    extra_args: dict | None = None
    # Filled by the engine when it accepts the request (EOS + stop_token_ids, masked before min_tokens).
    all_stop_token_ids: frozenset[int] = field(default=frozenset(), repr=False, compare=False)
    # Filled by the engine from ``bad_words`` with its tokenizer (vLLM's ``_bad_words_token_ids``).
    bad_words_token_ids: tuple[tuple[int, ...], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and not isinstance(self.stop, (list, tuple)):
            _invalid("stop", f"stop must be a string or a list of strings, got {show(self.stop)}")
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, (list, tuple)) \
                and not hasattr(self.stop_token_ids, "tolist"):  # a numpy array or a tensor of ids is fine
            _invalid("stop_token_ids", f"stop_token_ids must be a list of token ids, got {show(self.stop_token_ids)}")
        self.stop = list(self.stop or [])
        self.stop_token_ids = token_ids(() if self.stop_token_ids is None else self.stop_token_ids)  # numpy ints: ints
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        if isinstance(self.logit_bias, dict):  # vLLM's from_optional: "12" -> 12, clamped to [-100, 100]
            try:
                self.logit_bias = {int(k): v for k, v in self.logit_bias.items()}
            except (TypeError, ValueError):
                _invalid("logit_bias",
                         f"logit_bias keys must be token ids (integers), got {show(list(self.logit_bias))}")
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]
        if _is_int(self.seed) and self.seed == -1:  # vLLM's "no seed" (OpenAI clients send -1 too)
            self.seed = None
        if _is_int(self.output_kind) and self.output_kind in tuple(RequestOutputKind):
            self.output_kind = RequestOutputKind(self.output_kind)
        self.verify()

    def verify(self) -> None:
        """Check every field against its range; raises ``VLLMValidationError`` (a ``ValueError``) naming the first
        bad one."""
        self._verify_n()
        self._verify_sampling()
        self._verify_lengths()
        self._verify_stops()
        self._verify_flags()
        self._verify_logits_processing()

    def _verify_n(self) -> None:
        """How many completions: ``n`` and vLLM v1's ``best_of`` (which must equal it)."""
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            _invalid("n", f"n must be an integer in [1, {MAX_N}], got {show(self.n)}")
        if self.best_of is not None and self.best_of != self.n:
            _invalid("best_of", f"best_of ({show(self.best_of)}) must be None or equal to n ({self.n}): generating "
                     "more sequences than are returned is not supported (as in vLLM v1)")

    def _verify_sampling(self) -> None:
        """The penalties, temperature and truncation (top-p, top-k, min-p), then the float ones made floats."""
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_number(v) or not -2.0 <= v <= 2.0:
                _invalid(name, f"{name} must be a number in [-2, 2], got {show(v)}")
        if not _is_number(self.repetition_penalty) or not self.repetition_penalty > 0:
            _invalid("repetition_penalty",
                     f"repetition_penalty must be a number > 0 (1 = off), got {show(self.repetition_penalty)}")
        t = self.temperature
        if not _is_number(t) or t < 0:
            _invalid("temperature", f"temperature must be a finite number >= 0, got {show(t)}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            _invalid("top_p", f"top_p must be in (0, 1], got {show(self.top_p)}")
        if not _is_int(self.top_k) or self.top_k < -1:
            _invalid("top_k", f"top_k must be 0 or -1 (all tokens) or >= 1, got {show(self.top_k)}")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            _invalid("min_p", f"min_p must be in [0, 1], got {show(self.min_p)}")
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "min_p"):
            # as floats (vLLM's types): the sampler divides tensors by them, and an int beyond 64 bits (a
            # temperature of 2**64) would overflow there, after the request was admitted
            setattr(self, name, float(getattr(self, name)))

    def _verify_lengths(self) -> None:
        """How many tokens: ``max_tokens``, ``min_tokens`` (at most ``max_tokens``) and the logprobs counts."""
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            _invalid("max_tokens", f"max_tokens must be an integer >= 1 or None, got {show(self.max_tokens)}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            _invalid("min_tokens", f"min_tokens must be an integer >= 0, got {show(self.min_tokens)}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            _invalid("min_tokens", f"min_tokens ({show(self.min_tokens)}) must be <= max_tokens "
                     f"({show(self.max_tokens)})")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or not 0 <= v <= LOGPROBS_BOUND):
                _invalid(name, f"{name} must be None or an integer >= 0 (the engine's max_logprobs limits it, "
                         f"{MAX_LOGPROBS} by default), got {show(v)}")

    def _verify_stops(self) -> None:
        """The stop strings (non-empty, valid UTF-8) and stop token ids (non-negative integers)."""
        if any(not isinstance(s, str) or not s for s in self.stop):
            _invalid("stop", f"stop must hold non-empty strings, got {show(self.stop)}")
        for i, s in enumerate(self.stop):
            check_unicode(s, f"stop[{i}]")
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            _invalid("stop_token_ids",
                     f"stop_token_ids must hold non-negative integers, got {show(self.stop_token_ids)}")

    def _verify_flags(self) -> None:
        """The bool switches, the seed's range and the output kind."""
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                _invalid(name, f"{name} must be a bool, got {show(getattr(self, name))}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**64):
            _invalid("seed", f"seed must be None or an integer in [0, 2**64) (64 bits, what a torch generator takes), "
                     f"got {show(self.seed)}")
        if not isinstance(self.output_kind, RequestOutputKind):
            _invalid("output_kind", f"output_kind must be a RequestOutputKind, got {show(self.output_kind)}")

    def _verify_logits_processing(self) -> None:
        """Types of the logits-processing fields (their ids are checked against the vocabulary by the engine)."""
        so = self.structured_outputs
        if so is not None and not isinstance(so, StructuredOutputsParams):
            _invalid("structured_outputs", f"structured_outputs must be a StructuredOutputsParams (or its dict) "
                     f"or None, got {show(so)}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or any(not _is_int(k) for k in self.logit_bias):
                _invalid("logit_bias", f"logit_bias must be a dict of token id -> bias, got {show(self.logit_bias)}")
            if any(not _is_number(v) for v in self.logit_bias.values()):
                _invalid("logit_bias",
                         f"logit_bias values must be finite numbers, got {show(list(self.logit_bias.values()))}")
            self.logit_bias = {k: min(LOGIT_BIAS_LIMIT, max(-LOGIT_BIAS_LIMIT, float(v)))
                               for k, v in self.logit_bias.items()}
        ids = self.allowed_token_ids
        if ids is not None and (not isinstance(ids, (list, tuple)) or not ids
                                or any(not _is_int(t) or t < 0 for t in ids)):
            _invalid("allowed_token_ids", f"allowed_token_ids must be a non-empty list of token ids (integers >= 0), "
                     f"got {show(ids)}")
        if self.bad_words is not None and (not isinstance(self.bad_words, (list, tuple))
                                           or any(not isinstance(w, str) or not w.strip() for w in self.bad_words)):
            _invalid("bad_words", f"bad_words must be a list of non-empty strings, got {show(self.bad_words)}")
        for i, w in enumerate(self.bad_words or ()):
            check_unicode(w, f"bad_words[{i}]")
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            _invalid("extra_args", f"extra_args must be a dict or None, got {show(self.extra_args)}")

    @property
    def has_token_masks(self) -> bool:
        """Whether the sampler must edit this request's logits before min_tokens and the penalties:
        ``allowed_token_ids``, ``bad_words`` or ``logit_bias`` (the grammar bitmask is the request's own
        state, ``Request.structured_output``)."""
        return bool(self.allowed_token_ids or self.bad_words_token_ids or self.logit_bias)

    @property
    def greedy(self) -> bool:
        """Temperatures below 1e-5 sample greedily (as vLLM): dividing logits by them would overflow."""
        return self.temperature < SAMPLING_EPS

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def needs_processing(self, output_index: int) -> bool:
        """Whether the sampler's row for the ``output_index``-th output token needs more than an argmax
        (``worker/logits_processing.py``)."""
        return (not self.greedy or self.has_penalties or self.has_token_masks
                or (output_index < self.min_tokens and bool(self.all_stop_token_ids)))

    def clone(self) -> SamplingParams:
        """A copy the engine can fill in without changing the caller's object."""
        c = copy.copy(self)
        c.stop, c.stop_token_ids = list(self.stop), list(self.stop_token_ids)
        if self.logit_bias is not None:
            c.logit_bias = dict(self.logit_bias)
        if self.allowed_token_ids is not None:
            c.allowed_token_ids = list(self.allowed_token_ids)
        if self.bad_words is not None:
            c.bad_words = list(self.bad_words)
        return c

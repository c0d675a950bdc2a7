"""SamplingParams: how one request samples and when it stops (vLLM's names, defaults and meanings)."""

from __future__ import annotations

import copy
import enum
import math
from dataclasses import dataclass, field, fields

SAMPLING_EPS = 1e-5  # vLLM's threshold under which a temperature means greedy
MAX_LOGPROBS = 20  # vLLM's default ``max_logprobs``: most top alternatives returned per position


class RequestOutputKind(enum.IntEnum):
    """What each ``RequestOutput`` of a request carries (vLLM's ``RequestOutputKind``).

    CUMULATIVE: the whole text and token ids so far (the default); DELTA: only what is new since the last
    output (what a streaming server sends); FINAL_ONLY: one output, when the request finishes.
    """

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


LOGIT_BIAS_LIMIT = 100.0  # vLLM clamps each bias to [-100, 100] (OpenAI's range)
# the constraint fields of StructuredOutputsParams, exactly one of which a request sets (vLLM's list)
STRUCTURED_OUTPUT_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """One output constraint of a request (vLLM's ``StructuredOutputsParams``): exactly one of ``json`` (a JSON
    schema, a dict or its JSON text), ``regex``, ``choice`` (the output is one of these strings), ``grammar``
    (EBNF, xgrammar's dialect of GBNF), ``json_object=True`` (any JSON object or array) or ``structural_tag`` (a
    JSON string, vLLM's format). The engine compiles it into a token automaton (``worker/structured_output.py``,
    xgrammar) when the request is added, so a constraint the grammar engine cannot compile is a ``ValueError``
    naming the field there, before anything runs.

    Attributes:
        disable_any_whitespace: JSON without free whitespace between tokens (xgrammar's ``any_whitespace=False``).
        disable_additional_properties: objects of ``json`` take only the listed properties (``additionalProperties:
            false`` wherever the schema leaves it unset).
        whitespace_pattern: accepted for vLLM compatibility; the xgrammar backend rejects a non-None value (as
            vLLM's xgrammar backend does).

    Raises:
        ValueError: none or more than one constraint, or a field of the wrong type (naming it).
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in STRUCTURED_OUTPUT_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"structured_outputs must set exactly one of {', '.join(STRUCTURED_OUTPUT_KINDS)}, "
                             f"got {given or 'none'}")
        kind, value = given[0], getattr(self, given[0])
        ok = {"json": isinstance(value, (str, dict)), "regex": isinstance(value, str),
              "choice": isinstance(value, (list, tuple)) and bool(value) and all(isinstance(c, str) for c in value),
              "grammar": isinstance(value, str) and bool(value.strip()), "json_object": value is True,
              "structural_tag": isinstance(value, str)}[kind]
        if not ok or (kind == "json" and isinstance(value, str) and not value.strip()):
            want = {"json": "a JSON schema (dict or JSON text)", "regex": "a string",
                    "choice": "a non-empty list of strings", "grammar": "a non-empty EBNF string",
                    "json_object": "True (omit structured_outputs for unconstrained output)",
                    "structural_tag": "a JSON string"}[kind]
            raise ValueError(f"structured_outputs.{kind} must be {want}, got {value!r}")
        if kind == "choice":
            self.choice = list(value)
        for name in ("disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"structured_outputs.{name} must be a bool, got {getattr(self, name)!r}")
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise ValueError(f"structured_outputs.whitespace_pattern must be a string or None, "
                             f"got {self.whitespace_pattern!r}")

    @property
    def kind(self) -> str:
        """Which constraint is set: one of ``STRUCTURED_OUTPUT_KINDS``."""
        return next(k for k in STRUCTURED_OUTPUT_KINDS if getattr(self, k) is not None)

    def all_constraints_none(self) -> bool:
        """vLLM's helper (always False here: construction requires one constraint)."""
        return all(getattr(self, k) is None for k in STRUCTURED_OUTPUT_KINDS)

    @classmethod
    def from_dict(cls, value: dict) -> StructuredOutputsParams:
        """From the JSON the OpenAI server receives (``{"json": {...}}``); an unknown key is a ValueError."""
        if not isinstance(value, dict):
            raise ValueError(f"structured_outputs must be an object, got {value!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"structured_outputs has unknown keys {unknown} (known: {sorted(known)})")
        return cls(**value)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(kw_only=True)
class SamplingParams:
    """Sampling and stopping settings of one request, with vLLM's field names, defaults and meanings.

    Sampling order (vLLM v1's sampler): raw logprobs are taken first; then ``min_tokens`` masks EOS and the
    stop token ids; then the penalties (repetition, then frequency and presence); greedy requests take the
    argmax here; others divide by the temperature, apply ``min_p``, then top-k and top-p, and draw.

    Attributes:
        n: completions to generate for the prompt (each is a child request; outputs carry ``.index``).
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
        seed: per-request seed; the request's samples then depend on nothing else in the batch. -1 =
            None (vLLM's).
        stop: strings that end generation; the returned text is cut before the stop string unless
            ``include_stop_str_in_output``.
        stop_token_ids: token ids that end generation (the token is kept in ``token_ids``).
        ignore_eos: keep generating past the model's EOS token.
        max_tokens: the most tokens to generate (>= 1); None = as many as fit in ``max_model_len``.
        min_tokens: EOS and ``stop_token_ids`` cannot be sampled, nor stop strings end the request, before
            this many tokens (<= max_tokens; as vLLM).
        logprobs: return, for every generated token, the log-probabilities of the sampled token and of the
            ``logprobs`` most likely ones (0 = the sampled token only), from the raw model distribution
            (before penalties, temperature and truncation, as vLLM's default); None = none; at most 20.
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
        ValueError: naming the field and the allowed range.
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
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, (list, tuple)):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        if isinstance(self.logit_bias, dict):  # vLLM's from_optional: "12" -> 12, clamped to [-100, 100]
            try:
                self.logit_bias = {int(k): v for k, v in self.logit_bias.items()}
            except (TypeError, ValueError):
                raise ValueError(f"logit_bias keys must be token ids (integers), got {list(self.logit_bias)!r}") \
                    from None
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]
        if _is_int(self.seed) and self.seed == -1:  # vLLM's "no seed" (OpenAI clients send -1 too)
            self.seed = None
        if _is_int(self.output_kind) and self.output_kind in tuple(RequestOutputKind):
            self.output_kind = RequestOutputKind(self.output_kind)
        self.verify()

    def verify(self) -> None:
        """Check every field; raises ``ValueError`` naming the first bad one."""
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of ({self.best_of!r}) must be None or equal to n ({self.n}): generating more "
                             "sequences than are returned is not supported (as in vLLM v1)")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_number(v) or not -2.0 <= v <= 2.0:
                raise ValueError(f"{name} must be a number in [-2, 2], got {v!r}")
        if not _is_number(self.repetition_penalty) or not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be a number > 0 (1 = off), got {self.repetition_penalty!r}")
        t = self.temperature
        if not _is_number(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be 0 or -1 (all tokens) or >= 1, got {self.top_k!r}")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1 or None, got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or not 0 <= v <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be None or an integer in [0, {MAX_LOGPROBS}], got {v!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must hold non-negative integers, got {self.stop_token_ids!r}")
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {self.seed!r}")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        self._verify_logits_processing()

    def _verify_logits_processing(self) -> None:
        """Types of the logits-processing fields (their ids are checked against the vocabulary by the engine)."""
        so = self.structured_outputs
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams (or its dict) or None, got {so!r}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or any(not _is_int(k) for k in self.logit_bias):
                raise ValueError(f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}")
            if any(not _is_number(v) for v in self.logit_bias.values()):
                raise ValueError(f"logit_bias values must be finite numbers, got {list(self.logit_bias.values())!r}")
            self.logit_bias = {k: min(LOGIT_BIAS_LIMIT, max(-LOGIT_BIAS_LIMIT, float(v)))
                               for k, v in self.logit_bias.items()}
        ids = self.allowed_token_ids
        if ids is not None and (not isinstance(ids, (list, tuple)) or not ids
                                or any(not _is_int(t) or t < 0 for t in ids)):
            raise ValueError(f"allowed_token_ids must be a non-empty list of token ids (integers >= 0), got {ids!r}")
        if self.bad_words is not None and (not isinstance(self.bad_words, (list, tuple))
                                           or any(not isinstance(w, str) or not w.strip() for w in self.bad_words)):
            raise ValueError(f"bad_words must be a list of non-empty strings, got {self.bad_words!r}")
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise ValueError(f"extra_args must be a dict or None, got {self.extra_args!r}")

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

"""InputProcessor: prompts in, validated ``Request``s out (vLLM v1's ``InputProcessor``, formerly ``Processor``).

Everything the engine does with a request before it is queued: tokenize the prompt (or check its token ids),
validate the request id, the ``SamplingParams``, priority, deadline and arrival time against the engine's
limits (``max_model_len``, the KV pool), resolve ``max_tokens=None`` and the stop token ids, and fan an
``n > 1`` request out into its children (``parallel_sampling.py``). Nothing here changes the engine: a
request is queued by ``LLMEngine.enqueue`` (or ``add_request``), so a whole batch can be validated first.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from minengine.config import EngineConfig
from minengine.core.kv_cache_manager import cdiv
from minengine.engine.arrival_time import wall_to_engine_clock
from minengine.engine.bad_words import bad_words_token_ids
from minengine.engine.parallel_sampling import make_children
from minengine.exceptions import VLLMValidationError, show
from minengine.request import Request, RequestGroup
from minengine.sampling_params import SamplingParams
from minengine.timing.wall_clock import Clock
from minengine.value_checks import as_float, check_unicode, token_ids

Prompt = str | dict | list[int]


def _invalid(parameter: str, message: str):
    raise VLLMValidationError(message, parameter=parameter)


def _check_priority(priority: int) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool) or not -2**63 <= priority < 2**63:
        _invalid("priority", f"priority must be an integer in [-2**63, 2**63) (64 bits), got {show(priority)}")


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and (as_float(deadline) is None or deadline != deadline):
        _invalid("deadline", f"deadline must be a number (engine-clock seconds; inf = none) or None, "
                 f"got {show(deadline)}")


def _checked_params(params: SamplingParams | None) -> SamplingParams:
    """``params`` (default ``SamplingParams()``) after ``verify()``."""
    params = params if params is not None else SamplingParams()
    if not isinstance(params, SamplingParams):
        _invalid("sampling_params", f"sampling_params must be a SamplingParams, got {type(params).__name__}")
    params.verify()
    return params


class InputProcessor:
    """Turns prompts into requests for one engine.

    Args:
        config: the engine settings (``max_model_len``, ``block_size``).
        tokenizer: the model's tokenizer, or None (then prompts must be token ids and stop strings are refused).
        vocab_size: token ids must be in ``[0, vocab_size)``.
        eos_token_id: the model's EOS id (a stop token unless ``ignore_eos``), or None.
        num_kv_blocks: the KV pool size in blocks; one request alone must fit in it.
        clock: the engine's clock (seconds); requests arrive at its now unless given an ``arrival_time``.
        request_id_in_use: whether an id belongs to an unfinished request (the engine's queues and outputs).
        custom_logits_processors: the runner's ``CustomLogitsProcessors`` (``worker/logits_processors.py``), whose
            classes validate each request's params, or None.
    """

    def __init__(self, config: EngineConfig, tokenizer, vocab_size: int, eos_token_id: int | None,
                 num_kv_blocks: int, clock: Clock, request_id_in_use: Callable[[str], bool],
                 custom_logits_processors=None):
        self.config = config
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.num_kv_blocks = num_kv_blocks
        self.clock = clock
        self.request_id_in_use = request_id_in_use
        self.custom_logits_processors = custom_logits_processors
        self.structured_output_manager = None  # built with the first structured-output request

    def prompt_to_token_ids(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """A prompt as (text or None, token ids). Accepts a string, ``{"prompt_token_ids": [...]}`` (vLLM's
        TokensPrompt, with an optional ``"prompt"`` string), ``{"prompt": "..."}`` (TextPrompt) or a plain list of
        ids. Token ids may be Python or numpy integers (a 1-D array or tensor is read with ``tolist()``); they
        come back as Python ints.

        Raises:
            VLLMValidationError: (a ``ValueError``) wrong type (a dict's ``"prompt"`` must be a string: prompts do
                not nest), a string prompt without a tokenizer, ids that are not integers or are outside the
                vocabulary.
        """
        if isinstance(prompt, dict):
            text = prompt.get("prompt")
            if text is not None and not isinstance(text, str):  # e.g. {"prompt": {"prompt": ...}}, 5,000 deep
                _invalid("prompt", f"prompt['prompt'] must be a string, got {type(text).__name__}: a prompt dict "
                         "holds its text or its token ids, it does not nest")
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                if isinstance(ids, (str, bytes, dict)) or not hasattr(ids, "__iter__"):
                    _invalid("prompt", f"prompt_token_ids must be a list of token ids, got {type(ids).__name__}")
            elif text is not None:
                return self.prompt_to_token_ids(text)
            else:
                _invalid("prompt", "prompt dict needs 'prompt' or 'prompt_token_ids'")
        elif isinstance(prompt, str):
            if self.tokenizer is None:
                _invalid("prompt", "prompt is a string but the model has no tokenizer: pass "
                         "{'prompt_token_ids': [...]} or EngineConfig(tokenizer=...)")
            check_unicode(prompt, "prompt")
            text, ids = prompt, self.tokenizer(prompt)["input_ids"]
        elif isinstance(prompt, (list, tuple)) or (hasattr(prompt, "tolist") and hasattr(prompt, "__iter__")):
            text, ids = None, prompt
        else:
            _invalid("prompt", f"prompt must be a str, a list of token ids or a dict, got {type(prompt).__name__}")
        ids = token_ids(ids)
        vocab = self.vocab_size
        # the same test for every id as a loop would do, at C speed (prompts of a trace replay are long)
        if ids and (set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) >= vocab):
            _invalid("prompt", f"prompt_token_ids must be integers in [0, {vocab}) (the vocabulary size)")
        return text, ids

    def make_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                     arrival_time: float | None = None, priority: int = 0,
                     deadline: float | None = None) -> Request:
        """Validate a request without adding it (``LLM.generate`` validates a whole batch first).

        Args:
            priority: used by ``scheduling_policy="priority"``; as in vLLM, a smaller value is more urgent.
            deadline: engine-clock time (seconds, the clock of ``arrival_time``) after which the request
                finishes with reason "timeout" and frees its blocks; None = no deadline.

        The request gets its own copy of ``params`` (as vLLM: changing them afterwards has no effect), with
        ``max_tokens`` None or larger than what fits in ``max_model_len`` set to what fits (and ``min_tokens`` cut to
        it). For ``n > 1`` use ``make_requests``.

        Raises:
            VLLMValidationError: (a ``ValueError``) naming the field: ``request_id`` (duplicate), ``prompt``
                (empty, longer than ``max_model_len``, needing more blocks than ``num_kv_blocks``, not valid
                Unicode), ``sampling_params``, ``stop_token_ids`` (beyond the vocabulary), ``priority`` (not a
                64-bit integer), ``deadline`` (not a number a float holds), ``arrival_time`` (not a finite number,
                or later than the engine clock's now; a wall-clock time as vLLM takes, ``time.time()``, is first
                mapped onto the engine clock: ``wall_to_engine_clock``), ``logprobs`` / ``prompt_logprobs`` (more
                than ``max_logprobs``: ``_check_logprobs``), the logits-processing fields
                (``_check_logits_processing``).
        """
        self._check_request_id(request_id)
        _check_priority(priority)
        _check_deadline(deadline)
        params = _checked_params(params)
        if params.n != 1:
            _invalid("n", f"make_request takes n == 1 (got n={params.n}); use make_requests or add_request")
        if params.stop and self.tokenizer is None:
            _invalid("stop", "stop strings need a tokenizer; use stop_token_ids with a model without one")
        text, ids = self.prompt_to_token_ids(prompt)
        self._check_prompt_length(ids)
        params = self._resolved_params(params, len(ids))
        self._check_fits_in_pool(len(ids), params.max_tokens)
        arrival = self._arrival(arrival_time)
        self._check_logprobs(params)
        grammar_state = self._check_logits_processing(params)
        request = Request(request_id=request_id, prompt_token_ids=ids, sampling_params=params, arrival_time=arrival,
                          eos_token_id=self.eos_token_id, prompt=text, priority=priority,
                          deadline=None if deadline is None else float(deadline))
        request.structured_output = grammar_state
        return request

    def _check_request_id(self, request_id: str) -> None:
        if not isinstance(request_id, str) or not request_id:
            _invalid("request_id", f"request_id must be a non-empty string, got {show(request_id)}")
        if self.request_id_in_use(request_id):
            _invalid("request_id", f"request_id {show(request_id)} is already in use by an unfinished request")

    def _check_prompt_length(self, ids: list[int]) -> None:
        if not ids:
            _invalid("prompt", "prompt is empty: it must have at least 1 token")
        if len(ids) > self.config.max_model_len:
            _invalid("prompt", f"prompt has {len(ids)} tokens, more than max_model_len ({self.config.max_model_len})")

    def _resolved_params(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        """The request's own copy of ``params``: ``max_tokens`` bounded by what fits, stop token ids resolved."""
        params = params.clone()
        # None: as many as fit (vLLM); more than fit: clamped, as vLLM's offline LLM stops such a request at
        # max_model_len anyway. Either way max_tokens is then a real bound (no 10**400 reaches the statistics).
        fits = max(1, self.config.max_model_len - prompt_len)
        if params.max_tokens is None or params.max_tokens > fits:
            params.max_tokens = fits
            params.min_tokens = min(params.min_tokens, params.max_tokens)
        if any(t >= self.vocab_size for t in params.stop_token_ids):
            _invalid("stop_token_ids", f"stop_token_ids must be below the vocabulary size ({self.vocab_size}), got "
                     f"{show(params.stop_token_ids)}")
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos and self.eos_token_id is not None:
            stop_ids.add(self.eos_token_id)
        params.all_stop_token_ids = frozenset(stop_ids)
        return params

    def _check_fits_in_pool(self, prompt_len: int, max_tokens: int) -> None:
        """One request alone must always fit in the KV pool at its longest, or it would preempt itself forever."""
        cfg = self.config
        max_len = min(prompt_len + max_tokens, cfg.max_model_len)
        if cdiv(max_len, cfg.block_size) > self.num_kv_blocks:
            _invalid("prompt", f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) needs "
                     f"{cdiv(max_len, cfg.block_size)} KV blocks, more than num_kv_blocks "
                     f"({self.num_kv_blocks}) of {cfg.block_size} tokens")

    def _arrival(self, arrival_time: float | None) -> float:
        """The request's arrival on the engine clock: now, or ``arrival_time`` (``wall_to_engine_clock``)."""
        if arrival_time is not None and (as_float(arrival_time) is None or not math.isfinite(arrival_time)):
            _invalid("arrival_time", f"arrival_time must be a finite number (engine-clock seconds) or None, "
                     f"got {show(arrival_time)}")
        now = self.clock()
        if arrival_time is None:
            return now
        arrival_time = wall_to_engine_clock(float(arrival_time), now)
        if arrival_time > now:
            _invalid("arrival_time", f"arrival_time ({arrival_time}) is later than the engine clock's now ({now}): "
                     "a request cannot arrive in the future (TTFT would be negative)")
        return float(arrival_time)

    def _check_logprobs(self, params: SamplingParams) -> None:
        """vLLM's ``max_logprobs``: ``logprobs`` and ``prompt_logprobs`` at most ``config.max_logprobs`` (-1: no
        cap), and never more than the vocabulary holds (the sampler's top-k could not return them).

        Raises:
            VLLMValidationError: naming the field, the count asked for and the limit (vLLM's wording).
        """
        cap = self.config.max_logprobs
        limit = self.vocab_size if cap == -1 else min(cap, self.vocab_size)
        for name, what in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
            k = getattr(params, name)
            if k is not None and k > limit:
                why = f"max_logprobs={cap}" if limit == cap else f"the vocabulary size, with max_logprobs={cap}"
                _invalid(name, f"{name}: requested {what} logprobs of {k}, which is greater than max allowed: "
                         f"{limit} ({why})")

    def _check_logits_processing(self, params: SamplingParams):
        """Check the logits-processing fields of a request's own ``params`` against the model, fill its
        ``bad_words_token_ids``, let each custom logits processor validate it, and compile its constraint.

        Returns:
            the request's grammar state (``StructuredOutputRequest``), or None without ``structured_outputs``.
        Raises:
            VLLMValidationError: naming the field: ``logit_bias`` / ``allowed_token_ids`` ids outside the vocabulary,
                ``bad_words`` or ``structured_outputs`` without a tokenizer, a constraint xgrammar cannot compile
                (``structured_outputs.json`` ...), ``structured_outputs`` with worker processes, or what a custom
                processor's ``validate_params`` raises.
        """
        vocab = self.vocab_size
        for name, ids in (("logit_bias", params.logit_bias), ("allowed_token_ids", params.allowed_token_ids)):
            bad = sorted({t for t in ids or () if not 0 <= t < vocab})
            if bad:
                _invalid(name, f"{name} has token ids outside the vocabulary [0, {vocab}): {bad[:10]}")
        if params.bad_words:
            params.bad_words_token_ids = bad_words_token_ids(self.tokenizer, params.bad_words, vocab)
        custom = self.custom_logits_processors
        for cls in custom.classes if custom is not None else ():
            cls.validate_params(params)
        if params.structured_outputs is None:
            return None
        from minengine.worker.structured_output import grammar_state  # the door of structured outputs

        return grammar_state(self, params)

    def make_requests(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                      arrival_time: float | None = None, priority: int = 0,
                      deadline: float | None = None) -> RequestGroup:
        """Validate a request of any ``n`` without adding it: for ``n > 1``, its ``n`` child requests
        (ids ``"{index}_{request_id}"``, seeds ``seed + index``; vLLM's parallel sampling). Raises
        ``ValueError`` as ``make_request``."""
        params = _checked_params(params)
        if params.n == 1:
            return RequestGroup(request_id, params, [self.make_request(request_id, prompt, params, arrival_time,
                                                                       priority, deadline)])
        self._check_request_id(request_id)
        return make_children(self.make_request, request_id, prompt, params, arrival_time, priority, deadline)

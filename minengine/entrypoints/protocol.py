"""The OpenAI API's request bodies (pydantic models) and the JSON shapes of its responses and errors.

Fields follow OpenAI's API plus vLLM's extensions (``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``,
``min_tokens``, ``stop_token_ids``, ``include_stop_str_in_output``, ``priority``, ...). Unknown fields are
ignored (as vLLM). Type errors are pydantic's; value ranges are checked by ``SamplingParams``, so both kinds
of bad input become a 400 that names the field. Token ids are strict JSON integers (``true`` is not id 1).
"""

from __future__ import annotations

import time
import uuid
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from minengine.exceptions import VLLMValidationError, show
from minengine.sampling_params import (
    LOGPROBS_BOUND,
    STRUCTURED_OUTPUT_KINDS,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)

MAX_N = 128  # choices per prompt, as OpenAI's API allows (SamplingParams' own limit, 65,536, is the engine's)

# A token id is a JSON integer: strict, so `true` is refused instead of read as id 1 (and 5.0 or "5" as 5).
TokenId = StrictInt


class OpenAIError(Exception):
    """An error to answer with OpenAI's error body. ``param`` names the offending field."""

    def __init__(self, message: str, status_code: int = 400, param: str | None = None,
                 type_: str | None = None):
        super().__init__(message)
        self.message, self.status_code, self.param = message, status_code, param
        self.type = type_ or error_type(status_code)

    def body(self) -> dict:
        return error_body(self.message, self.status_code, self.param, self.type)

    @classmethod
    def of(cls, exc: ValueError, param: str | None = None) -> OpenAIError:
        """A 400 for a validation error: its ``parameter`` (a ``VLLMValidationError``'s), else ``param``, else the
        message's first word (minengine's messages start with the field's name)."""
        message = exc.message if isinstance(exc, VLLMValidationError) else str(exc)
        name = getattr(exc, "parameter", None) or param or message.split(" ", 1)[0].strip(":,")
        return cls(message, param=name)


def error_type(status_code: int) -> str:
    """OpenAI's error ``type`` for a status: "BadRequestError" (400), "NotFoundError" (404), ...; otherwise the
    HTTP reason phrase (as vLLM), "InternalServerError" for 5xx."""
    known = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 413: "RequestTooLargeError",
             503: "ServiceUnavailableError"}
    if status_code in known:
        return known[status_code]
    if status_code >= 500:
        return "InternalServerError"
    try:
        return HTTPStatus(status_code).phrase.replace(" ", "") + "Error"
    except ValueError:
        return "BadRequestError"


def error_body(message: str, code: int, param: str | None = None, type_: str = "BadRequestError") -> dict:
    """OpenAI's error JSON: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingFields(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    # structured outputs: OpenAI's response_format, or vLLM's structured_outputs (not both)
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    use_beam_search: bool = False
    priority: int = 0
    user: str | None = None

    def _check_unsupported(self) -> None:
        if self.best_of is not None and self.best_of != self.n:
            raise OpenAIError("best_of is not supported (vLLM v1 dropped it); use n", param="best_of")
        if self.use_beam_search:
            raise OpenAIError("use_beam_search is not supported", param="use_beam_search")
        if self.stream_options is not None and not self.stream:
            raise OpenAIError("stream_options is only allowed with stream=true", param="stream_options")

    def structured_output_params(self) -> StructuredOutputsParams | None:
        """The request's constraint, from ``response_format`` (OpenAI's: ``{"type": "json_schema",
        "json_schema": {"name", "schema"}}``, ``{"type": "json_object"}``, ``{"type": "structural_tag", ...}`` or
        ``{"type": "text"}``) and/or from vLLM's ``structured_outputs`` (``{"json": ...}``, ``{"regex": ...}``,
        ``{"choice": [...]}``, ``{"grammar": ...}``, ``{"json_object": true}``). As in vLLM the two merge: the
        constraint of ``response_format`` goes into ``structured_outputs``, whose options
        (``disable_any_whitespace`` ...) then apply to it.

        Raises:
            OpenAIError: 400 naming ``response_format`` or ``structured_outputs``: a constraint in both, an
                unknown type, a json_schema without its schema, or a malformed structured_outputs object.
        """
        rf, so = self.response_format, self.structured_outputs
        constraint = self._response_format_constraint(rf)
        if so is not None and not isinstance(so, dict):
            raise OpenAIError(f"structured_outputs must be an object, got {show(so)}", param="structured_outputs")
        if constraint is None:
            if so is None:
                return None
        else:
            given = [k for k in STRUCTURED_OUTPUT_KINDS if (so or {}).get(k) is not None]
            if given:
                raise OpenAIError(f"response_format sets the output's constraint, and structured_outputs sets "
                                  f"{given[0]} too: give one constraint (structured_outputs may add options such "
                                  "as disable_any_whitespace to response_format)", param="response_format")
            so = {**(so or {}), **constraint}
        try:
            return StructuredOutputsParams.from_dict(so)
        except (TypeError, ValueError) as exc:
            raise OpenAIError(str(exc), param="structured_outputs") from exc

    @staticmethod
    def _response_format_constraint(rf: dict | None) -> dict | None:
        """The ``structured_outputs`` field a ``response_format`` sets (None for none or type "text")."""
        kind = "text" if rf is None else rf.get("type", "text")
        if kind == "text":
            return None
        if kind == "json_object":
            return {"json_object": True}
        if kind == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, (dict, bool)):
                raise OpenAIError("response_format json_schema needs json_schema.schema (a JSON schema object)",
                                  param="response_format")
            return {"json": schema if isinstance(schema, dict) else ({} if schema else {"not": {}})}
        if kind == "structural_tag":
            import json

            return {"structural_tag": json.dumps({k: v for k, v in rf.items() if k != "type"})}
        raise OpenAIError(f"response_format type must be 'text', 'json_object', 'json_schema' or 'structural_tag', "
                          f"got {kind!r}", param="response_format")

    def sampling_params(self, max_tokens: int | None, logprobs: int | None,
                        defaults: dict[str, Any]) -> SamplingParams:
        """The ``SamplingParams`` of this request: unset fields take the model's defaults (its
        generation_config), then vLLM's. Streaming requests get DELTA outputs, others FINAL_ONLY.

        Raises:
            OpenAIError: 400 naming the field, for values ``SamplingParams`` rejects.
        """
        self._check_unsupported()
        if self.n > MAX_N:  # before SamplingParams, whose message would name its own, larger limit
            raise OpenAIError(f"n must be <= {MAX_N} (OpenAI's limit), got {show(self.n)}: each choice is a "
                              "request, and adding them all at once would stall every other client", param="n")
        fields = dict(defaults)
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if max_tokens is not None or "max_tokens" not in fields:
            fields["max_tokens"] = max_tokens
        kind = RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY
        structured = self.structured_output_params()
        try:
            return SamplingParams(
                structured_outputs=structured, logit_bias=self.logit_bias, allowed_token_ids=self.allowed_token_ids,
                bad_words=self.bad_words,
                n=self.n, presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
                min_tokens=self.min_tokens, logprobs=logprobs, prompt_logprobs=self.prompt_logprobs,
                skip_special_tokens=self.skip_special_tokens,
                spaces_between_special_tokens=self.spaces_between_special_tokens,
                include_stop_str_in_output=self.include_stop_str_in_output, output_kind=kind, **fields)
        except ValueError as exc:
            raise OpenAIError.of(exc) from exc


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, a list of strings, a list of token ids or a list of
    lists of token ids (a batch); ``logprobs`` is the number of top alternatives (0 .. the server's
    ``--max-logprobs``, 20 by default; more is a 400 naming ``logprobs`` and the limit)."""

    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(default=None, ge=0, le=LOGPROBS_BOUND)
    echo: bool = False
    suffix: str | None = None
    add_special_tokens: bool = True

    def prompts(self) -> list[str | dict]:
        """The batch of prompts, each a string or ``{"prompt_token_ids": [...]}``."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise OpenAIError("prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [{"prompt_token_ids": list(p)}]
        if all(isinstance(x, str) for x in p):
            return list(p)
        if all(isinstance(x, list) for x in p):
            return [{"prompt_token_ids": list(x)} for x in p]
        raise OpenAIError("prompt must be a string, a list of strings or (lists of) token ids", param="prompt")


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``: ``messages`` through the model's chat template; ``logprobs`` is a bool
    and ``top_logprobs`` the number of alternatives (at most ``--max-logprobs``); ``max_completion_tokens`` (or
    the older ``max_tokens``) defaults to what fits in ``max_model_len``."""

    messages: list[dict[str, Any]]
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=LOGPROBS_BOUND)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    echo: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None

    def check_supported(self) -> None:
        if self.tools:
            raise OpenAIError("tools are not supported", param="tools")
        if self.top_logprobs is not None and not self.logprobs:
            raise OpenAIError("top_logprobs needs logprobs=true", param="top_logprobs")

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: a ``prompt``, or chat ``messages`` (through the chat template)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids back to text."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[TokenId]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def now() -> int:
    return int(time.time())


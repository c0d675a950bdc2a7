"""The OpenAI-compatible HTTP server (FastAPI): vLLM's routes around one ``AsyncLLMEngine``.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON, or server-sent events with
``"stream": true``, ending in ``data: [DONE]``), ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``,
``GET|POST /ping``, ``GET /version``, ``GET /metrics`` (Prometheus text, vLLM's series names), ``POST /tokenize``,
``POST /detokenize``, ``GET /tokenizer_info`` (with ``enable_tokenizer_info_endpoint``, as vLLM),
``POST /reset_prefix_cache``, and minengine's ``GET /v1/engine/steps``: every ``StepTrace`` as it happens
(server-sent events), the feed the dashboard's live mode draws. With ``api_keys`` every route but ``GET /health``,
``/ping`` and ``/version`` needs ``Authorization: Bearer <key>`` (``entrypoints/auth.py``).

Handlers never touch the engine: they enqueue work for the engine loop and await it, and tokenize in a thread
of their own (``AsyncTokenizer``), so the event loop only moves bytes. A client that disconnects (mid-stream or
while waiting for a non-streamed answer) aborts its requests, every prompt's and every choice's; the abort is
applied before the engine's next step, so their KV blocks are free by then. One request whose step fails in the
engine fails alone (its stream ends with an error chunk); the others go on.

Bad input is answered with OpenAI's error JSON before it costs anything: a body over the byte limit (413), or
not in within ``--request-body-timeout`` (408, connection closed: ``body_timeout.py``), a prompt longer than
``max_model_len`` (400, found after tokenizing a bounded part of it: ``tokenize_within.py``),
invalid UTF-8 or JSON, nesting too deep, a bad field (400 naming it), more work than one call may ask for
(prompts x n, 400), an explicit ``max_tokens`` beyond what fits in ``max_model_len`` (400, as vLLM), an unknown
model or route (404); never a 500. The limits are ``FrontendArgs`` (``minengine serve`` flags), and so is the
graceful stop: SIGTERM waits ``--shutdown-timeout`` seconds for the streams in flight, then ends them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

import minengine
from minengine.engine.generation_config import default_sampling_overrides
from minengine.entrypoints.async_engine import AsyncLLMEngine, EngineDeadError, EngineDrainingError, RequestStream
from minengine.entrypoints.async_tokenizer import AsyncTokenizer
from minengine.entrypoints.auth import APIKeyMiddleware
from minengine.entrypoints.body_timeout import BodyTimeoutMiddleware
from minengine.entrypoints.chat_utils import load_chat_template, normalize_messages
from minengine.entrypoints.cli_args import FrontendArgs
from minengine.entrypoints.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    OpenAIError,
    TokenizeRequest,
    error_body,
    error_type,
    now,
    random_id,
    usage,
)
from minengine.entrypoints.request_body import read_body
from minengine.exceptions import VLLMValidationError, show
from minengine.outputs import CompletionOutput, PositionLogprobs, RequestOutput
from minengine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
KEEPALIVE_S = 15.0  # an idle SSE feed sends a comment this often, so a gone client is noticed


def sse(data: dict | str, event: str | None = None) -> str:
    """One server-sent event: ``event: <name>`` (optional) and ``data: <json>``, then a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


def _token_str(lp, token_id: int) -> str:
    return lp.decoded_token if lp.decoded_token is not None else f"token_id:{token_id}"


def _top(position: PositionLogprobs, k: int) -> list[tuple[int, object]]:
    """The k most likely entries of a position (by rank)."""
    return sorted(position.items(), key=lambda kv: kv[1].rank or 0)[:k]


MIN_LOGPROB = -9999.0  # OpenAI's stand-in for -inf (JSON has no infinity), as vLLM clamps


def completion_logprobs(positions: list[PositionLogprobs | None], token_ids: list[int], k: int, offset: int,
                        unscored: dict[int, str] | None = None) -> dict:
    """The legacy completions ``logprobs`` object (vLLM's ``_create_completion_logprobs``): per token its text,
    its logprob and ``top_logprobs``, the position's first ``k + 1`` entries (the token itself, then the most
    likely ones: OpenAI's "up to logprobs + 1"); ``offset`` is the text length already sent. A position without
    logprobs (``None``: a prompt's first token) has a null logprob and null alternatives; its text comes from
    ``unscored`` (token id -> text; ``token_id:N`` when absent)."""
    out = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for tid, pos in zip(token_ids, positions):
        if pos is None:
            token = (unscored or {}).get(tid, f"token_id:{tid}")
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
        else:
            token = _token_str(pos[tid], tid)
            out["token_logprobs"].append(max(pos[tid].logprob, MIN_LOGPROB))
            out["top_logprobs"].append({_token_str(v, t): max(v.logprob, MIN_LOGPROB)
                                        for i, (t, v) in enumerate(pos.items()) if i <= k})
        out["text_offset"].append(offset)
        out["tokens"].append(token)
        offset += len(token)
    return out


def echoed(out: RequestOutput, c: CompletionOutput, echo_only: bool) -> tuple[str, list[int], list | None]:
    """A completion choice with ``echo`` (vLLM's): its text, token ids and logprob positions over the prompt
    followed by the output (``echo_only``, from ``max_tokens: 0``: the prompt alone). Positions are None
    unless the request asked for logprobs (then the prompt's come from its ``prompt_logprobs``)."""
    prompt_positions = out.prompt_logprobs or []
    if echo_only:
        return out.prompt or "", list(out.prompt_token_ids), (list(prompt_positions) if c.logprobs is not None
                                                               else None)
    positions = None if c.logprobs is None else [*prompt_positions, *c.logprobs]
    return (out.prompt or "") + c.text, [*out.prompt_token_ids, *c.token_ids], positions


def chat_logprobs(positions: list[PositionLogprobs], token_ids: list[int], k: int) -> dict:
    """The chat ``logprobs`` object: ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}``."""
    def entry(t: int, lp) -> dict:
        s = _token_str(lp, t)
        return {"token": s, "logprob": lp.logprob, "bytes": list(s.encode("utf-8"))}

    return {"content": [{**entry(tid, pos[tid]), "top_logprobs": [entry(t, v) for t, v in _top(pos, k)]}
                        for tid, pos in zip(token_ids, positions)]}


def prompt_logprobs_json(out: RequestOutput) -> list | None:
    if out.prompt_logprobs is None:
        return None
    return [None if p is None else {str(t): {"logprob": v.logprob, "rank": v.rank, "decoded_token": v.decoded_token}
                                    for t, v in p.items()} for p in out.prompt_logprobs]


def stream_error_body(exc: BaseException) -> dict:
    """The error chunk of a stream that cannot go on: 503 when the server is shutting down (or its engine loop
    stopped), else 500 (this request failed in the engine)."""
    code = 503 if isinstance(exc, EngineDeadError) else 500
    return error_body(str(exc), code, type_=error_type(code))


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from several request streams as they come, until all finish."""
    if len(streams) == 1:
        while True:
            out = await streams[0].get()
            yield 0, out
            if out.finished:
                return
    pending = {asyncio.ensure_future(s.get()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                out = task.result()
                yield i, out
                if not out.finished:
                    pending[asyncio.ensure_future(streams[i].get())] = i
    finally:
        for task in pending:
            task.cancel()


async def until_disconnected(raw: Request, work: Awaitable):
    """Await ``work``; if the client disconnects first, cancel it (its requests are aborted) and return None."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while True:
            message = await raw.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        try:
            await task
        except BaseException:
            pass
        return None
    return task.result()


class OpenAIServing:
    """The handlers' logic over one ``AsyncLLMEngine``.

    Args:
        engine: the async engine (its loop owns the ``LLMEngine``).
        frontend: the server's settings and limits (``FrontendArgs``: its ``chat_template`` is used for requests
            that give none, None = the tokenizer's own); None = the defaults.
        generation_config: vLLM's ``--generation-config``: "auto" takes unset sampling fields from the
            checkpoint's generation_config.json; "vllm" uses ``SamplingParams()``'s defaults.
    """

    def __init__(self, engine: AsyncLLMEngine, frontend: FrontendArgs | None = None,
                 generation_config: str = "auto"):
        self.engine = engine
        self.frontend = frontend or FrontendArgs()
        self.chat_template = load_chat_template(self.frontend.chat_template)  # a file's text, or the template
        e = engine.engine
        self.model_name = e.config.served_model_name
        self.max_model_len = e.config.max_model_len
        self.vocab_size = e.hf_config.vocab_size
        self.scheduling_policy = e.config.scheduling_policy
        self.defaults = {} if generation_config == "vllm" else default_sampling_overrides(e.model_path)
        self.tokenizer = AsyncTokenizer(e.tokenizer)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise OpenAIError(f"The model `{model}` does not exist.", 404, "model")

    def check_work(self, num_prompts: int, params: SamplingParams, priority: int) -> None:
        """What a call may ask for before anything of it is tokenized: prompts x ``n``
        (``FrontendArgs.max_requests_per_call``; ``n`` alone was held to OpenAI's 128 by ``sampling_params``),
        and a priority only where the scheduler honours it.

        Raises:
            OpenAIError: 400 naming the field.
        """
        if priority != 0 and self.scheduling_policy != "priority":
            # vLLM rejects it too: a priority the scheduler ignores would be a silent lie to the client
            raise OpenAIError(f"priority {show(priority)} is set but the server's scheduling_policy is "
                              f"{self.scheduling_policy!r} (start it with --scheduling-policy priority)",
                              param="priority")
        limit = self.frontend.max_requests_per_call
        if num_prompts * params.n > limit:
            raise OpenAIError(f"this call asks for {num_prompts} prompts x n={params.n} = {num_prompts * params.n} "
                              f"requests, more than the server's limit of {limit} per call "
                              "(--max-requests-per-call): send fewer prompts or a smaller n",
                              param="n" if params.n > 1 else "prompt")

    def check_lengths(self, ids: list[int], max_tokens: int | None) -> None:
        """A prompt's length against ``max_model_len``, and an explicit ``max_tokens`` against what is left (vLLM's
        400, with vLLM's message; a default ``max_tokens`` is cut to fit instead, as vLLM's ``get_max_tokens``).

        Raises:
            OpenAIError: 400 naming ``prompt`` or ``max_tokens``.
        """
        n, limit = len(ids), self.max_model_len
        if n > limit:
            raise OpenAIError(f"prompt has {n} tokens, more than this model's maximum context length of {limit} "
                              "tokens (max_model_len): please reduce the length of the input", param="prompt")
        if max_tokens is not None and isinstance(max_tokens, int) and n + max_tokens > limit:
            raise OpenAIError(f"'max_tokens' or 'max_completion_tokens' is too large: {show(max_tokens)}. This "
                              f"model's maximum context length is {limit} tokens and your request has {n} input "
                              f"tokens ({show(max_tokens)} > {limit} - {n}).", param="max_tokens")

    async def tokenize_prompt(self, prompt: str | dict, add_special_tokens: bool) -> dict:
        """A completion prompt as ``{"prompt_token_ids", "prompt"}``: a string tokenized in the tokenizer thread,
        token ids as given (the engine checks them against the vocabulary).

        Raises:
            OpenAIError: 400 for a string prompt the tokenizer cannot take (no tokenizer, not valid Unicode), or
                longer than ``max_model_len`` (found after tokenizing a bounded part of it: ``tokenize_within``).
        """
        if not isinstance(prompt, str):
            return prompt
        try:
            ids = await self.tokenizer.encode(prompt, add_special_tokens, limit=self.max_model_len)
            return {"prompt_token_ids": ids, "prompt": prompt}
        except ValueError as exc:
            raise OpenAIError.of(exc, param="prompt") from exc

    async def add_requests(self, base_id: str, prompts: list, params: SamplingParams,
                           priority: int, from_response_format: bool = False,
                           logprobs_field: str = "logprobs") -> list[RequestStream]:
        """Queue one request per prompt (ids ``base_id-i``), all or none (``from_response_format``: the
        constraint came as ``response_format``, so an error in it names that field; ``logprobs_field``: the
        request's name for ``SamplingParams.logprobs``, chat's ``top_logprobs``).

        Raises:
            OpenAIError: 400 naming the field, for what the engine rejects; 503 while the server shuts down.
        """
        try:
            return await self.engine.add_requests([(f"{base_id}-{i}", p, params) for i, p in enumerate(prompts)],
                                                  priority=priority)
        except EngineDrainingError as exc:
            raise OpenAIError(str(exc), 503) from exc
        except (ValueError, TypeError) as exc:
            error = OpenAIError.of(exc)
            if error.param and error.param.startswith("prompt") and error.param != "prompt_logprobs":
                error.param = "prompt"
            elif error.param and error.param.startswith("structured_outputs") and from_response_format:
                error.param = "response_format"  # the constraint the client sent as response_format
            elif error.param == "logprobs":
                error.param = logprobs_field
            raise error from exc

    @staticmethod
    def abort_unfinished(engine: AsyncLLMEngine, streams: list[RequestStream]) -> None:
        for s in streams:
            if not s.finished:
                engine.abort_nowait(s.request_id)

    # ---- /v1/completions -----------------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, raw: Request):
        self.check_model(body.model)
        # vLLM's echo: the prompt's logprobs (k = logprobs, unless prompt_logprobs says) come before the output's,
        # and max_tokens 0 scores the prompt alone (one token is generated and not returned): lm-eval's
        # loglikelihood requests
        echo_only = body.echo and body.max_tokens == 0
        if body.echo and body.logprobs is not None and body.prompt_logprobs is None:
            body = body.model_copy(update={"prompt_logprobs": body.logprobs})
        params = body.sampling_params(1 if echo_only else body.max_tokens, body.logprobs, self.defaults)
        if body.suffix:
            raise OpenAIError("suffix is not supported", param="suffix")
        prompts = body.prompts()
        self.check_work(len(prompts), params, body.priority)
        prompts = [await self.tokenize_prompt(p, body.add_special_tokens) for p in prompts]
        explicit = body.max_tokens if "max_tokens" in body.model_fields_set else None
        for p in prompts:
            self.check_lengths(p["prompt_token_ids"], explicit)
        if body.echo:  # a prompt of token ids is echoed as its text (vLLM decodes it); bad ids fail later
            prompts = [await self._with_prompt_text(p) for p in prompts]
        request_id, created = random_id("cmpl"), now()
        streams = await self.add_requests(request_id, prompts, params, body.priority,
                                          body.response_format is not None)
        head = {"id": request_id, "object": "text_completion", "created": created, "model": self.model_name}
        k = body.logprobs
        if body.stream:
            return StreamingResponse(self._completion_stream(head, streams, body, k, echo_only),
                                     media_type="text/event-stream")
        outs = await until_disconnected(raw, self._collect(streams))
        if outs is None:
            return Response(status_code=499)
        unscored = await self._unscored_tokens(outs) if body.echo and k is not None else None
        choices, completion_tokens = [], 0
        for i, out in enumerate(outs):
            for c in out.outputs:
                completion_tokens += len(c.token_ids)  # with max_tokens 0 too: the token was computed (vLLM)
                text, token_ids, positions = echoed(out, c, echo_only) if body.echo else (c.text, c.token_ids,
                                                                                           c.logprobs)
                choices.append({"index": i * params.n + c.index, "text": text,
                                "logprobs": completion_logprobs(positions, token_ids, k, 0, unscored)
                                if k is not None else None, "finish_reason": c.finish_reason,
                                "stop_reason": c.stop_reason, "prompt_logprobs": prompt_logprobs_json(out)})
        prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
        return {**head, "choices": choices, "usage": usage(prompt_tokens, completion_tokens)}

    async def _unscored_tokens(self, outs: list[RequestOutput]) -> dict[int, str]:
        """The text of each prompt's first token (its position has no logprobs to take it from)."""
        first = sorted({o.prompt_token_ids[0] for o in outs if o.prompt_token_ids})
        if self.tokenizer.tokenizer is None:
            return {t: f"token_id:{t}" for t in first}
        return {t: await self.tokenizer.decode([t]) for t in first}

    async def _with_prompt_text(self, prompt: dict) -> dict:
        """A ``{"prompt_token_ids"}`` prompt with its decoded text as ``prompt`` (for ``echo``); others as given."""
        ids = prompt["prompt_token_ids"]
        if "prompt" in prompt or self.tokenizer.tokenizer is None \
                or not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in ids):
            return prompt  # the engine rejects bad ids with the field named
        return {**prompt, "prompt": await self.tokenizer.decode(ids)}

    async def _collect(self, streams: list[RequestStream]) -> list[RequestOutput]:
        final: dict[int, RequestOutput] = {}
        try:
            async for i, out in merge_streams(streams):
                if out.finished:
                    final[i] = out
        finally:
            self.abort_unfinished(self.engine, streams)
        return [final[i] for i in range(len(streams))]

    async def _completion_stream(self, head: dict, streams: list[RequestStream], body: CompletionRequest,
                                 k: int | None, echo_only: bool = False) -> AsyncIterator[str]:
        n, opts = body.n, body.stream_options
        # continuous usage stats, as vLLM: each chunk counts its own prompt and its own choice's tokens so far;
        # the final usage chunk sums them all
        prompt_tokens, completion_tokens, sent_text = {}, {}, {}
        try:
            async for i, out in merge_streams(streams):
                prompt_tokens[i] = len(out.prompt_token_ids)
                for c in out.outputs:
                    index = i * n + c.index
                    completion_tokens[index] = completion_tokens.get(index, 0) + len(c.token_ids)
                    text, token_ids, positions, unscored = c.text, c.token_ids, c.logprobs, None
                    if body.echo and index not in sent_text:  # the first chunk of a choice carries the prompt
                        text, token_ids, positions = echoed(out, c, echo_only)
                        if k is not None:
                            unscored = await self._unscored_tokens([out])
                    elif echo_only:  # max_tokens 0: the one generated token is not returned
                        text, token_ids, positions = "", [], [] if positions is not None else None
                    offset = sent_text.get(index, 0)
                    sent_text[index] = offset + len(text)
                    if not text and not token_ids and c.finish_reason is None:
                        continue
                    chunk = {**head, "choices": [{
                        "index": index, "text": text,
                        "logprobs": completion_logprobs(positions, token_ids, k, offset, unscored) if k is not None
                        else None, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}]}
                    if opts is not None and opts.include_usage and opts.continuous_usage_stats:
                        chunk["usage"] = usage(prompt_tokens[i], completion_tokens[index])
                    yield sse(chunk)
            if opts is not None and opts.include_usage:
                yield sse({**head, "choices": [], "usage": usage(sum(prompt_tokens.values()),
                                                                 sum(completion_tokens.values()))})
        except Exception as exc:  # this request failed, or the engine, or the server is stopping: say it in-band
            logger.error("completion stream %s failed: %r", head["id"], exc)
            yield sse(stream_error_body(exc))
        finally:
            self.abort_unfinished(self.engine, streams)
        yield "data: [DONE]\n\n"

    # ---- /v1/chat/completions ------------------------------------------------------------------------
    async def chat_completions(self, body: ChatCompletionRequest, raw: Request):
        self.check_model(body.model)
        body.check_supported()
        k = body.num_logprobs
        params = body.sampling_params(body.max_new_tokens, k, self.defaults)
        self.check_work(1, params, body.priority)
        try:
            text, ids = await self.tokenizer.render_chat(
                body.messages, body.chat_template or self.chat_template, body.add_generation_prompt,
                body.continue_final_message, body.chat_template_kwargs, limit=self.max_model_len)
        except ValueError as exc:
            message = exc.message if isinstance(exc, VLLMValidationError) else str(exc)
            raise OpenAIError(message, param="messages" if message.startswith("messages") else "chat_template") \
                from exc
        explicit = {"max_tokens", "max_completion_tokens"} & body.model_fields_set
        self.check_lengths(ids, body.max_new_tokens if explicit else None)
        # vLLM's response role: the assistant's, or (no generation prompt) the last message's, continued
        last = normalize_messages(body.messages)[-1]  # render_chat accepted them: this cannot raise
        role = "assistant" if body.add_generation_prompt else last["role"]
        # vLLM's chat echo: a choice starts with the last message's content when it is the same role's
        echo = last["content"] if body.echo and last["role"] == role else ""
        request_id, created = random_id("chatcmpl"), now()
        streams = await self.add_requests(request_id, [{"prompt_token_ids": ids, "prompt": text}], params,
                                          body.priority, body.response_format is not None, "top_logprobs")
        head = {"id": request_id, "created": created, "model": self.model_name}
        if body.stream:
            return StreamingResponse(self._chat_stream(head, streams[0], body, k, len(ids), role, echo),
                                     media_type="text/event-stream")
        outs = await until_disconnected(raw, self._collect(streams))
        if outs is None:
            return Response(status_code=499)
        out = outs[0]
        choices = [{"index": c.index, "message": {"role": role, "content": echo + c.text},
                    "logprobs": chat_logprobs(c.logprobs, c.token_ids, k) if k is not None else None,
                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason} for c in out.outputs]
        return {**head, "object": "chat.completion", "choices": choices,
                "usage": usage(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs)),
                "prompt_logprobs": prompt_logprobs_json(out)}

    async def _chat_stream(self, head: dict, stream: RequestStream, body: ChatCompletionRequest, k: int | None,
                           prompt_tokens: int, role: str, echo: str) -> AsyncIterator[str]:
        """The chat stream: a ``role`` chunk per choice, then (if ``echo`` is not empty) an ``echo`` content chunk
        per choice, then the generated deltas. Continuous usage stats, as vLLM: every chunk carries
        ``prompt_tokens`` (the rendered prompt's length) and its own choice's completion tokens so far."""
        head = {**head, "object": "chat.completion.chunk"}
        opts = body.stream_options
        completion_tokens = [0] * body.n  # per choice

        def chunk(index: int, delta: dict, c: CompletionOutput | None = None) -> str:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            if c is not None:
                choice.update(finish_reason=c.finish_reason, stop_reason=c.stop_reason)
                if k is not None:
                    choice["logprobs"] = chat_logprobs(c.logprobs, c.token_ids, k)
            data = {**head, "choices": [choice]}
            if opts is not None and opts.include_usage and opts.continuous_usage_stats:
                data["usage"] = usage(prompt_tokens, completion_tokens[index])
            return sse(data)

        try:
            for index in range(body.n):
                yield chunk(index, {"role": role, "content": ""})
            if echo:
                for index in range(body.n):
                    yield chunk(index, {"content": echo})
            async for _, out in merge_streams([stream]):
                for c in out.outputs:
                    completion_tokens[c.index] += len(c.token_ids)
                    if not c.text and not c.token_ids and c.finish_reason is None:
                        continue
                    yield chunk(c.index, {"content": c.text} if c.text else {}, c)
            if opts is not None and opts.include_usage:
                yield sse({**head, "choices": [], "usage": usage(prompt_tokens, sum(completion_tokens))})
        except Exception as exc:
            logger.error("chat stream %s failed: %r", head["id"], exc)
            yield sse(stream_error_body(exc))
        finally:
            self.abort_unfinished(self.engine, [stream])
        yield "data: [DONE]\n\n"

    # ---- tokenizer routes ----------------------------------------------------------------------------
    async def tokenize(self, body: TokenizeRequest) -> dict:
        self.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise OpenAIError("give exactly one of prompt and messages", param="prompt")
        if self.tokenizer.tokenizer is None:
            raise OpenAIError("this model has no tokenizer", param="prompt")
        try:
            if body.messages is not None:
                _, ids = await self.tokenizer.render_chat(body.messages, body.chat_template or self.chat_template,
                                                          body.add_generation_prompt, body.continue_final_message,
                                                          limit=self.max_model_len)
            else:
                special = True if body.add_special_tokens is None else body.add_special_tokens
                ids = await self.tokenizer.encode(body.prompt, special, limit=self.max_model_len)
        except ValueError as exc:
            raise OpenAIError.of(exc, param="messages" if body.messages is not None else "prompt") from exc
        strs = await self.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}

    async def detokenize(self, body: DetokenizeRequest) -> dict:
        self.check_model(body.model)
        if self.tokenizer.tokenizer is None:
            raise OpenAIError("this model has no tokenizer", param="tokens")
        if any(not 0 <= t < self.vocab_size for t in body.tokens):
            raise OpenAIError(f"tokens must be integers in [0, {self.vocab_size}) (the vocabulary size)",
                              param="tokens")
        return {"prompt": await self.tokenizer.decode(body.tokens)}

    async def tokenizer_info(self) -> dict:
        """vLLM's ``GET /tokenizer_info``: the tokenizer's settings (its ``init_kwargs``, tokenizer_config.json's
        keys, without the vocabulary files' paths; special tokens as their text), ``tokenizer_class``, and the
        server's ``chat_template`` when one was given. lm-eval reads ``eos_token`` (and the template) from it."""
        def run(e) -> dict:
            if e.tokenizer is None:
                raise OpenAIError("this model has no tokenizer", 404, type_="NotFoundError")
            info = {k: _json_value(v) for k, v in (getattr(e.tokenizer, "init_kwargs", None) or {}).items()
                    if k not in ("vocab_file", "merges_file")}
            info["tokenizer_class"] = type(e.tokenizer).__name__
            if self.chat_template:
                info["chat_template"] = self.chat_template
            return info

        return await self.engine.call(run)

    def model_card(self) -> dict:
        """The served model as ``/v1/models`` lists it (vLLM's ``ModelCard``)."""
        return {"id": self.model_name, "object": "model", "created": int(self.engine.started_unix_time),
                "owned_by": "minengine", "root": str(self.engine.engine.model_path), "parent": None,
                "max_model_len": self.max_model_len}

    # ---- the step feed -------------------------------------------------------------------------------
    async def engine_info(self) -> dict:
        def run(e) -> dict:
            c = e.config
            # the served name only: the checkpoint's path on the server's disk is none of a client's business
            return {"model": c.served_model_name, "block_size": c.block_size,
                    "num_kv_blocks": e.num_kv_blocks, "num_swap_blocks": e.num_swap_blocks,
                    "max_num_batched_tokens": c.max_num_batched_tokens, "max_num_seqs": c.max_num_seqs,
                    "max_model_len": c.max_model_len, "enable_chunked_prefill": c.enable_chunked_prefill,
                    "enable_prefix_caching": c.enable_prefix_caching, "scheduling_policy": c.scheduling_policy,
                    "preemption_mode": c.preemption_mode, "trace_block_tables": c.trace_block_tables,
                    "num_steps": e.num_steps, "clock": e.clock.label, "clock_now": e.clock(),
                    "unix_time": time.time()}

        return await self.engine.call(run)

    async def step_feed(self, raw: Request, history: int, block_tables: bool) -> AsyncIterator[str]:
        sub = self.engine.subscribe_steps()
        try:
            info = await self.engine_info()
            past = await self.engine.call(lambda e: list(e.traces[-history:]) if history > 0 else [])
            # how many steps the replay sends, so a client can tell when it has the whole history
            yield sse({**info, "history_steps": len(past)}, event="engine")
            last = None
            for trace in past:
                last = trace.step
                yield sse(self._trace_json(trace, block_tables, sub.num_dropped), event="step")
                # Sending never suspends while the socket takes it, so without this a replay of thousands of
                # steps would hold the event loop and go on writing to a client that left (Starlette cancels
                # the stream on disconnect only at a suspension point).
                await asyncio.sleep(0)
            while True:
                trace = await sub.get(timeout=KEEPALIVE_S)
                if sub.closed:  # the server is shutting down
                    return
                if trace is None:
                    yield ": keep-alive\n\n"
                    continue
                if last is not None and trace.step <= last:
                    continue  # already sent as history
                yield sse(self._trace_json(trace, block_tables, sub.num_dropped), event="step")
                await asyncio.sleep(0)  # a backlog of queued steps: the same
        finally:
            self.engine.unsubscribe_steps(sub)

    @staticmethod
    def _trace_json(trace, block_tables: bool, num_dropped: int) -> dict:
        d = trace.to_dict()
        if not block_tables:
            d["block_tables"] = d["block_ref_counts"] = d["cached_block_ids"] = None
            d["windowed_block_tables"] = d["windowed_block_ref_counts"] = None  # (two KV cache groups)
        d["duration"] = trace.duration
        d["num_dropped"] = num_dropped
        return d


def _json_value(value):
    """A tokenizer setting as JSON: special tokens (``AddedToken``) as their text, containers element-wise."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def build_app(engine: AsyncLLMEngine, frontend: FrontendArgs | None = None, *,
              generation_config: str = "auto") -> FastAPI:
    """The FastAPI app serving ``engine`` (its loop starts with the app and stops with it). Every 4xx and 5xx is
    answered with OpenAI's error body.

    Args:
        engine: the async engine. frontend: the server's settings (``FrontendArgs``; None = the defaults): its
            ``api_key`` (vLLM's ``--api-key``: when given, every route but the liveness probes needs one of them
            as a bearer token, 401 otherwise: ``auth.py``), ``chat_template``, ``enable_tokenizer_info_endpoint``
            (serve ``GET /tokenizer_info``, off by default as in vLLM: it shows the tokenizer's configuration and
            paths) and the limits (``request_body_timeout`` among them: ``body_timeout.py``).
        generation_config: as ``OpenAIServing``.
    """
    serving = OpenAIServing(engine, frontend, generation_config)
    api_keys = serving.frontend.api_key

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield
        await engine.shutdown_async()
        serving.tokenizer.shutdown()

    app = FastAPI(title="minengine", version=minengine.__version__, lifespan=lifespan)
    limit = serving.frontend.max_request_body_bytes
    app.state.serving = serving

    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, exc: OpenAIError):
        return JSONResponse(exc.body(), status_code=exc.status_code)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException):  # unknown route, wrong method
        return JSONResponse(error_body(str(exc.detail), exc.status_code, type_=error_type(exc.status_code)),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):  # query parameters (the step feed)
        errors = exc.errors()
        message = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in errors[:5])
        loc = errors[0].get("loc", ()) if errors else ()
        param = loc[-1] if loc and isinstance(loc[-1], str) else None  # ("query", "history") -> "history"
        return JSONResponse(error_body(message or "invalid request", 400, param), status_code=400)

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_: Request, exc: EngineDeadError):  # shutting down, or the engine loop is gone
        return JSONResponse(error_body(str(exc), 503, type_=error_type(503)), status_code=503)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception):
        logger.exception("unhandled error")
        return JSONResponse(error_body(f"internal error: {exc}", 500, type_="InternalServerError"), status_code=500)

    @app.get("/health")
    async def health():
        try:
            await engine.check_health()
        except Exception as exc:
            return JSONResponse(error_body(str(exc), 503, type_="ServiceUnavailable"), status_code=503)
        return Response(status_code=200)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping():
        """vLLM's (SageMaker's) liveness probe: the same answer as ``/health``."""
        return await health()

    @app.get("/version")
    async def version():
        return {"version": minengine.__version__}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [serving.model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        """OpenAI's "retrieve model": the served model's card, 404 for any other id."""
        serving.check_model(model_id)
        return serving.model_card()

    if serving.frontend.enable_tokenizer_info_endpoint:
        @app.get("/tokenizer_info")
        async def tokenizer_info():
            return await serving.tokenizer_info()

    @app.get("/metrics")
    async def metrics():
        return Response(engine.engine.stat_logger.render(), media_type=CONTENT_TYPE_LATEST)

    # The JSON routes read their bodies themselves (request_body.read_body): byte limit, UTF-8, JSON and nesting
    # errors become OpenAI 400s, and a large body is parsed off the event loop.
    @app.post("/v1/completions")
    async def completions(raw: Request):
        return await serving.completions(await read_body(raw, CompletionRequest, limit), raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request):
        return await serving.chat_completions(await read_body(raw, ChatCompletionRequest, limit), raw)

    @app.post("/tokenize")
    async def tokenize(raw: Request):
        return await serving.tokenize(await read_body(raw, TokenizeRequest, limit))

    @app.post("/detokenize")
    async def detokenize(raw: Request):
        return await serving.detokenize(await read_body(raw, DetokenizeRequest, limit))

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        return {"reset": await engine.reset_prefix_cache()}

    @app.get("/v1/engine/steps")
    async def engine_steps(raw: Request, history: int = 0, block_tables: bool = True):
        if history < 0:
            raise OpenAIError("history must be >= 0 (steps to replay first)", param="history")
        return StreamingResponse(serving.step_feed(raw, history, block_tables), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    if api_keys:
        app.add_middleware(APIKeyMiddleware, keys=list(api_keys))
    # added last, so outermost: a body that never arrives is cut off whatever the route, and the 401 above too
    app.add_middleware(BodyTimeoutMiddleware, timeout_s=serving.frontend.request_body_timeout)
    return app


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose shutdown (SIGTERM, Ctrl-C, ``should_exit``) first drains the engine: uvicorn stops
    accepting connections and waits for the open ones, and ``AsyncLLMEngine.drain`` ends the streams still
    running after ``shutdown_timeout`` seconds with an error chunk, so those connections close and the process
    exits. uvicorn's own graceful timeout (a few seconds later) is the backstop."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLMEngine, shutdown_timeout: float):
        super().__init__(config)
        self.engine, self.shutdown_timeout = engine, shutdown_timeout

    async def shutdown(self, sockets=None) -> None:
        logger.info("shutting down: draining the requests in flight for up to %g s", self.shutdown_timeout)
        drain = asyncio.ensure_future(self.engine.drain(self.shutdown_timeout))
        await super().shutdown(sockets)
        if drain.done() and not drain.cancelled() and drain.exception() is None and drain.result():
            logger.warning("ended %d requests still running after the %g s drain", drain.result(),
                           self.shutdown_timeout)


def make_server(engine: AsyncLLMEngine, frontend: FrontendArgs | None = None, *, generation_config: str = "auto",
                **uvicorn_kwargs):
    """A uvicorn server for ``build_app(engine, frontend, generation_config=...)`` that drains on shutdown
    (``FrontendArgs.shutdown_timeout``); ``uvicorn_kwargs`` go to ``uvicorn.Config`` (host, port, log_level, ...)."""
    frontend = frontend or FrontendArgs()
    config = uvicorn.Config(build_app(engine, frontend, generation_config=generation_config), lifespan="on",
                            timeout_graceful_shutdown=math.ceil(frontend.shutdown_timeout) + 5, **uvicorn_kwargs)
    return DrainingServer(config, engine, frontend.shutdown_timeout)


def run_server(engine: AsyncLLMEngine, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
               frontend: FrontendArgs | None = None, generation_config: str = "auto") -> None:
    """Serve ``engine`` with uvicorn until interrupted (SIGTERM / Ctrl-C drain it first: ``FrontendArgs``)."""
    make_server(engine, frontend, generation_config=generation_config, host=host, port=port,
                log_level=log_level).run()

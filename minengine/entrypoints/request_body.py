"""Reading a request's JSON body into its pydantic model, with an OpenAI error for everything that can be wrong.

In order: the byte limit (``FrontendArgs.max_request_body_bytes``: 413, from the ``Content-Length`` header
before anything is read, else as soon as the bytes received pass it), UTF-8 (400 naming the byte), JSON syntax
(400 with line and column), nesting (Python's JSON parser recurses: a body nested deeper than about 1,000 levels
is a 400, not a ``RecursionError``), a JSON object at the top, then the model's fields (400 naming the first bad
field). A large body is decoded and parsed in a worker thread, so the event loop keeps answering other clients
(``/health``) meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from minengine.entrypoints.protocol import OpenAIError

Model = TypeVar("Model", bound=BaseModel)
THREAD_ABOVE_BYTES = 256 * 1024  # parse bodies larger than this off the event loop (a thread hop costs ~0.1 ms)


def parse_json(body: bytes) -> object:
    """The JSON value of a body.

    Raises:
        OpenAIError: 400 for invalid UTF-8, invalid JSON or nesting too deep for the parser.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OpenAIError(f"the request body is not valid UTF-8: byte {exc.object[exc.start]:#04x} at position "
                          f"{exc.start} ({exc.reason})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise OpenAIError(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column "
                          f"{exc.colno}") from None
    except RecursionError:
        raise OpenAIError("the request body nests arrays or objects too deeply (Python's JSON parser stops at "
                          "about 1,000 levels; no field of this API nests more than a few)") from None


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """A pydantic error as (message, the first bad top-level field or None)."""
    errors = exc.errors(include_url=False, include_input=False)

    def where(e: dict) -> str:
        return ".".join(str(x) for x in e.get("loc", ())) or "body"

    message = "; ".join(f"{where(e)}: {e.get('msg')}" for e in errors[:5]) or "invalid request"
    if len(errors) > 5:
        message += f"; and {len(errors) - 5} more"
    param = where(errors[0]).split(".")[0] if errors else None
    return message, None if param == "body" else param


def to_model(value: object, model: type[Model]) -> Model:
    """``value`` (a parsed JSON body) validated as ``model``.

    Raises:
        OpenAIError: 400 when it is not an object or a field is bad (naming the field).
    """
    if not isinstance(value, dict):
        raise OpenAIError(f"the request body must be a JSON object, got {type(value).__name__}")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise OpenAIError(message, param=param) from None
    except RecursionError:  # pydantic's own recursion guard should come first; never a 500
        raise OpenAIError("the request body nests too deeply") from None


async def read_bytes(raw: Request, limit: int) -> bytes:
    """The request's body, at most ``limit`` bytes.

    Raises:
        OpenAIError: 413 past the limit (by its ``Content-Length``, or while it arrives).
    """
    def too_large() -> OpenAIError:
        return OpenAIError(f"the request body is larger than the server's limit of {limit} bytes "
                           "(--max-request-body-bytes)", 413)

    declared = raw.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large()
    chunks, size = [], 0
    async for chunk in raw.stream():
        size += len(chunk)
        if size > limit:
            raise too_large()
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(raw: Request, model: type[Model], limit: int) -> Model:
    """The request's body as ``model``, read up to ``limit`` bytes (see the module docstring for the checks and
    their order).

    Raises:
        OpenAIError: 413 past the byte limit; 400 as ``parse_json`` and ``to_model``.
    """
    body = await read_bytes(raw, limit)
    if len(body) <= THREAD_ABOVE_BYTES:
        return to_model(parse_json(body), model)
    return await asyncio.to_thread(lambda: to_model(parse_json(body), model))

"""``--request-body-timeout``: a total deadline for reading a request's body, so a slow client cannot hold a
connection forever.

A client that sends its headers and then trickles the body (a byte every half second) would otherwise hold its
connection, a coroutine and the bytes read so far for as long as it likes: uvicorn has a keep-alive timeout
between requests, but none within one. This pure ASGI middleware gives every request's body one total deadline,
counted from when its headers arrived. A handler still waiting for body bytes then gets ``BodyReadTimeout``
from ``receive``, and the client gets 408 (OpenAI's error JSON) with ``Connection: close``, after which the
server closes the connection. A response sent while the body is still incomplete (a 401, a route that does not
read bodies) carries ``Connection: close`` too, so the unread rest cannot keep the connection open either.

Waiting for a slow body is an idle coroutine, so other requests go on meanwhile. Once the body is complete
the deadline no longer applies: a handler that waits for the client to disconnect, or a long stream, is never
cut off by it.
"""

from __future__ import annotations

import asyncio
import time

from starlette.responses import JSONResponse

from minengine.entrypoints.protocol import error_body, error_type


class BodyReadTimeout(Exception):
    """The request's body did not arrive whole within the deadline (raised by the wrapped ``receive``)."""


def announces_body(scope) -> bool:
    """Whether a request's headers announce a body (a ``Content-Length`` above 0, or chunked transfer)."""
    headers = dict(scope.get("headers") or [])
    length = headers.get(b"content-length", b"0").strip()
    return b"transfer-encoding" in headers or not length.isdigit() or int(length) > 0


class BodyTimeoutMiddleware:
    """A pure ASGI middleware: ``app`` with a total deadline of ``timeout_s`` seconds on each request's body.

    Args:
        app: the ASGI app. timeout_s: seconds from a request's start within which its whole body must arrive
            (> 0).

    Raises:
        ValueError: ``timeout_s`` not a positive number.
    """

    def __init__(self, app, timeout_s: float):
        if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.app, self.timeout_s = app, float(timeout_s)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        deadline = time.monotonic() + self.timeout_s
        body_done = not announces_body(scope)  # a GET without a body keeps its connection alive
        response_started = False

        async def receive_by_deadline():
            nonlocal body_done
            if body_done:  # the body is in: what is left to receive is the disconnect, whenever it comes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise BodyReadTimeout from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def send_closing_if_unread(message):
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
                if not body_done:  # the rest of the body is never read: the connection cannot be reused
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, receive_by_deadline, send_closing_if_unread)
        except BodyReadTimeout:
            if response_started:  # a handler that answered and then read on: nothing left to tell the client
                return
            message = (f"the request body did not arrive within the server's limit of {self.timeout_s:g} s "
                       "(--request-body-timeout)")
            response = JSONResponse(error_body(message, 408, type_=error_type(408)), status_code=408,
                                    headers={"connection": "close"})
            await response(scope, receive, send)

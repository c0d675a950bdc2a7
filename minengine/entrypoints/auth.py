"""``--api-key``: a bearer-token check in front of every route but the liveness probes (vLLM's
``AuthenticationMiddleware``).

Every request must carry ``Authorization: Bearer <key>`` with one of the server's keys, or it gets 401 with
OpenAI's error JSON, message "Unauthorized" (vLLM's body is ``{"error": "Unauthorized"}``; every other 4xx here
is OpenAI's shape, so this one is too). Only ``GET``/``HEAD`` of ``/health``, ``/ping`` and ``/version`` stay open
(load balancers and orchestrators probe them without credentials), and CORS preflights (``OPTIONS``), as in vLLM.

The rule is vLLM's newest one, closed by default: older vLLM guarded only paths under ``/v1``, leaving
``/reset_prefix_cache``, ``/tokenize`` and friends open; newer vLLM guards every registered route except a public
list. minengine's public list is shorter than vLLM's (which also opens ``/metrics`` and the API docs): the
metrics and the OpenAPI schema describe the server to whoever asks, so they need the key too (a Prometheus scrape
sends it with ``authorization: {credentials: KEY}`` in its scrape config). A path that matches no route is
guarded as well, so a route added later is guarded without a change here. Keys are compared by their SHA-256
digests in constant time, so the comparison takes the same time whichever byte differs.
"""

from __future__ import annotations

import hashlib
import secrets

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from minengine.entrypoints.protocol import error_body

OPEN_PATHS = frozenset({"/health", "/ping", "/version"})  # liveness and version probes
OPEN_METHODS = frozenset({"GET", "HEAD"})  # reads only: POST /ping needs the key like every other POST


def is_open(method: str | None, path: str) -> bool:
    """Whether a request may go without a key: a read of a liveness or version probe."""
    return method in OPEN_METHODS and path in OPEN_PATHS


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class APIKeyMiddleware:
    """A pure ASGI middleware: ``app`` behind a check of ``Authorization: Bearer <key>``.

    Args:
        app: the ASGI app to guard. keys: the accepted keys (non-empty strings).

    Raises:
        ValueError: no key, or an empty one.
    """

    def __init__(self, app, keys: list[str]):
        if not keys or any(not isinstance(k, str) or not k for k in keys):
            raise ValueError(f"api keys must be non-empty strings, got {keys!r}")
        self.app = app
        self._digests = [_digest(k) for k in keys]

    def authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        given = _digest(token)
        ok = False
        for d in self._digests:  # no early exit: the time does not say which key matched
            ok |= secrets.compare_digest(given, d)
        return ok

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if not is_open(scope.get("method"), path) and not self.authorized(Headers(scope=scope)):
            body = error_body("Unauthorized", 401, type_="AuthenticationError")
            return await JSONResponse(body, status_code=401)(scope, receive, send)
        return await self.app(scope, receive, send)

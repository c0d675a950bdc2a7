"""The server's doors, through a real server: an oversized prompt (any size, any route, text or chat or token ids)
is refused naming the field and ``max_model_len`` after tokenizing a bounded part of it, while other requests
are answered; with ``--api-key`` every route of the app but the liveness probes answers 401 without the key
(enumerated from the app, so a route added later is covered); a body trickled slower than
``--request-body-timeout`` is answered 408 and its connection closed, while other requests go on.
"""

from __future__ import annotations

import asyncio
import re
import select
import socket
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import Route

from minengine.entrypoints.auth import is_open
from minengine.entrypoints.cli_args import FrontendArgs
from minengine.tokenize_within import PIECE_CHARS
from tests.server_helpers import SERVER_CONFIG, running_server

TIMEOUT = 60.0
LIMIT = SERVER_CONFIG["max_model_len"]
TEMPLATE = "{% for m in messages %}<<{{ m['role'] }}>> {{ m['content'] }}\n{% endfor %}"
# Counting pieces of any of these texts adds far more than this many tokens per PIECE_CHARS characters, so
# refusing one with more than LIMIT tokens tokenizes at most PIECES_TO_REFUSE pieces.
TOKENS_PER_PIECE = 100
PIECES_TO_REFUSE = LIMIT // TOKENS_PER_PIECE + 2


class CountingTokenizer:
    """Wraps the server thread's tokenizer: records the length of every text it tokenizes."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def __call__(self, text, **kwargs):
        self.calls.append(len(text))
        return self.tokenizer(text, **kwargs)

    def __getattr__(self, name):  # apply_chat_template, decode, ...: the tokenizer's own
        return getattr(self.tokenizer, name)


@pytest.fixture(scope="module")
def server(bundled_model):
    with running_server(bundled_model, FrontendArgs(chat_template=TEMPLATE)) as s:
        tokenizer = s._server.config.app.state.serving.tokenizer
        tokenizer.tokenizer = CountingTokenizer(tokenizer.tokenizer)
        s.counting = tokenizer.tokenizer
        yield s


def refused_for_length(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["param"] == field and f"maximum context length of {LIMIT} tokens" in err["message"], err
    assert "max_model_len" in err["message"], err


# The largest prompt whose JSON body (UTF-8, up to 4 bytes a character) stays under the server's 8 MiB body limit:
# a larger body is refused before any tokenizing, with 413 (tested apart).
BODY_LIMIT_CHARS = (FrontendArgs().max_request_body_bytes - 4096) // 4
UNITS = st.sampled_from(["a ", "ROMEO: what light ", "x" * 300, "\n", "日本語 ", "🙂", "  "])


def oversized_body(kind: str, unit: str, size: int) -> tuple[str, dict, str]:
    """(route, JSON body, the field the refusal names) for a prompt of about ``size`` characters."""
    text = (unit * (size // len(unit) + 1))[:size]
    if kind == "completion":
        return "/v1/completions", {"prompt": text, "max_tokens": 1}, "prompt"
    if kind == "completion batch":
        return "/v1/completions", {"prompt": ["ROMEO:", text], "max_tokens": 1}, "prompt"
    if kind == "tokenize":
        return "/tokenize", {"prompt": text}, "prompt"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text[: size // 2]},
                {"role": "assistant", "content": "Aye."}, {"role": "user", "content": text[size // 2:]}]
    if kind == "chat":
        return "/v1/chat/completions", {"messages": messages, "max_tokens": 1}, "messages"
    return "/tokenize", {"messages": messages}, "messages"


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(["completion", "completion batch", "tokenize", "chat", "tokenize chat"]), unit=UNITS,
       size=st.integers(4 * LIMIT, BODY_LIMIT_CHARS))
def test_any_oversized_text_prompt_is_refused_after_bounded_tokenizing(server, kind, unit, size):
    route, body, field = oversized_body(kind, unit, size)
    server.counting.calls.clear()
    refused_for_length(httpx.post(server.url + route, json=body, timeout=TIMEOUT), field)
    # some calls are the short ones of the batch's first prompt, or of the chat template's short messages
    assert max(server.counting.calls) <= PIECE_CHARS, server.counting.calls
    assert sum(server.counting.calls) <= PIECE_CHARS * PIECES_TO_REFUSE, (size, server.counting.calls)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(size=st.integers(LIMIT + 1, 1_000_000), batch=st.booleans())
def test_any_oversized_token_id_prompt_is_refused(server, size, batch):
    ids = [5] * size
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [[5, 6], ids] if batch else ids, "max_tokens": 1},
                   timeout=TIMEOUT)
    refused_for_length(r, "prompt")
    assert f"prompt has {size} tokens" in r.json()["error"]["message"]


def test_a_small_request_is_answered_beside_the_4m_token_prompt(server):
    """The reported case: "a " * 4,000,000 (7.6 MB, under the 8 MiB body limit) sent with a 5-token request. The
    big one is refused after tokenizing one piece; the small one is answered."""
    server.counting.calls.clear()
    small = {"prompt": "ROMEO: soft", "max_tokens": 2}

    async def both():
        async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as client:
            big = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "a " * 4_000_000}))
            await asyncio.sleep(0)
            return await asyncio.gather(big, client.post("/v1/completions", json=small))

    big, answered = asyncio.run(both())
    refused_for_length(big, "prompt")
    assert re.search(r"at least [\d,]+ counted", big.json()["error"]["message"])
    assert answered.status_code == 200 and answered.json()["choices"][0]["text"]
    assert sorted(server.counting.calls) == [len(small["prompt"]), PIECE_CHARS - 1], server.counting.calls


# ---- --api-key: every route but the probes ------------------------------------------------------------------

def concrete(path: str) -> str:
    """A URL path for a route's template (``/v1/models/{model_id:path}`` -> ``/v1/models/x``)."""
    return re.sub(r"\{[^}]+\}", "x", path)


def status_of(client: httpx.Client, method: str, path: str, headers: dict) -> int:
    """The status of one request (a stream, such as the step feed, is closed once its status is in)."""
    body = {} if method in ("POST", "PUT", "PATCH") else None
    with client.stream(method, path, json=body, headers=headers) as r:
        return r.status_code


def test_every_route_but_the_probes_needs_the_key(bundled_model):
    frontend = FrontendArgs(api_key=["s3cret"], enable_tokenizer_info_endpoint=True)
    with running_server(bundled_model, frontend) as s, httpx.Client(base_url=s.url, timeout=TIMEOUT) as client:
        app = s._server.config.app
        doors = sorted({(method, route.path) for route in app.routes if isinstance(route, Route)
                        for method in route.methods or ()})
        assert len(doors) >= 15 and ("POST", "/reset_prefix_cache") in doors, doors
        for method, path in doors:
            without = status_of(client, method, concrete(path), {})
            with_key = status_of(client, method, concrete(path), {"Authorization": "Bearer s3cret"})
            assert with_key != 401, (method, path)
            if is_open(method, path):
                assert method in ("GET", "HEAD") and without != 401, (method, path)
            else:
                assert without == 401, (method, path, without)
        # what stays open is the probes, read-only
        probes = {"/health", "/ping", "/version"}
        assert {("GET", p) for p in probes} <= {(m, p) for m, p in doors if is_open(m, p)}
        assert {(m, p) for m, p in doors if is_open(m, p)} <= {(m, p) for m in ("GET", "HEAD") for p in probes}
        assert status_of(client, "POST", "/reset_prefix_cache", {"Authorization": "Bearer wrong"}) == 401
        assert status_of(client, "GET", "/no/such/route", {}) == 401  # unknown paths are closed too


def test_the_step_feed_sends_the_served_name_not_the_models_path(bundled_model):
    with running_server(bundled_model, served_model_name="bard") as s:
        with httpx.stream("GET", s.url + "/v1/engine/steps", timeout=TIMEOUT) as r:
            first = next(line for line in r.iter_lines() if line.startswith("data:"))
    assert '"model":"bard"' in first and "model_path" not in first and bundled_model not in first


# ---- --request-body-timeout ---------------------------------------------------------------------------------

def open_trickle(port: int, method: str, path: str) -> socket.socket:
    """A connection that sent a request's headers (a 100,000-byte body announced) and its first byte."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 "Content-Length: 100000\r\n\r\n{".encode())
    return sock


def trickle_then_read(socks: list[socket.socket], gap_s: float, trickle_s: float, give_up_s: float) -> dict:
    """Send each socket a byte every ``gap_s`` for ``trickle_s`` seconds (a byte sent to a socket the server has
    closed would be answered with a reset that discards the reply, so the trickle stops short of the deadline),
    then read each until the server closes it. Returns socket index -> all it received, for the closed ones."""
    stop_trickling = time.monotonic() + trickle_s
    while time.monotonic() < stop_trickling:
        for sock in socks:
            sock.send(b" ")  # JSON whitespace: the body stays valid as far as it goes
        time.sleep(gap_s)
    received = {i: b"" for i in range(len(socks))}
    closed: set[int] = set()
    give_up = time.monotonic() + give_up_s
    while len(closed) < len(socks) and time.monotonic() < give_up:
        ready, _, _ = select.select([s for i, s in enumerate(socks) if i not in closed], [], [], gap_s)
        for sock in ready:
            i = socks.index(sock)
            data = sock.recv(65536)
            received[i] += data
            if not data:
                closed.add(i)
    return {i: received[i] for i in closed}


def test_a_trickled_body_gets_408_and_its_connection_closed(bundled_model):
    deadline_s = 6.0
    ordinary = {"prompt": "ROMEO:", "max_tokens": 2}
    with running_server(bundled_model, FrontendArgs(request_body_timeout=deadline_s)) as s:
        port = int(s.url.rsplit(":", 1)[1])
        assert httpx.post(s.url + "/v1/completions", json=ordinary, timeout=TIMEOUT).status_code == 200  # warm
        routes = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"] * 3
        socks = [open_trickle(port, "POST", path) for path in routes]
        # while they trickle, an ordinary request is answered, before any trickle is cut off
        assert httpx.post(s.url + "/v1/completions", json=ordinary, timeout=TIMEOUT).status_code == 200
        assert not select.select(socks, [], [], 0)[0], "a trickle was answered before the ordinary request"
        closed = trickle_then_read(socks, gap_s=0.2, trickle_s=deadline_s / 2, give_up_s=deadline_s + 60)
        # a route that reads no body answers at once, with the connection closed (its unread body cannot hold it)
        health = open_trickle(port, "GET", "/health")
        closed[len(socks)] = trickle_then_read([health], gap_s=0.2, trickle_s=0, give_up_s=60)[0]
        for sock in [*socks, health]:
            sock.close()
        # a request without a body keeps its connection: two on one socket, neither told to close
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
            replies = b""
            for _ in range(2):
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                replies += sock.recv(65536)
        assert replies.count(b"HTTP/1.1 200") == 2 and b"connection: close" not in replies.lower(), replies
    # every trickle was answered and closed: the body of 100,000 bytes at 5 bytes a second was far from done
    assert sorted(closed) == list(range(len(socks) + 1)), closed
    for i in range(len(socks)):
        head, _, body = closed[i].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower(), closed[i][:300]
        assert b"--request-body-timeout" in body
    assert closed[len(socks)].startswith(b"HTTP/1.1 200") and b"connection: close" in closed[len(socks)].lower()


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), True, "30"])
def test_request_body_timeout_is_checked(value):
    with pytest.raises(ValueError, match="request_body_timeout"):
        FrontendArgs(request_body_timeout=value)


def test_the_body_deadline_is_total_not_idle():
    """A body that keeps arriving, a chunk every 20 ms, never idle for long, is still cut off at the deadline: the
    app sees ``BodyReadTimeout`` after some chunks, and the client gets 408 with ``Connection: close``."""
    from minengine.entrypoints.body_timeout import BodyReadTimeout, BodyTimeoutMiddleware

    chunks_read, sent, raised = [], [], []

    async def reader_app(scope, receive, send):
        try:
            while (message := await receive())["more_body"]:
                chunks_read.append(message["body"])
        except BodyReadTimeout:
            raised.append(True)
            raise

    async def trickling_receive():
        await asyncio.sleep(0.02)
        return {"type": "http.request", "body": b" ", "more_body": True}

    async def send(message):
        sent.append(message)

    app = BodyTimeoutMiddleware(reader_app, timeout_s=0.3)
    scope = {"type": "http", "method": "POST", "path": "/x", "headers": [(b"content-length", b"100000")]}
    asyncio.run(asyncio.wait_for(app(scope, trickling_receive, send), TIMEOUT))
    assert raised and len(chunks_read) >= 2, chunks_read  # bytes were still flowing when the deadline came
    start = sent[0]
    assert start["status"] == 408 and (b"connection", b"close") in start["headers"], sent
    assert b"--request-body-timeout" in sent[1]["body"]


def test_the_dashboard_listens_on_localhost_unless_asked():
    text = (Path(__file__).resolve().parents[2] / ".streamlit" / "config.toml").read_text()
    server = re.split(r"^\[", text.split("\n[server]\n", 1)[1], flags=re.MULTILINE)[0]  # tomllib needs 3.11
    assert re.findall(r'^address\s*=\s*"([^"]*)"', server, flags=re.MULTILINE) == ["localhost"], server


# ---- the user-facing page states only numbers the code gives ------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "server.md"
SECTION = "## Refused before the engine: long prompts, the API key, slow bodies"


def _section_text() -> str:
    """The server page's section on these limits (from its heading to the next ``## ``), the prose rewrapped."""
    page = DOC.read_text()
    assert SECTION in page, f"the section {SECTION!r} is gone from docs/server.md"
    return " ".join(page.split(SECTION, 1)[1].split("\n## ", 1)[0].split())


def test_every_number_on_the_docs_page_is_the_codes():
    from transformers import AutoTokenizer

    from minengine.config import BUNDLED_MODEL
    from minengine.tokenize_within import PromptTooLongError, encode_within

    text = _section_text()  # the prose wraps lines
    with pytest.raises(PromptTooLongError) as refusal:  # the example: the reported prompt, the test server's limit
        encode_within(AutoTokenizer.from_pretrained(BUNDLED_MODEL), "a " * 4_000_000, LIMIT)
    assert f"`{refusal.value.message}`" in text
    defaults = FrontendArgs()
    mib = defaults.max_request_body_bytes / 2**20
    stated = {
        f"{PIECE_CHARS:,}": f"pieces of {PIECE_CHARS:,} characters",
        f"{mib:g}": f"{mib:g} MiB by default",
        f"{defaults.request_body_timeout:g}": f"(default {defaults.request_body_timeout:g})",
        f"{round(defaults.max_request_body_bytes / defaults.request_body_timeout / 1000)}":
            f"{mib:g} MiB arriving in the default {defaults.request_body_timeout:g} s is about "
            f"{round(defaults.max_request_body_bytes / defaults.request_body_timeout / 1000)} kB/s",
    }
    for phrase in stated.values():
        assert phrase in text, phrase
    statuses = {"400", "401", "408"}  # the statuses the tests above assert
    in_example = set(re.findall(r"\d[\d,]*", refusal.value.message))
    prose = re.sub(r"\b\d+\.\d+\.\d+\.\d+\b", "", text)  # an address is not a quantity
    numbers = set(re.findall(r"(?<![\w/])(?:\d[\d,.]*\d|\d)", prose))  # not the 1 of /v1
    assert numbers <= set(stated) | statuses | in_example, numbers - set(stated) - statuses - in_example

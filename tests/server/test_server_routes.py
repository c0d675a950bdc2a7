"""vLLM's smaller routes and server options: ``/ping``, ``/v1/models/{id}``, ``/tokenizer_info`` (off unless
enabled), ``--api-key`` (401 without it on every route but the liveness probes) and ``--chat-template``."""

from __future__ import annotations

import httpx
import openai
import pytest

from minengine.entrypoints.chat_utils import load_chat_template, render_chat
from minengine.entrypoints.cli_args import FrontendArgs
from tests.server_helpers import running_server

TIMEOUT = 60.0
TEMPLATE = "{% for m in messages %}<<{{ m['role'] }}>> {{ m['content'] }}\n{% endfor %}"


def test_ping_and_model_retrieval(bundled_model):
    with running_server(bundled_model, served_model_name="org/bard") as s:
        for method in ("GET", "POST"):
            assert httpx.request(method, s.url + "/ping", timeout=TIMEOUT).status_code == 200
        listed = httpx.get(s.url + "/v1/models", timeout=TIMEOUT).json()["data"][0]
        card = httpx.get(s.url + "/v1/models/org/bard", timeout=TIMEOUT)  # an id with a slash, as hub ids have
        assert card.status_code == 200 and card.json() == listed
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="EMPTY", timeout=TIMEOUT, max_retries=0)
        assert client.models.retrieve("org/bard").id == "org/bard"
        missing = httpx.get(s.url + "/v1/models/gpt-4", timeout=TIMEOUT)
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
        # /tokenizer_info is off unless asked for, as in vLLM (it shows the tokenizer's paths and settings)
        assert httpx.get(s.url + "/tokenizer_info", timeout=TIMEOUT).status_code == 404


def test_api_key_guards_every_route_but_the_probes(bundled_model):
    with running_server(bundled_model, FrontendArgs(api_key=["s3cret", "other"])) as s:
        body = {"prompt": "ROMEO:", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}):
            for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/v1/models/x"),
                                 ("GET", "/v1/engine/steps")):
                r = httpx.request(method, s.url + path, json=body if method == "POST" else None, headers=headers,
                                  timeout=TIMEOUT)
                unauthorized = {"message": "Unauthorized", "type": "AuthenticationError", "param": None, "code": 401}
                assert r.status_code == 401 and r.json() == {"error": unauthorized}, (path, headers)
        for key in ("s3cret", "other"):
            r = httpx.post(s.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                           timeout=TIMEOUT)
            assert r.status_code == 200, r.text
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret", timeout=TIMEOUT, max_retries=0)
        assert client.completions.create(model="tiny-shakespeare-llama", prompt="ROMEO:", max_tokens=2).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="EMPTY", timeout=TIMEOUT,
                          max_retries=0).models.list()
        # the liveness probes stay open (load balancers send no key); every other route needs it
        for method, path in (("GET", "/health"), ("GET", "/ping"), ("GET", "/version")):
            assert httpx.request(method, s.url + path, timeout=TIMEOUT).status_code == 200, path
        for method, path in (("GET", "/metrics"), ("POST", "/tokenize"), ("POST", "/reset_prefix_cache"),
                             ("GET", "/openapi.json"), ("GET", "/docs"), ("POST", "/ping"), ("GET", "/no/such/route")):
            assert httpx.request(method, s.url + path, json={"prompt": "hi"} if method == "POST" else None,
                                 timeout=TIMEOUT).status_code == 401, path
        assert httpx.options(s.url + "/v1/completions", timeout=TIMEOUT).status_code != 401  # CORS preflight


def test_chat_template_is_the_servers_default(bundled_model, tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE)
    template = load_chat_template(str(path))
    assert template == TEMPLATE == load_chat_template(TEMPLATE)
    assert load_chat_template(None) is None
    with pytest.raises(ValueError, match="chat-template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    messages = [{"role": "user", "content": "Good morrow."}]
    with running_server(bundled_model, FrontendArgs(chat_template=template,
                                                    enable_tokenizer_info_endpoint=True)) as s:
        tok = s.engine.tokenizer
        text, ids = render_chat(tok, messages, TEMPLATE)
        assert text == "<<user>> Good morrow.\n"
        r = httpx.post(s.url + "/tokenize", json={"messages": messages}, timeout=TIMEOUT).json()
        assert r["tokens"] == ids
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2},
                       timeout=TIMEOUT).json()
        assert r["usage"]["prompt_tokens"] == len(ids)
        # a request's own template still wins
        own = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        r = httpx.post(s.url + "/tokenize", json={"messages": messages, "chat_template": own}, timeout=TIMEOUT)
        assert r.json()["tokens"] == render_chat(tok, messages, own)[1]
        assert httpx.get(s.url + "/tokenizer_info", timeout=TIMEOUT).json()["chat_template"] == TEMPLATE

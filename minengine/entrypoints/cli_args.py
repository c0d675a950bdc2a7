"""FrontendArgs: the OpenAI server's own settings (vLLM's ``vllm.entrypoints.openai.cli_args.FrontendArgs``), the
limits that keep one request from taking the server down, and the graceful stop.

The engine's settings are ``EngineConfig`` / ``EngineArgs`` (``EngineArgs.add_cli_args``); these are the HTTP
front end's: the API keys, the server's chat template, the opt-in routes, how large a body it reads and how long
it waits for one, how much work
one call may queue, how long a SIGTERM waits for the streams in flight. ``add_cli_args`` adds them to a parser
(``minengine serve --api-key K --max-request-body-bytes ...``), ``from_cli_args`` reads them back: one definition,
as ``EngineArgs`` is for the engine's flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from minengine.exceptions import VLLMValidationError, show


@dataclasses.dataclass
class FrontendArgs:
    """The server's settings, limits and shutdown (vLLM's names).

    Attributes:
        api_key: require one of these keys as 'Authorization: Bearer KEY' on every route but GET /health, /ping
            and /version (401 otherwise; ``entrypoints/auth.py``); None = open. ``minengine serve`` also reads
            the VLLM_API_KEY environment variable, as vLLM.
        chat_template: the chat template for requests that give none: a file, or the Jinja template itself
            (``chat_utils.load_chat_template``); None = the tokenizer's.
        enable_tokenizer_info_endpoint: serve GET /tokenizer_info (off by default, as vLLM: it shows the
            tokenizer's settings and paths).
        max_request_body_bytes: the largest request body read, in bytes (8 MiB); a larger one is answered 413
            before it is read whole, so before any JSON parsing or tokenizing. 8 MiB holds a 128k-token prompt
            (about 0.5 MB of English text, or 1 MB of token ids) many times over. A text prompt longer than
            max_model_len is not tokenized whole: it is refused after a bounded part (``tokenize_within``).
        max_requests_per_call: the most engine requests one call may queue, prompts x ``n`` (each choice of
            each prompt is a request): above it the call is answered 400, before anything is
            tokenized. ``n`` alone stays at most 128, OpenAI's limit.
        request_body_timeout: seconds within which a request's whole body must arrive, counted from its headers
            (30 s: 8 MiB, the default body limit, at about 280 kB/s); a body still incomplete then is answered
            408 and its connection closed, so a client trickling bytes cannot hold a connection forever
            (``entrypoints/body_timeout.py``).
        shutdown_timeout: seconds a SIGTERM (or Ctrl-C) waits for the requests in flight to finish (vLLM's
            ``--shutdown-timeout``; 10 s, well under Kubernetes' 30 s grace period before a SIGKILL); then the
            remaining streams get an error chunk and ``[DONE]``, waiting calls a 503, and the server exits. New
            connections are refused from the signal on. 0 ends them at once (vLLM's default).

    Raises:
        VLLMValidationError: (a ``ValueError``) naming the setting, for a value out of range.
    """

    api_key: list[str] | None = None
    chat_template: str | None = None
    enable_tokenizer_info_endpoint: bool = False
    max_request_body_bytes: int = 8 * 2**20
    max_requests_per_call: int = 1024
    request_body_timeout: float = 30.0
    shutdown_timeout: float = 10.0

    def __post_init__(self) -> None:
        keys = self.api_key
        if keys is not None and (not isinstance(keys, (list, tuple)) or not keys
                                 or any(not isinstance(k, str) or not k for k in keys)):
            raise VLLMValidationError(f"api_key must be None or a non-empty list of non-empty strings, got "
                                      f"{show(keys)}", parameter="api_key")
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise VLLMValidationError(f"chat_template must be None, a file path or a template, got "
                                      f"{show(self.chat_template)}", parameter="chat_template")
        if not isinstance(self.enable_tokenizer_info_endpoint, bool):
            raise VLLMValidationError(f"enable_tokenizer_info_endpoint must be a bool, got "
                                      f"{show(self.enable_tokenizer_info_endpoint)}",
                                      parameter="enable_tokenizer_info_endpoint")
        for name in ("max_request_body_bytes", "max_requests_per_call"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 2**40:
                raise VLLMValidationError(f"{name} must be an integer in [1, 2**40], got {show(v)}", parameter=name)
        t = self.request_body_timeout
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not (math.isfinite(t) and 0 < t <= 86_400):
            raise VLLMValidationError(f"request_body_timeout must be a number of seconds in (0, 86400], got "
                                      f"{show(t)}", parameter="request_body_timeout")
        t = self.shutdown_timeout
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not (math.isfinite(t) and 0 <= t <= 86_400):
            raise VLLMValidationError(f"shutdown_timeout must be a number of seconds in [0, 86400], got {show(t)}",
                                      parameter="shutdown_timeout")

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser | argparse._ArgumentGroup):
        """One flag per field (``--api-key``, ``--max-request-body-bytes`` ...), with its default and help (from the
        docstring); returns ``parser``."""
        docs = _field_docs()
        special = {"api_key": dict(nargs="+", metavar="KEY"), "chat_template": dict(metavar="TEMPLATE"),
                   "enable_tokenizer_info_endpoint": dict(action="store_true")}
        for f in dataclasses.fields(cls):
            kwargs = special.get(f.name) or dict(type=type(f.default), metavar=type(f.default).__name__.upper())
            parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=f.default,
                                help=docs.get(f.name, f.name), **kwargs)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> FrontendArgs:
        """The settings from a parsed command line (the attributes ``add_cli_args`` defined).

        Raises:
            VLLMValidationError: as the constructor.
        """
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})


def _field_docs() -> dict[str, str]:
    """Each field's description from the "Attributes:" section of the docstring (the help of its flag)."""
    docs: dict[str, str] = {}
    name = None
    text = (FrontendArgs.__doc__ or "").split("Attributes:", 1)[-1].split("Raises:", 1)[0]
    for line in text.splitlines():
        stripped = line.strip()
        if line.startswith(" " * 8) and not line.startswith(" " * 12) and ": " in stripped:
            name, _, rest = stripped.partition(": ")
            docs[name] = rest
        elif name and stripped:
            docs[name] += " " + stripped
    return {k: v.replace("``", "").replace("%", "%%") for k, v in docs.items()}

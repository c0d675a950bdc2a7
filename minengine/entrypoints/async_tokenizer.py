"""AsyncTokenizer: the server's tokenizing, chat-template rendering and decoding, on a thread of their own.

Tokenizing a long prompt takes a CPU core for a while (megabytes of text: seconds). Done on the event loop it
stalls every other client, ``/health`` included; done in the engine loop it stalls every step. So the server
tokenizes here: one worker thread with its own copy of the tokenizer (a Hugging Face fast tokenizer is not meant
to be used from two threads at once, and the engine's detokenizer uses the engine's copy meanwhile). Calls are
served one at a time, in order; a long prompt is tokenized as several short calls (``tokenize_within``), so it
never holds the thread for long, and one longer than ``max_model_len`` is refused after a few of them.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from concurrent.futures import ThreadPoolExecutor

from minengine.entrypoints.chat_utils import render_chat_text
from minengine.tokenize_within import BoundedEncoding
from minengine.value_checks import check_unicode

logger = logging.getLogger(__name__)


class AsyncTokenizer:
    """A tokenizer used from coroutines without blocking the event loop.

    Args:
        tokenizer: the engine's tokenizer (a transformers tokenizer), or None for a model without one (every
            method then raises ``ValueError``). It is copied; the copy is used only by the worker thread.
    """

    def __init__(self, tokenizer):
        self.tokenizer = None
        if tokenizer is not None:
            try:
                self.tokenizer = copy.deepcopy(tokenizer)
            except Exception:  # a tokenizer that cannot be copied: share it (calls still never overlap here)
                logger.warning("could not copy the tokenizer for the server's tokenizer thread; sharing it")
                self.tokenizer = tokenizer
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minengine-tokenizer")

    async def _run(self, fn, *args):
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: give prompts as token ids")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def encode(self, text: str, add_special_tokens: bool = True, *, limit: int,
                     field: str = "prompt") -> list[int]:
        """The token ids of ``text``, if it has at most ``limit`` tokens (``max_model_len``). A long text is counted
        in pieces, one call of the thread each (``tokenize_within``): other requests' calls run in between, and
        an oversized one is refused after a few pieces, without tokenizing the rest.

        Raises:
            ValueError: no tokenizer, or ``text`` is not valid Unicode (a lone surrogate).
            PromptTooLongError: (a ``ValueError``) more than ``limit`` tokens; names ``field``.
        """
        check_unicode(text, field)
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: give prompts as token ids")
        return await self._encode_in_steps(BoundedEncoding(self.tokenizer, text, limit, add_special_tokens, field))

    async def _encode_in_steps(self, encoding: BoundedEncoding) -> list[int]:
        while (ids := await self._run(encoding.step)) is None:
            pass
        return ids

    async def decode(self, token_ids: list[int]) -> str:
        """The text of ``token_ids`` (their special tokens included)."""
        return await self._run(self.tokenizer.decode, token_ids)

    async def convert_ids_to_tokens(self, token_ids: list[int]) -> list[str]:
        return await self._run(self.tokenizer.convert_ids_to_tokens, token_ids)

    async def render_chat(self, messages, chat_template: str | None = None, add_generation_prompt: bool = True,
                          continue_final_message: bool = False, chat_template_kwargs: dict | None = None, *,
                          limit: int) -> tuple[str, list[int]]:
        """A conversation through the chat template: (prompt text, token ids), the ids only if there are at most
        ``limit`` of them (counted as ``encode`` does); see ``chat_utils.render_chat``.

        Raises:
            ValueError: as ``render_chat`` (bad messages, no template, a template error).
            PromptTooLongError: (a ``ValueError``) more than ``limit`` tokens; names ``messages``.
        """
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer with a chat template; this model has no tokenizer")
        text = await self._run(render_chat_text, self.tokenizer, messages, chat_template, add_generation_prompt,
                               continue_final_message, chat_template_kwargs)
        encoding = BoundedEncoding(self.tokenizer, text, limit, add_special_tokens=False, field="messages")
        return text, await self._encode_in_steps(encoding)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

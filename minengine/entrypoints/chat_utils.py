"""Chat messages -> one prompt through the model's chat template (Hugging Face ``apply_chat_template``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from minengine.exceptions import VLLMValidationError, show
from minengine.value_checks import check_unicode


def _text_content(content, where: str) -> str:
    """A message's content as text: a string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise VLLMValidationError(f"{where}.content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) "
                                          "are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise VLLMValidationError(f"{where}.content must be a string or a list of text parts, got {type(content).__name__}")


def normalize_messages(messages) -> list[dict]:
    """Check a conversation and flatten its contents to strings.

    Raises:
        ValueError: naming the bad message (``messages[i].role`` / ``.content``).
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise VLLMValidationError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise VLLMValidationError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise VLLMValidationError(f"messages[{i}].role must be a non-empty string, got {show(role)}")
        msg = {"role": role, "content": _text_content(m.get("content", ""), f"messages[{i}]")}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        for key, value in msg.items():
            check_unicode(value, f"messages[{i}].{key}")
        out.append(msg)
    return out


def render_chat(tokenizer, messages, chat_template: str | None = None, add_generation_prompt: bool = True,
                continue_final_message: bool = False,
                chat_template_kwargs: dict | None = None) -> tuple[str, list[int]]:
    """The prompt text and token ids of a conversation (special tokens come from the template only).

    Raises:
        ValueError: as ``render_chat_text``.
    """
    text = render_chat_text(tokenizer, messages, chat_template, add_generation_prompt, continue_final_message,
                            chat_template_kwargs)
    return text, tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_prompts(tokenizer, messages: list[dict] | list[list[dict]], chat_template: str | None = None,
                 add_generation_prompt: bool = True, continue_final_message: bool = False,
                 chat_template_kwargs: dict | None = None) -> list[dict]:
    """``LLM.chat``'s prompts: one conversation (a list of ``{"role", "content"}`` dicts) or a list of them, each
    rendered by ``render_chat`` into ``{"prompt_token_ids": [...], "prompt": text}``. Raises as ``render_chat``."""
    conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
    prompts = []
    for conv in conversations:
        text, ids = render_chat(tokenizer, conv, chat_template, add_generation_prompt, continue_final_message,
                                chat_template_kwargs)
        prompts.append({"prompt_token_ids": ids, "prompt": text})
    return prompts


def render_chat_text(tokenizer, messages, chat_template: str | None = None, add_generation_prompt: bool = True,
                     continue_final_message: bool = False, chat_template_kwargs: dict | None = None) -> str:
    """The prompt text of a conversation through the chat template (not tokenized).

    Raises:
        ValueError: no tokenizer, no chat template (neither the model's nor ``chat_template``), bad messages,
            or a template error.
    """
    if tokenizer is None:
        raise VLLMValidationError("chat needs a tokenizer with a chat template; this model has no tokenizer")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise VLLMValidationError("the model's tokenizer has no chat template: pass chat_template")
    if add_generation_prompt and continue_final_message:
        raise VLLMValidationError("add_generation_prompt and continue_final_message cannot both be true")
    conversation = normalize_messages(messages)
    try:
        text = tokenizer.apply_chat_template(conversation, chat_template=chat_template, tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message,
                                             **(chat_template_kwargs or {}))
    except Exception as exc:  # jinja errors, raise_exception() in templates: the caller's input
        raise VLLMValidationError(f"chat template failed: {exc}") from exc
    check_unicode(text, "chat template output")  # a surrogate from chat_template or chat_template_kwargs
    return text


def load_chat_template(template: str | None) -> str | None:
    """``--chat-template`` as vLLM reads it: a file's path (its text), or the Jinja template itself (a string
    with ``{``, ``}`` or a newline in it); None stays None (the tokenizer's own template).

    Raises:
        ValueError: a string that looks like a path (no template syntax) but is not a readable file.
    """
    if template is None:
        return None
    path = Path(template)
    try:
        if path.is_file():
            return path.read_text()
    except OSError:
        pass
    if any(c in template for c in "{}\n"):
        return template
    raise ValueError(f"--chat-template {template!r} looks like a file path, but it is not a readable file "
                     "(give a file or the Jinja template itself)")

"""A checkpoint's ``generation_config.json`` as default sampling parameters (vLLM's ``generation_config="auto"``):
what ``LLM.get_default_sampling_params`` and the OpenAI server start from."""

from __future__ import annotations

import json
from pathlib import Path

# generation_config.json keys vLLM takes as default sampling parameters -> SamplingParams fields
_GENERATION_CONFIG_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                           "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def default_sampling_overrides(model_path: str | Path) -> dict:
    """The sampling defaults a checkpoint's ``generation_config.json`` sets (vLLM's ``generation_config="auto"``):
    ``{SamplingParams field: value}`` for temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens;
    ``{}`` without the file or those keys. Only where ``do_sample`` is not False do sampling keys count."""
    path = Path(model_path) / "generation_config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text())
    out = {}
    for key, name in _GENERATION_CONFIG_KEYS.items():
        if config.get(key) is not None and (name == "max_tokens" or config.get("do_sample", True) is not False):
            out[name] = config[key]
    return out
